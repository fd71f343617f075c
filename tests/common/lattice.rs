//! Lattices as the walks read them.

/// Per lattice row: its candidates sorted by id, and its score matrix
/// reindexed by those sorted ids (successor) and the previous row's
/// (predecessor). ggml's top-k returns candidates in no fixed order, and a
/// near-tie resolved otherwise reorders them: this form compares what the
/// walks see.
pub fn canonical(lattice: &[f32], n_embd: usize, k: usize, width: usize) -> Vec<Vec<(i32, i32, f32)>> {
    let mut out = Vec::new();
    for block in lattice.chunks(width * n_embd) {
        let ids = |p: usize| -> Vec<i32> { block[p * n_embd..p * n_embd + k].iter().map(|&x| x as i32).collect() };
        for p in 1..width {
            let (succ, pred) = (ids(p), if p == 1 { vec![-1; k] } else { ids(p - 1) });
            let row = &block[p * n_embd + k..p * n_embd + k + k * k];
            let mut cells: Vec<(i32, i32, f32)> = (0..k * k).map(|x| (pred[x / k], succ[x % k], row[x])).collect();
            cells.sort_by_key(|c| (c.0, c.1));
            out.push(cells);
        }
    }
    out
}
