//! llama_spec_dflash2_state_set on arbitrary bytes and on mutations of real
//! blobs (the seed corpus holds blobs the engine wrote, see
//! scripts/reliability.sh): a blob is loaded whole or refused with a status and
//! a message; either way the engine stays usable and lossless.
#![no_main]

use std::cell::RefCell;

use dflash2::ffi::*;
use dflash2_fuzz::{Host, check_status, sample_blobs};
use libfuzzer_sys::fuzz_target;

thread_local! {
    static HOST: RefCell<Option<Host>> = const { RefCell::new(None) };
    static INPUTS: RefCell<u64> = const { RefCell::new(0) };
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

fuzz_target!(|data: &[u8]| {
    write_seeds_once();
    HOST.with(|h| {
        let mut h = h.borrow_mut();
        let host = h.get_or_insert_with(Host::new);
        let rc = unsafe { llama_spec_dflash2_state_set(host.spec, 0, data.as_ptr(), data.len()) };
        check_status(rc, "state_set");
        host.check_invariants();
        // a loaded blob must also save again
        if rc == 0 {
            let mut size = 0usize;
            let rc = unsafe { llama_spec_dflash2_state_size(host.spec, 0, &mut size) };
            assert_eq!(rc, 0, "state_size after a loaded blob");
        }
        let n = INPUTS.with(|c| {
            *c.borrow_mut() += 1;
            *c.borrow()
        });
        // the full clean-generation check is costly: every 16th input, and always after a load
        if rc == 0 || n % 16 == 0 {
            host.check_clean_generation();
        }
    });
});
