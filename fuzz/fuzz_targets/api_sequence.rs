//! Arbitrary sequences of engine calls with arbitrary arguments, mixed with the
//! steps a real host takes. After every call: the engine did it or returned a
//! known status with a message, never an internal error, and its view of every
//! sequence is consistent (dense draft KV, map and libllama agreeing). After
//! every input: seq_clear really empties the engine. After every 16th input a
//! clean speculative generation of 10 tokens, after every suspect one (a
//! well-formed host step refused, a blob the engine did not write loaded) one
//! of 3 tokens: each must equal target-only (`Checks` in src/lib.rs says why
//! not the long one after every input).
#![no_main]

use std::cell::RefCell;

use dflash2::ffi::*;
use dflash2_fuzz::{Checks, Host, Input, N_SEQ, check_status, pair};
use libfuzzer_sys::fuzz_target;

thread_local! {
    static HOST: RefCell<Option<Host>> = const { RefCell::new(None) };
    static CHECKS: RefCell<Option<Checks>> = const { RefCell::new(None) };
    static INPUTS: RefCell<u64> = const { RefCell::new(0) };
}

/// Most calls one input makes (keeps an execution short).
const MAX_CALLS: usize = 48;

/// Runs the calls `input` spells; true when it did something that calls for a
/// clean generation at once: a well-formed host step refused, or a blob the
/// engine did not write accepted.
fn run(host: &mut Host, input: &mut Input) -> bool {
    let p = pair();
    let mut suspect = false;
    let mut blobs: Vec<Vec<u8>> = Vec::new();
    for _ in 0..MAX_CALLS {
        if input.is_empty() {
            break;
        }
        let spec = host.spec;
        match input.byte() % 12 {
            // the host's own steps reach the deep states
            0 => {
                let seq = (input.byte() as i32) % N_SEQ;
                let n = 1 + (input.byte() as usize) % p.prompt.len();
                suspect |= !host.prefill(seq, &p.prompt[..n]);
            }
            1 | 2 => {
                let seq = (input.byte() as i32) % N_SEQ;
                let n_max = 1 + (input.byte() as i32) % 8;
                let live = host.streams[seq as usize].live;
                suspect |= live && host.step(seq, n_max).is_empty();
            }
            3 => {
                // rows as a hostile host passes them
                let n = (input.byte() % 6) as usize;
                let rows: Vec<llama_spec_dflash2_row> = (0..n)
                    .map(|_| llama_spec_dflash2_row {
                        i_batch: input.int(),
                        seq_id: input.seq(),
                        pos: input.int(),
                        embd: input.byte() & 1 == 1,
                    })
                    .collect();
                let rc = unsafe { llama_spec_dflash2_process(spec, rows.as_ptr(), rows.len() as i32) };
                check_status(rc, "process");
            }
            4 => {
                let n = (input.byte() % 4) as usize;
                let reqs: Vec<llama_spec_dflash2_draft_request> = (0..n)
                    .map(|_| llama_spec_dflash2_draft_request {
                        seq_id: input.seq(),
                        id_last: input.int(),
                        n_max: input.int(),
                        ..Default::default()
                    })
                    .collect();
                // the buffers are what they say, or smaller than the requests need
                let cap = (input.byte() as usize) % 40;
                let mut tokens = vec![0i32; cap];
                let mut n_drafted = vec![0i32; n];
                let rc = unsafe {
                    llama_spec_dflash2_draft(
                        spec,
                        reqs.as_ptr(),
                        n as i32,
                        tokens.as_mut_ptr(),
                        cap as i32,
                        n_drafted.as_mut_ptr(),
                    )
                };
                if check_status(rc, "draft") {
                    let total: i32 = n_drafted.iter().sum();
                    assert!(
                        n_drafted.iter().all(|&k| k >= 0) && total as usize <= cap,
                        "draft lengths {n_drafted:?} for {cap}"
                    );
                }
            }
            5 => {
                let rc = unsafe { llama_spec_dflash2_accept(spec, input.seq(), input.int()) };
                check_status(rc, "accept");
            }
            6 => {
                let rc = unsafe { llama_spec_dflash2_seq_rm(spec, input.seq(), input.int(), input.int()) };
                check_status(rc, "seq_rm");
            }
            7 => {
                let rc = unsafe { llama_spec_dflash2_seq_cp(spec, input.seq(), input.seq(), input.int(), input.int()) };
                check_status(rc, "seq_cp");
            }
            8 => {
                let rc =
                    unsafe { llama_spec_dflash2_seq_shift(spec, input.seq(), input.int(), input.int(), input.int()) };
                check_status(rc, "seq_shift");
            }
            9 => {
                let rc = unsafe { llama_spec_dflash2_seq_clear(spec, input.seq()) };
                check_status(rc, "seq_clear");
            }
            10 => {
                let seq = input.seq();
                let mut size = 0usize;
                if check_status(unsafe { llama_spec_dflash2_state_size(spec, seq, &mut size) }, "state_size") {
                    assert!(size < 1 << 30, "state size {size}");
                    let mut blob = vec![0u8; size];
                    let mut written = 0usize;
                    let rc = unsafe { llama_spec_dflash2_state_get(spec, seq, blob.as_mut_ptr(), size, &mut written) };
                    if check_status(rc, "state_get") {
                        assert!(written <= size);
                        blob.truncate(written);
                        blobs.push(blob);
                    }
                }
            }
            _ => {
                // a saved blob, a mutated one, or fuzz bytes as a blob
                let seq = input.seq();
                let mut blob = match blobs.last() {
                    Some(b) if input.byte() & 1 == 0 => b.clone(),
                    _ => input.bytes(64).to_vec(),
                };
                for _ in 0..(input.byte() % 4) {
                    if !blob.is_empty() {
                        let at = (input.int() as u32 as usize) % blob.len();
                        blob[at] ^= input.byte();
                    }
                }
                let rc = unsafe { llama_spec_dflash2_state_set(spec, seq, blob.as_ptr(), blob.len()) };
                suspect |= check_status(rc, "state_set") && !blobs.contains(&blob);
            }
        }
        host.check_invariants();
    }
    suspect
}

fuzz_target!(|data: &[u8]| {
    HOST.with(|h| {
        let mut h = h.borrow_mut();
        let host = h.get_or_insert_with(Host::new);
        let recreate = CHECKS.with(|c| {
            let mut c = c.borrow_mut();
            let checks = c.get_or_insert_with(|| Checks::new(16));
            checks.input(host, data, |host| run(host, &mut Input::new(data)));
            // a fresh engine now and then: creation and teardown are part of the API too
            let n = INPUTS.with(|c| {
                *c.borrow_mut() += 1;
                *c.borrow()
            });
            let recreate = n % 1000 == 0;
            if recreate {
                checks.clean_generation(host);
            }
            recreate
        });
        if recreate {
            *h = None;
        }
    });
});
