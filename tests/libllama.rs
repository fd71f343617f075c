//! The linked libllama itself: it runs the fixture target, and its ggml type
//! sizes are the ones the GGUF reader assumes.

mod common;

use common::{Model, fixtures, init_backend};
use dflash2::sys;

fn greedy(model: &Model, prompt: &[i32], n_gen: usize) -> Vec<i32> {
    unsafe {
        let mut cp = sys::llama_context_default_params();
        cp.n_ctx = 128;
        cp.n_batch = 64;
        cp.n_ubatch = 64;
        cp.n_threads = 2;
        cp.n_threads_batch = 2;
        let ctx = sys::llama_init_from_model(model.0, cp);
        assert!(!ctx.is_null());
        let vocab = sys::llama_model_get_vocab(model.0);
        let n_vocab = sys::llama_vocab_n_tokens(vocab) as usize;
        let mut tokens = prompt.to_vec();
        let mut out = Vec::new();
        let mut batch = sys::llama_batch_get_one(tokens.as_mut_ptr(), tokens.len() as i32);
        for _ in 0..n_gen {
            assert_eq!(sys::llama_decode(ctx, batch), 0);
            let logits = std::slice::from_raw_parts(sys::llama_get_logits_ith(ctx, -1), n_vocab);
            let next = (0..n_vocab).fold(0, |best, i| if logits[i] > logits[best] { i } else { best }) as i32;
            assert!(logits.iter().all(|l| l.is_finite()));
            out.push(next);
            tokens = vec![next];
            batch = sys::llama_batch_get_one(tokens.as_mut_ptr(), 1);
        }
        sys::llama_free(ctx);
        out
    }
}

#[test]
fn fixture_target_tokenizes_and_decodes_deterministically() {
    let model = Model::load(&fixtures().target);
    let vocab = unsafe { sys::llama_model_get_vocab(model.0) };
    let text = "the draft model is fast";
    let mut toks = vec![0i32; 64];
    let n = unsafe {
        sys::llama_tokenize(vocab, text.as_ptr().cast(), text.len() as i32, toks.as_mut_ptr(), 64, true, false)
    };
    assert!(n > 1, "tokenized to {n} tokens");
    toks.truncate(n as usize);
    assert_eq!(toks[0], 1, "BOS first");
    let a = greedy(&model, &toks, 12);
    let b = greedy(&model, &toks, 12);
    assert_eq!(a, b);
    assert_eq!(a.len(), 12);
}

#[test]
fn ggml_type_table_matches_libggml() {
    init_backend();
    let table = dflash2_gguf::all_ggml_types();
    let count = sys::GGML_TYPE_COUNT;
    let mut known = 0;
    for id in 0..count {
        let blck = unsafe { sys::ggml_blck_size(id) } as u64;
        if blck == 0 {
            assert!(dflash2_gguf::ggml_type_from_id(id).is_none(), "type {id} is removed in ggml");
            continue;
        }
        let size = unsafe { sys::ggml_type_size(id) } as u64;
        let t = dflash2_gguf::ggml_type_from_id(id).unwrap_or_else(|| panic!("type {id} missing from the table"));
        assert_eq!((t.block_size, t.type_size), (blck, size), "type {}", t.name);
        known += 1;
    }
    assert_eq!(known, table.len());
}
