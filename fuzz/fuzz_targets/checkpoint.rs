//! Drafter validation on arbitrary bytes and on mutations of valid drafters
//! (seed corpus: the fixtures' drafters, see scripts/reliability.sh): the same
//! read + validate that llama_spec_dflash2_checkpoint_check runs over its memory
//! map. A result is Ok or an error with a status and a message; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(gguf) = dflash2_gguf::read(data) else { return };
    match dflash2::checkpoint::validate(&gguf, data) {
        Ok(ckpt) => {
            std::hint::black_box(ckpt.block_size);
        }
        Err(e) => assert!(!e.message.is_empty(), "an error without a message: {e:?}"),
    }
});
