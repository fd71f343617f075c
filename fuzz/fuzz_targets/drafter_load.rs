//! Engine creation on arbitrary drafter files (seed corpus: the fixtures'
//! drafters, see scripts/reliability.sh): llama_spec_dflash2_init on the
//! fixture target reads the file, checks it, loads its weights into the own
//! graph's buffers and reserves its graphs. It returns NULL with an error
//! status and a message, or an engine that drafts and stays lossless: a
//! prefill and speculative steps emit the target's own greedy tokens. Never a
//! panic, an abort or a crash.
#![no_main]

use std::ffi::CString;

use dflash2_fuzz::{Host, N_QUICK, pair};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let p = pair();
    let path = std::env::temp_dir().join(format!("dflash2-fuzz-drafter-{}.gguf", std::process::id()));
    std::fs::write(&path, data).expect("scratch drafter written");
    let cpath = CString::new(path.to_str().unwrap()).unwrap();
    match Host::with_drafter(&cpath) {
        Err((status, message)) => {
            assert!(status < 0, "init failed with status {status}");
            assert!(!message.is_empty(), "init failed without a message (status {status})");
        }
        Ok(mut host) => {
            host.check_invariants();
            assert!(host.prefill(0, &p.prompt), "prefill refused by an engine init accepted");
            let mut out = vec![host.streams[0].id_last];
            while out.len() < N_QUICK {
                let step = host.step(0, 4);
                assert!(!step.is_empty(), "a step refused by an engine init accepted");
                out.extend(step);
            }
            assert_eq!(&out[..N_QUICK], &p.reference[..N_QUICK], "not lossless with this drafter");
            host.check_invariants();
        }
    }
    let _ = std::fs::remove_file(&path);
});
