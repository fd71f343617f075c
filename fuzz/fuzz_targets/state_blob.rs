//! llama_spec_dflash2_state_set on arbitrary bytes and on mutations of real
//! blobs (the seed corpus holds blobs the engine wrote, see
//! scripts/reliability.sh): a blob is loaded whole or refused with a status and
//! a message. Refused, the sequence is as it was (empty); loaded, it saves
//! again, and what it saves loads and saves to the same bytes. Either way
//! seq_clear then empties the engine, and the engine stays usable and lossless:
//! a clean generation of 10 tokens after every 64th input, one of 3 tokens after
//! every loaded blob that is not one of the engine's own (`Checks` in src/lib.rs).
#![no_main]

use std::cell::RefCell;

use dflash2::ffi::*;
use dflash2_fuzz::{Checks, Host, check_status, sample_blobs};
use libfuzzer_sys::fuzz_target;

thread_local! {
    static HOST: RefCell<Option<Host>> = const { RefCell::new(None) };
    static CHECKS: RefCell<Option<Checks>> = const { RefCell::new(None) };
    static SEEDS: Vec<Vec<u8>> = sample_blobs();
}

/// With DFLASH2_FUZZ_WRITE_SEEDS=DIR the first input writes real blobs there
/// (scripts/reliability.sh seeds the corpus this way).
fn write_seeds_once() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Some(dir) = std::env::var_os("DFLASH2_FUZZ_WRITE_SEEDS") {
            std::fs::create_dir_all(&dir).expect("seed folder");
            for (i, blob) in sample_blobs().iter().enumerate() {
                std::fs::write(std::path::Path::new(&dir).join(format!("blob-{i}")), blob).expect("seed written");
            }
        }
    });
}

/// Loads `data` into sequence 0 of an empty engine; true when a blob the engine
/// did not write itself loaded.
fn load(host: &mut Host, data: &[u8]) -> bool {
    let rc = unsafe { llama_spec_dflash2_state_set(host.spec, 0, data.as_ptr(), data.len()) };
    check_status(rc, "state_set");
    host.check_invariants();
    host.check_empty(1, "after a blob loaded into sequence 0");
    if rc != 0 {
        // refused before anything changed, or left empty when libllama failed: empty either way
        host.check_empty(0, "after a refused blob");
        return false;
    }
    let saved = host.save(0);
    let rc = unsafe { llama_spec_dflash2_state_set(host.spec, 0, saved.as_ptr(), saved.len()) };
    assert_eq!(rc, 0, "a blob saved from a loaded one is refused: {}", dflash2_fuzz::last_error());
    host.check_invariants();
    assert!(host.save(0) == saved, "a loaded blob saves to other bytes the second time");
    !SEEDS.with(|s| s.iter().any(|b| b == data))
}

fuzz_target!(|data: &[u8]| {
    write_seeds_once();
    HOST.with(|h| {
        let mut h = h.borrow_mut();
        let host = h.get_or_insert_with(Host::new);
        CHECKS
            .with(|c| c.borrow_mut().get_or_insert_with(|| Checks::new(64)).input(host, data, |host| load(host, data)));
    });
});
