//! What the tree tests share: lattice blocks, random lattices, the tree
//! invariants, hand-made nodes.

use super::{Node, Tree};
use crate::sampling::Rng;

// ---- helpers -------------------------------------------------------

/// A block of K candidates per position: `cands[p-1]`, `scores[p-1][i][j]`.
pub(super) fn block(k: usize, cands: &[Vec<f32>], scores: &[Vec<Vec<f32>>]) -> (Vec<f32>, usize) {
    let n_embd = k * (k + 1) + 1;
    let mut rows = vec![0.0; n_embd]; // anchor row
    for (c, s) in cands.iter().zip(scores) {
        let mut row = vec![0.0; n_embd];
        row[..k].copy_from_slice(c);
        for i in 0..k {
            row[k + i * k..k + (i + 1) * k].copy_from_slice(&s[i]);
        }
        rows.extend(row);
    }
    (rows, n_embd)
}

pub(super) fn same(k: usize, s: &[f32]) -> Vec<Vec<f32>> {
    vec![s.to_vec(); k]
}

/// A random lattice: K in 2..=5, 1..=8 positions, ids in 0..n_vocab + 2
/// (some out of the vocabulary, duplicates), scores from a small set (ties);
/// with `corrupt`, some NaN and infinite scores.
pub(super) fn random_block(rng: &mut Rng, n_vocab: usize, corrupt: bool) -> (Vec<f32>, usize, usize) {
    let k = 2 + (rng.next_u64() % 4) as usize;
    let n_pos = 1 + (rng.next_u64() % 8) as usize;
    let score = |rng: &mut Rng| match rng.next_u64() % 40 {
        0 if corrupt => f32::NAN,
        1 if corrupt => f32::INFINITY,
        2 if corrupt => f32::NEG_INFINITY,
        x => (x % 7) as f32 * 0.5 - 1.0,
    };
    let cands: Vec<Vec<f32>> = (0..n_pos)
        .map(|_| {
            (0..k)
                .map(|_| {
                    let r = rng.next_u64();
                    if corrupt && r % 25 == 0 { (n_vocab + 1) as f32 } else { (r % n_vocab as u64) as f32 }
                })
                .collect()
        })
        .collect();
    let scores: Vec<Vec<Vec<f32>>> =
        (0..n_pos).map(|_| (0..k).map(|_| (0..k).map(|_| score(rng)).collect()).collect()).collect();
    let (rows, n_embd) = block(k, &cands, &scores);
    (rows, n_embd, k)
}

/// A clean random lattice: distinct in-vocabulary ids, finite scores.
pub(super) fn clean_block(rng: &mut Rng, n_vocab: usize) -> (Vec<f32>, usize, usize) {
    let k = 2 + (rng.next_u64() % 4) as usize;
    let n_pos = 1 + (rng.next_u64() % 8) as usize;
    let cands: Vec<Vec<f32>> = (0..n_pos)
        .map(|_| {
            let start = rng.next_u64() % (n_vocab - k) as u64;
            (0..k).map(|j| (start + j as u64) as f32).collect()
        })
        .collect();
    let scores: Vec<Vec<Vec<f32>>> = (0..n_pos)
        .map(|_| (0..k).map(|_| (0..k).map(|_| (rng.next_f64() * 6.0 - 3.0) as f32).collect()).collect())
        .collect();
    let (rows, n_embd) = block(k, &cands, &scores);
    (rows, n_embd, k)
}

pub(super) fn check_invariants(t: &Tree) {
    assert_eq!(Tree::from_nodes(t.nodes().to_vec()).as_ref(), Ok(t));
}

pub(super) fn node(token: i32, parent: i32, depth: usize) -> Node {
    Node { token, parent, depth, prob: 0.5, path_prob: 0.5, candidate: 0, ngram: 0 }
}
