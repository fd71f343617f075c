//! DFlash2's grouped dynamic depthwise convolution over the block positions.
//!
//! With H channels in groups of S (G = H / S groups), K taps, and a block of
//! B rows per sequence, for side 0 (before a sub-layer) or 1 (after it):
//!
//!   w[c, k, t] = base[c, k, side] + dyn_t[g(c), k, side]
//!   y[c, t]    = sum over k < min(K, B) of w[c, k, t] * x[c, t - k]
//!
//! with x = 0 left of each block's first row: a tap reads the row k places
//! to its left inside the same block only. `dyn_t` is one projection of the
//! sub-layer's normed input, shared by both sides. The ops, their order and
//! the sum's order are libllama's (`build_dflash2_conv`), so the bits are.

use super::spec::Spec;
use crate::sys::ggml::{GraphCtx, Tensor};

/// `hidden` [H, n] convolved with the coefficients `dynamic` [2·K·G, n] and
/// the static `base` [H, K, 2] on `side`, n = n_blocks rows per block each.
pub fn conv<'a>(
    g: &'a GraphCtx,
    spec: &Spec,
    hidden: Tensor<'a>,
    dynamic: Tensor<'a>,
    base: Tensor<'a>,
    side: usize,
    n_blocks: i64,
) -> Tensor<'a> {
    let sel = spec.selector.expect("convolutions are DFlash2's");
    let (kernel, group) = (sel.conv_kernel, sel.conv_group);
    let h = hidden.ne()[0];
    let n = hidden.ne()[1];
    let n_groups = h / group;
    let block = n / n_blocks;

    let hidden = if hidden.is_contiguous() { hidden } else { g.cont_shape(hidden, &[h, n]) };
    let dynamic = if dynamic.is_contiguous() { dynamic } else { g.cont_shape(dynamic, &[dynamic.ne()[0], n]) };
    let blocks = g.reshape(hidden, &[h, block, n_blocks]);
    let coeffs = g.reshape(dynamic, &[n_groups, kernel, 2, n]);
    let cn = coeffs.nb();
    let coeffs_side = g.view(coeffs, &[n_groups, kernel, n], &[cn[1], cn[3]], side * cn[2]);
    // per-group coefficients broadcast over the group's channels
    let coeff_all = g.reshape(g.cont(coeffs_side), &[1, n_groups, kernel, n]);
    let coeff_all = g.repeat_4d(coeff_all, [group, n_groups, kernel, n]);
    let base_side = g.view(base, &[h * kernel], &[], side * base.nb()[2]);
    let base_side = g.reshape(base_side, &[group, n_groups, kernel, 1]);
    let weight_all = g.add(coeff_all, base_side);

    // taps at or past the block's width read only the left padding
    let n_taps = kernel.min(block);
    let mut result: Option<Tensor<'a>> = None;
    for tap in 0..n_taps {
        let values = if tap == 0 {
            blocks
        } else {
            let bn = blocks.nb();
            let previous = g.view(blocks, &[h, block - tap, n_blocks], &[bn[1], bn[2]], 0);
            g.pad_ext(previous, [0, tap as i32, 0, 0], [0; 4])
        };
        let values = g.reshape(values, &[h, n]);
        let wn = weight_all.nb();
        let weight = g.view(weight_all, &[group, n_groups, 1, n], &[wn[1], wn[2], wn[3]], tap as usize * wn[2]);
        let weight = g.reshape(g.cont(weight), &[h, n]);
        let term = g.mul(weight, values);
        result = Some(match result {
            None => term,
            Some(r) => g.add(r, term),
        });
    }
    result.expect("a convolution has at least one tap")
}
