//! The bounded GGUF reader on arbitrary bytes: never panics, never allocates
//! from an unchecked count; whatever it accepts can be walked in full.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(gguf) = dflash2_gguf::read(data) {
        let _ = gguf.architecture();
        for (key, value) in gguf.kvs() {
            std::hint::black_box((key.len(), format!("{value:?}").len()));
        }
        for t in gguf.tensors() {
            std::hint::black_box(format!("{t:?}").len());
        }
    }
});
