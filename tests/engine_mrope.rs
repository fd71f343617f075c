//! A non-M-RoPE drafter on an M-RoPE target fed an image-like embedding span
//! (rows pinned to one temporal position, then a position jump) keeps drafting,
//! and the speculative output equals the target-only output. Upstream rejects
//! exactly this case ("failed to process speculative batch" on the jump).

mod common;

use common::fixtures;
use common::spec::{Spec, default_params};
use common::target::{ERow, Target};
use dflash2::ffi::{llama_spec_dflash2_draft_request, llama_spec_dflash2_image_rows};

const GRID: (i32, i32) = (2, 3);
const N_GEN: usize = 24;

fn token_row(seq: i32, token: i32, pos: i32, logits: bool) -> ERow {
    ERow { seq, token: Some(token), embd: Vec::new(), pos: [pos, pos, pos, 0], logits }
}

/// Decodes text, an image of GRID rows x cols pinned at one temporal position,
/// then more text from the position after the image. Feeds every sub-batch to
/// the engine when there is one. Returns the first generated token and n_past.
fn prefill(target: &mut Target, spec: Option<&Spec>) -> (i32, i32) {
    let before = target.tokenize("the model is", true);
    let after = target.tokenize(" a block and", false);
    let rows: Vec<ERow> = before.iter().enumerate().map(|(i, &t)| token_row(0, t, i as i32, false)).collect();
    target.decode_ext(&rows);
    if let Some(s) = spec {
        s.process(target);
    }

    let p = before.len() as i32;
    let n_embd = target.n_embd();
    let mut image = Vec::new();
    for r in 0..GRID.0 {
        for c in 0..GRID.1 {
            let embd = (0..n_embd).map(|k| ((k as i32 * 7 + r * 13 + c * 5) % 17) as f32 / 17.0 - 0.5).collect();
            image.push(ERow { seq: 0, token: None, embd, pos: [p, p + r, p + c, 0], logits: false });
        }
    }
    target.decode_ext(&image);
    if let Some(s) = spec {
        s.process(target);
    }

    let p = p + GRID.0.max(GRID.1);
    let rows: Vec<ERow> =
        after.iter().enumerate().map(|(i, &t)| token_row(0, t, p + i as i32, i + 1 == after.len())).collect();
    let first = target.decode_ext(&rows)[0];
    if let Some(s) = spec {
        s.process(target);
    }
    (first, p + after.len() as i32)
}

fn reference() -> Vec<i32> {
    let mut target = Target::new(&fixtures().target_mrope, 1, 512, 128);
    let (mut next, mut pos) = prefill(&mut target, None);
    let mut out = vec![next];
    while out.len() < N_GEN {
        next = target.decode_ext(&[token_row(0, next, pos, true)])[0];
        out.push(next);
        pos += 1;
    }
    out
}

/// The engine is returned with its target: the target context must outlive it.
fn speculative(image_rows: i32) -> (Vec<i32>, Spec, Target, i32) {
    let fx = fixtures();
    let mut target = Target::new(&fx.target_mrope, 1, 512, 128);
    let mut params = default_params(1);
    params.image_rows = image_rows;
    let spec = Spec::new(&target, &fx.drafter_for_mrope, params);
    let (first, mut n_past) = prefill(&mut target, Some(&spec));
    let mut out = vec![first];
    let mut id_last = first;
    while out.len() < N_GEN {
        let d = spec
            .draft(&[llama_spec_dflash2_draft_request { seq_id: 0, id_last, n_max: 3, ..Default::default() }])
            .remove(0);
        let mut rows = vec![token_row(0, id_last, n_past, true)];
        rows.extend(d.iter().enumerate().map(|(j, &t)| token_row(0, t, n_past + 1 + j as i32, true)));
        let v = target.decode_ext(&rows);
        spec.process(&target);
        let mut n_acc = 0;
        while n_acc < d.len() && d[n_acc] == v[n_acc] {
            n_acc += 1;
        }
        out.extend_from_slice(&v[..=n_acc]);
        spec.accept(0, n_acc as i32);
        n_past += n_acc as i32 + 1;
        target.seq_rm(0, n_past, -1);
        spec.seq_rm(0, n_past, -1);
        id_last = v[n_acc];
    }
    out.truncate(N_GEN);
    (out, spec, target, n_past)
}

#[test]
fn image_rows_get_dense_draft_positions_and_generation_stays_lossless() {
    let want = reference();
    let (got, spec, target, n_past) = speculative(0);
    assert_eq!(got, want);
    let st = spec.stats();
    assert!(st.n_drafted > 0, "drafting stopped");
    let info = spec.info(0);
    let n_image = GRID.0 * GRID.1;
    // target positions jumped over the image, draft positions did not: one per row
    let n_rows = n_past - GRID.0.max(GRID.1) + n_image;
    assert_eq!(info.n_in_kv + info.n_queued, n_rows);
    assert_eq!(info.last_target_pos, n_past - 1);
    assert_eq!((info.kv_pos_min, info.kv_pos_max), (0, info.n_in_kv - 1));
    assert_eq!(st.n_skipped_rows, 0);
    drop(spec);
    drop(target);
}

#[test]
fn skipping_image_rows_leaves_them_out_and_stays_lossless() {
    let want = reference();
    let (got, spec, target, n_past) =
        speculative(llama_spec_dflash2_image_rows::LLAMA_SPEC_DFLASH2_IMAGE_ROWS_SKIP as i32);
    assert_eq!(got, want);
    let st = spec.stats();
    assert_eq!(st.n_skipped_rows, (GRID.0 * GRID.1) as u64);
    let info = spec.info(0);
    assert_eq!(info.n_in_kv + info.n_queued, n_past - GRID.0.max(GRID.1));
    drop(spec);
    drop(target);
}
