//! What the engine-level fuzz targets share: the fixture pair loaded once in
//! the linked libllama, a host that decodes the target and drives dflash2 through
//! its C API the way llama-server does, the checks run after every call, and a
//! reader that turns fuzz bytes into call arguments.

use std::ffi::{CStr, CString, c_char, c_void};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once, OnceLock};

use dflash2::ffi::*;
use dflash2::sys;

pub const N_SEQ: i32 = 2;
/// Tokens of the full clean generation (a prefill and 9 speculative steps: the
/// fixture drafter's drafts are never accepted, so each step emits one token).
pub const N_CHECK: usize = 10;
/// Tokens of the quick one (a prefill, a draft after it and one after an accept).
pub const N_QUICK: usize = 3;

unsafe extern "C" fn quiet_log(_level: sys::ggml_log_level, _text: *const c_char, _ud: *mut c_void) {}

/// The fixture pair, written and loaded once per process.
pub struct Pair {
    pub target_path: PathBuf,
    pub drafter_path: CString,
    pub model: *mut sys::llama_model,
    pub prompt: Vec<i32>,
    /// Target-only greedy continuation of `prompt`.
    pub reference: Vec<i32>,
}

// SAFETY: the model is only read after loading; libFuzzer runs one thread.
unsafe impl Send for Pair {}
unsafe impl Sync for Pair {}

pub fn pair() -> &'static Pair {
    static PAIR: OnceLock<Pair> = OnceLock::new();
    PAIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("dflash2-fuzz-{}", std::process::id()));
        let set = dflash2_fixtures::write_fixture_set(&dir).expect("fixture set");
        // every run would leave its 9 MB fixture set behind (a crash still does: it is evidence)
        FIXTURES.set(dir).expect("one fixture folder");
        unsafe { libc::atexit(remove_fixtures) };
        unsafe {
            sys::llama_log_set(Some(quiet_log), std::ptr::null_mut());
            llama_spec_dflash2_log_set(Some(quiet_log), std::ptr::null_mut());
            sys::llama_backend_init();
            let mut mp = sys::llama_model_default_params();
            mp.use_extra_bufts = false;
            let path = CString::new(set.target.to_str().unwrap()).unwrap();
            let model = sys::llama_model_load_from_file(path.as_ptr(), mp);
            assert!(!model.is_null());
            let mut p = Pair {
                target_path: set.target.clone(),
                drafter_path: CString::new(set.drafter.to_str().unwrap()).unwrap(),
                model,
                prompt: Vec::new(),
                reference: Vec::new(),
            };
            p.prompt = tokenize(model, "the draft model is fast and one two three");
            let mut t = Target::new(model, 1);
            p.reference = t.greedy(&p.prompt, N_CHECK);
            p
        }
    })
}

static FIXTURES: OnceLock<PathBuf> = OnceLock::new();

extern "C" fn remove_fixtures() {
    if let Some(dir) = FIXTURES.get() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn tokenize(model: *mut sys::llama_model, text: &str) -> Vec<i32> {
    unsafe {
        let vocab = sys::llama_model_get_vocab(model);
        let mut toks = vec![0i32; text.len() + 8];
        let n = sys::llama_tokenize(
            vocab,
            text.as_ptr().cast(),
            text.len() as i32,
            toks.as_mut_ptr(),
            toks.len() as i32,
            true,
            true,
        );
        assert!(n > 0);
        toks.truncate(n as usize);
        toks
    }
}

pub fn last_error() -> String {
    unsafe { CStr::from_ptr(llama_spec_dflash2_last_error()) }.to_string_lossy().into_owned()
}

/// A call's outcome must be success, or a known status with a message.
pub fn check_status(rc: i32, what: &str) -> bool {
    if rc == 0 {
        return true;
    }
    assert!(dflash2::Status::from_code(rc).is_some(), "{what}: unknown status {rc}");
    assert!(rc != dflash2::Status::LLAMA_SPEC_DFLASH2_ERR_INTERNAL as i32, "{what}: internal error: {}", last_error());
    assert!(!last_error().is_empty(), "{what}: status {rc} without a message");
    false
}

/// A target context on the pair's model.
pub struct Target {
    pub ctx: *mut sys::llama_context,
    pub n_vocab: i32,
    /// Rows of the last decode: (seq, pos).
    pub last: Vec<(i32, i32)>,
}

impl Target {
    pub fn new(model: *mut sys::llama_model, n_seq: u32) -> Target {
        unsafe {
            let mut cp = sys::llama_context_default_params();
            cp.n_ctx = 512 * n_seq;
            cp.n_batch = 256;
            cp.n_ubatch = 256;
            cp.n_seq_max = n_seq;
            cp.n_threads = 1;
            cp.n_threads_batch = 1;
            cp.kv_unified = n_seq == 1;
            let ctx = sys::llama_init_from_model(model, cp);
            assert!(!ctx.is_null());
            Target { ctx, n_vocab: sys::llama_vocab_n_tokens(sys::llama_model_get_vocab(model)), last: Vec::new() }
        }
    }

    /// Decodes (seq, token, pos) rows, all with logits; false when libllama refuses.
    pub fn decode(&mut self, rows: &[(i32, i32, i32)]) -> bool {
        unsafe {
            let mut b = sys::llama_batch_init(rows.len() as i32, 0, 1);
            for (i, &(seq, token, pos)) in rows.iter().enumerate() {
                *b.token.add(i) = token;
                *b.pos.add(i) = pos;
                *b.n_seq_id.add(i) = 1;
                **b.seq_id.add(i) = seq;
                *b.logits.add(i) = 1;
            }
            b.n_tokens = rows.len() as i32;
            let rc = sys::llama_decode(self.ctx, b);
            sys::llama_batch_free(b);
            self.last = if rc == 0 { rows.iter().map(|r| (r.0, r.2)).collect() } else { Vec::new() };
            rc == 0
        }
    }

    pub fn argmax(&self, i: usize) -> i32 {
        let logits =
            unsafe { std::slice::from_raw_parts(sys::llama_get_logits_ith(self.ctx, i as i32), self.n_vocab as usize) };
        let mut best = 0;
        for j in 1..logits.len() {
            if logits[j] > logits[best] {
                best = j;
            }
        }
        best as i32
    }

    pub fn seq_rm(&mut self, seq: i32, p0: i32, p1: i32) {
        unsafe { sys::llama_memory_seq_rm(sys::llama_get_memory(self.ctx), seq, p0, p1) };
    }

    fn greedy(&mut self, prompt: &[i32], n: usize) -> Vec<i32> {
        let rows: Vec<_> = prompt.iter().enumerate().map(|(i, &t)| (0, t, i as i32)).collect();
        assert!(self.decode(&rows));
        let mut out = vec![self.argmax(rows.len() - 1)];
        while out.len() < n {
            let pos = (prompt.len() + out.len() - 1) as i32;
            assert!(self.decode(&[(0, *out.last().unwrap(), pos)]));
            out.push(self.argmax(0));
        }
        out
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        unsafe { sys::llama_free(self.ctx) }
    }
}

/// One sequence as the host sees it.
#[derive(Clone, Copy, Default)]
pub struct Stream {
    pub n_past: i32,
    pub id_last: i32,
    pub live: bool,
}

/// What seq_info reports for a sequence that holds nothing.
const EMPTY_INFO: llama_spec_dflash2_seq_info = llama_spec_dflash2_seq_info {
    n_in_kv: 0,
    n_queued: 0,
    n_held: 0,
    n_outstanding: -1,
    next_draft_pos: 0,
    last_target_pos: -1,
    kv_pos_min: -1,
    kv_pos_max: -1,
};

/// A target context, a dflash2 engine on it, and the host's view of its sequences.
pub struct Host {
    pub target: Target,
    pub spec: *mut llama_spec_dflash2,
    pub streams: Vec<Stream>,
}

impl Host {
    pub fn new() -> Host {
        Host::with_drafter(&pair().drafter_path).unwrap_or_else(|(_, e)| panic!("init: {e}"))
    }

    /// A host whose engine loads the drafter at `path`, or init's status and
    /// message when it refuses.
    pub fn with_drafter(path: &CStr) -> Result<Host, (i32, String)> {
        let p = pair();
        let target = Target::new(p.model, N_SEQ as u32);
        let mut params = llama_spec_dflash2_default_params();
        params.n_seq = N_SEQ as u32;
        params.n_threads = 1;
        params.n_threads_batch = 1;
        let spec = unsafe { llama_spec_dflash2_init(target.ctx, path.as_ptr(), params) };
        if spec.is_null() {
            return Err((llama_spec_dflash2_last_status(), last_error()));
        }
        Ok(Host { target, spec, streams: vec![Stream::default(); N_SEQ as usize] })
    }

    /// Hands the rows of the last target decode to the engine.
    pub fn process_last(&mut self) -> i32 {
        let rows: Vec<llama_spec_dflash2_row> = self
            .target
            .last
            .iter()
            .enumerate()
            .map(|(i, &(seq, pos))| llama_spec_dflash2_row { i_batch: i as i32, seq_id: seq, pos, embd: false })
            .collect();
        unsafe { llama_spec_dflash2_process(self.spec, rows.as_ptr(), rows.len() as i32) }
    }

    /// Starts `seq` over with `prompt` on the target and the engine.
    pub fn prefill(&mut self, seq: i32, prompt: &[i32]) -> bool {
        self.target.seq_rm(seq, -1, -1);
        self.streams[seq as usize] = Stream::default();
        if !check_status(unsafe { llama_spec_dflash2_seq_clear(self.spec, seq) }, "seq_clear") {
            return false;
        }
        let rows: Vec<_> = prompt.iter().enumerate().map(|(i, &t)| (seq, t, i as i32)).collect();
        if !self.target.decode(&rows) {
            return false;
        }
        let id_last = self.target.argmax(rows.len() - 1);
        let ok = check_status(self.process_last(), "process(prompt)");
        self.streams[seq as usize] = Stream { n_past: prompt.len() as i32, id_last, live: ok };
        ok
    }

    /// One speculative step of `seq` as a greedy host does it; returns the tokens
    /// emitted (empty when a call refused, which the fuzzers allow).
    pub fn step(&mut self, seq: i32, n_max: i32) -> Vec<i32> {
        let s = self.streams[seq as usize];
        if !s.live {
            return Vec::new();
        }
        let req = llama_spec_dflash2_draft_request { seq_id: seq, id_last: s.id_last, n_max, ..Default::default() };
        let mut tokens = vec![0i32; n_max.max(0) as usize];
        let mut n = 0i32;
        let rc = unsafe { llama_spec_dflash2_draft(self.spec, &req, 1, tokens.as_mut_ptr(), n_max, &mut n) };
        if !check_status(rc, "draft") {
            return Vec::new();
        }
        assert!((0..=n_max).contains(&n), "draft length {n} outside 0..={n_max}");
        let draft = &tokens[..n as usize];
        let mut rows = vec![(seq, s.id_last, s.n_past)];
        rows.extend(draft.iter().enumerate().map(|(j, &t)| (seq, t, s.n_past + 1 + j as i32)));
        if !self.target.decode(&rows) {
            self.streams[seq as usize].live = false;
            return Vec::new();
        }
        if !check_status(self.process_last(), "process(verify)") {
            self.streams[seq as usize].live = false;
            return Vec::new();
        }
        let mut out = vec![self.target.argmax(0)];
        while out.len() <= draft.len() && draft[out.len() - 1] == *out.last().unwrap() {
            out.push(self.target.argmax(out.len()));
        }
        let n_acc = out.len() as i32 - 1;
        let keep = s.n_past + n_acc + 1;
        self.target.seq_rm(seq, keep, -1);
        let rc = unsafe { llama_spec_dflash2_accept(self.spec, seq, n_acc) };
        let ok = check_status(rc, "accept")
            && check_status(unsafe { llama_spec_dflash2_seq_rm(self.spec, seq, keep, -1) }, "seq_rm");
        self.streams[seq as usize] = Stream { n_past: keep, id_last: *out.last().unwrap(), live: ok };
        out
    }

    /// The engine's view of every sequence must be self-consistent: draft KV
    /// cells dense from 0, the map and libllama agreeing.
    pub fn check_invariants(&self) {
        for seq in 0..N_SEQ {
            let mut info = EMPTY_INFO;
            let rc = unsafe { llama_spec_dflash2_seq_info(self.spec, seq, &mut info) };
            assert_eq!(rc, 0, "seq_info: {}", last_error());
            assert!(info.n_in_kv >= 0 && info.n_queued >= 0 && info.n_held >= 0, "{info:?}");
            if info.n_in_kv > 0 {
                assert_eq!(
                    (info.kv_pos_min, info.kv_pos_max),
                    (0, info.n_in_kv - 1),
                    "seq {seq}: draft KV not dense: {info:?}"
                );
            } else {
                assert_eq!(
                    (info.kv_pos_min, info.kv_pos_max),
                    (-1, -1),
                    "seq {seq}: cells in the draft KV the map does not know: {info:?}"
                );
            }
            assert_eq!(info.next_draft_pos, info.n_in_kv, "seq {seq}: {info:?}");
            if info.n_outstanding < 0 {
                assert_eq!(info.n_held, 0, "seq {seq}: rows held without a draft: {info:?}");
            }
        }
    }

    /// The state blob of `seq`, which must save.
    pub fn save(&self, seq: i32) -> Vec<u8> {
        let mut size = 0usize;
        assert_eq!(
            unsafe { llama_spec_dflash2_state_size(self.spec, seq, &mut size) },
            0,
            "state_size: {}",
            last_error()
        );
        let mut blob = vec![0u8; size];
        let mut written = 0usize;
        let rc = unsafe { llama_spec_dflash2_state_get(self.spec, seq, blob.as_mut_ptr(), size, &mut written) };
        assert_eq!(rc, 0, "state_get: {}", last_error());
        assert!(written <= size, "state_get wrote {written} of {size} bytes");
        blob.truncate(written);
        blob
    }

    /// Forgets every sequence (engine and target), then checks the engine really
    /// holds nothing: a sequence seq_clear leaves behind is a defect (a poisoned
    /// state blob once left cells that no clear removed).
    pub fn check_cleared(&mut self) {
        let rc = unsafe { llama_spec_dflash2_seq_clear(self.spec, -1) };
        assert_eq!(rc, 0, "seq_clear(-1): {}", last_error());
        self.target.seq_rm(-1, -1, -1);
        self.streams = vec![Stream::default(); N_SEQ as usize];
        for seq in 0..N_SEQ {
            self.check_empty(seq, "after seq_clear(-1)");
        }
    }

    /// `seq` holds nothing: no draft KV cells (as the map and libllama see them),
    /// no queued or held rows, no draft awaiting accept().
    pub fn check_empty(&self, seq: i32, when: &str) {
        let mut info = EMPTY_INFO;
        let rc = unsafe { llama_spec_dflash2_seq_info(self.spec, seq, &mut info) };
        assert_eq!(rc, 0, "seq_info: {}", last_error());
        let got = (info.n_in_kv, info.n_queued, info.n_held, info.n_outstanding, info.next_draft_pos);
        let pos = (info.last_target_pos, info.kv_pos_min, info.kv_pos_max);
        assert!(got == (0, 0, 0, -1, 0) && pos == (-1, -1, -1), "seq {seq} not empty {when}: {info:?}");
    }

    /// Forgets everything, then generates `n` tokens (at most N_CHECK) after the
    /// pair's prompt speculatively: they must equal target-only greedy decoding.
    pub fn check_clean_generation(&mut self, n: usize) {
        self.check_cleared();
        let p = pair();
        assert!(self.prefill(0, &p.prompt), "prefill after a clear: {}", last_error());
        let mut out = vec![self.streams[0].id_last];
        while out.len() < n {
            let step = self.step(0, 3);
            assert!(!step.is_empty(), "a clean step failed: {}", last_error());
            out.extend(step);
        }
        out.truncate(n);
        assert_eq!(out, p.reference[..n], "clean generation after the input differs from target-only");
        self.check_cleared();
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        unsafe { llama_spec_dflash2_free(self.spec) }
    }
}

/// Fuzz bytes as call arguments, biased towards the values that break code.
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        head
    }

    /// An i32: small values, edges and boundaries most of the time.
    pub fn int(&mut self) -> i32 {
        const EDGES: [i32; 12] = [-1, 0, 1, 2, 3, 4, 7, 8, 63, 64, i32::MAX, i32::MIN];
        let tag = self.byte();
        match tag % 4 {
            0 | 1 => EDGES[(tag as usize / 4) % EDGES.len()],
            2 => self.byte() as i32 - 16,
            _ => i32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()]),
        }
    }

    /// A sequence id: mostly valid, sometimes not.
    pub fn seq(&mut self) -> i32 {
        let b = self.byte();
        if b < 224 { (b as i32) % N_SEQ } else { self.int() }
    }
}

/// Blobs the engine writes for real sequences (seeds for the state fuzzer): an
/// empty sequence, a prompt, a prompt with a few speculative steps.
pub fn sample_blobs() -> Vec<Vec<u8>> {
    let p = pair();
    let mut host = Host::new();
    let mut out = Vec::new();
    let mut save = |host: &Host| out.push(host.save(0));
    save(&host);
    assert!(host.prefill(0, &p.prompt[..4]));
    save(&host);
    assert!(host.prefill(0, &p.prompt));
    for _ in 0..3 {
        host.step(0, 3);
    }
    save(&host);
    out
}

/// The checks that end every input of the engine-level fuzzers.
///
/// Every input ends with seq_clear and the check that the engine then really
/// holds nothing (cheap). The full clean generation (`N_CHECK` tokens: ~30
/// libllama decodes, ~14 ms of CPU under ASan, a hundred times an average
/// input) runs after every `every`-th input (`DFLASH2_FUZZ_FULL_EVERY`, 1 =
/// after every input); an input the target flags as suspect (it touched state
/// in a way the cheap checks cannot vouch for) gets the quick one (`N_QUICK`
/// tokens) at once. A broken engine stays broken (that is what makes it a
/// defect), so the next full generation finds it; when any check fails, the
/// inputs since the last passing full generation are written out, in order, to
/// replay (`DFLASH2_FUZZ_FULL_EVERY=1 BINARY DIR/*` runs each file once, in
/// order, in one process, with the full generation after each).
pub struct Checks {
    every: u64,
}

/// Inputs since the last passing full clean generation (written out by the
/// panic hook when a check fails).
static HISTORY: Mutex<History> = Mutex::new(History { slots: Vec::new(), len: 0 });
static INPUTS: AtomicU64 = AtomicU64::new(0);
static FULL: AtomicU64 = AtomicU64::new(0);
static QUICK: AtomicU64 = AtomicU64::new(0);
static EVERY: AtomicU64 = AtomicU64::new(0);

/// Reuses its buffers: an input that leaves more allocations than it frees makes
/// libFuzzer run a LeakSanitizer scan of the whole heap after it (~20 ms).
struct History {
    slots: Vec<Vec<u8>>,
    len: usize,
}

impl History {
    fn push(&mut self, data: &[u8]) {
        if self.len == self.slots.len() {
            self.slots.push(Vec::with_capacity(4096));
        }
        let slot = &mut self.slots[self.len];
        slot.clear();
        slot.extend_from_slice(data);
        self.len += 1;
    }

    fn inputs(&self) -> &[Vec<u8>] {
        &self.slots[..self.len]
    }
}

impl Checks {
    /// `every`: the full generation's period unless DFLASH2_FUZZ_FULL_EVERY says otherwise.
    pub fn new(every: u64) -> Checks {
        let every = std::env::var("DFLASH2_FUZZ_FULL_EVERY").ok().and_then(|v| v.parse().ok()).unwrap_or(every).max(1);
        static HOOK: Once = Once::new();
        // after libfuzzer-sys's own hook (installed before the first input), which aborts
        HOOK.call_once(|| {
            EVERY.store(every, Ordering::Relaxed);
            let mut history = HISTORY.lock().unwrap();
            while history.slots.len() <= every.min(256) as usize {
                history.slots.push(Vec::with_capacity(4096));
            }
            drop(history);
            let abort = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                write_history();
                abort(info);
            }));
            unsafe { libc::atexit(print_counts) };
        });
        Checks { every }
    }

    /// Runs one input (`body` returns true when the input is suspect), then the checks.
    pub fn input(&mut self, host: &mut Host, data: &[u8], body: impl FnOnce(&mut Host) -> bool) {
        HISTORY.lock().unwrap().push(data);
        let n = INPUTS.fetch_add(1, Ordering::Relaxed) + 1;
        let suspect = body(host);
        host.check_cleared();
        if n % self.every == 0 {
            self.clean_generation(host);
        } else if suspect {
            QUICK.fetch_add(1, Ordering::Relaxed);
            host.check_clean_generation(N_QUICK);
        }
    }

    /// The full clean generation now (also before an engine is dropped: a
    /// defect the inputs since the last one left must not go with it).
    pub fn clean_generation(&mut self, host: &mut Host) {
        FULL.fetch_add(1, Ordering::Relaxed);
        host.check_clean_generation(N_CHECK);
        HISTORY.lock().unwrap().len = 0;
    }
}

extern "C" fn print_counts() {
    eprintln!(
        "dflash2-fuzz: {} inputs, every one cleared and checked empty; {} full clean generations (every {}th input), {} quick ones (after suspect inputs)",
        INPUTS.load(Ordering::Relaxed),
        FULL.load(Ordering::Relaxed),
        EVERY.load(Ordering::Relaxed),
        QUICK.load(Ordering::Relaxed)
    );
}

/// Writes the inputs since the last passing clean generation beside libFuzzer's
/// artifacts (the failing input alone may not reproduce a state others left).
fn write_history() {
    let Ok(history) = HISTORY.try_lock() else { return };
    let history = history.inputs();
    if history.len() < 2 {
        return; // libFuzzer's crash file is the whole story
    }
    let prefix =
        std::env::args().find_map(|a| a.strip_prefix("-artifact_prefix=").map(str::to_owned)).unwrap_or_default();
    let dir = PathBuf::from(format!("{prefix}history-{}", std::process::id()));
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    for (i, data) in history.iter().enumerate() {
        let _ = std::fs::write(dir.join(format!("{i:06}")), data);
    }
    eprintln!(
        "dflash2-fuzz: the {} inputs since the last passing clean generation (the failing one last) are in {}; \
         replay them in order, with a full clean generation after each: DFLASH2_FUZZ_FULL_EVERY=1 {} {}/*",
        history.len(),
        dir.display(),
        std::env::args().next().unwrap_or_default(),
        dir.display()
    );
}
