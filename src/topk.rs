//! The selector's top-k with one defined order, on the CPU: the reference the
//! CUDA kernel (`cuda/topk.cu`) is held to, and the merge of per-slice top-k
//! lists of a head split over devices.
//!
//! Order: larger logits first; equal logits by smaller token id; NaN after
//! every number (-inf included), NaNs by token id. A row shorter than k gives
//! all of its entries. Under this order the top k of a row is one set, so the
//! top k of the union of every slice's top k is the top k of the whole row,
//! ties included (`merge`).

use std::cmp::Ordering;

/// A candidate: token id and logit.
pub type Scored = (i32, f32);

/// `a` before `b` in the order above.
pub fn better(a: Scored, b: Scored) -> bool {
    order(a, b) == Ordering::Less
}

/// The order above as a comparator (Less: `a` first).
pub fn order(a: Scored, b: Scored) -> Ordering {
    match (a.1.is_nan(), b.1.is_nan()) {
        (false, true) => Ordering::Less,
        (true, false) => Ordering::Greater,
        (true, true) => a.0.cmp(&b.0),
        (false, false) => b.1.partial_cmp(&a.1).expect("numbers").then(a.0.cmp(&b.0)),
    }
}

/// The top `k` of `row` (ids from `first`), best first.
pub fn top_k(row: &[f32], k: usize, first: i32) -> Vec<Scored> {
    let mut all: Vec<Scored> = row.iter().enumerate().map(|(i, &v)| (first + i as i32, v)).collect();
    let k = k.min(all.len());
    if k == 0 {
        return Vec::new();
    }
    all.select_nth_unstable_by(k - 1, |&a, &b| order(a, b));
    all.truncate(k);
    all.sort_by(|&a, &b| order(a, b));
    all
}

/// The top `k` of the union of per-slice top-k lists, best first: the top k
/// of the whole row when each list is its slice's top k (or all of it).
pub fn merge(parts: &[Vec<Scored>], k: usize) -> Vec<Scored> {
    let mut all: Vec<Scored> = parts.iter().flatten().copied().collect();
    all.sort_by(|&a, &b| order(a, b));
    all.truncate(k);
    all
}

/// xorshift64: the rows' values, the same on every machine.
fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// Rows with what breaks a naive top-k (many ties, NaN, infinities, rows
/// shorter than k, an empty one): the cases every implementation is tested on.
pub fn adversarial_rows() -> Vec<Vec<f32>> {
    let mut next = xorshift(0x9e3779b97f4a7c15);
    let mut rows = vec![
        vec![1.0; 37],
        vec![f32::NAN; 9],
        vec![f32::NEG_INFINITY; 12],
        vec![f32::INFINITY, f32::NAN, 0.0, f32::NEG_INFINITY, -0.0, 0.0, f32::INFINITY],
        vec![3.0, 2.0],
        vec![],
    ];
    for n in [5usize, 64, 1000, 4099] {
        // few distinct values: ties everywhere, some NaN and infinities
        rows.push(
            (0..n)
                .map(|_| match next() % 23 {
                    0 => f32::NAN,
                    1 => f32::NEG_INFINITY,
                    2 => f32::INFINITY,
                    r => (r % 5) as f32 - 2.0,
                })
                .collect(),
        );
        rows.push((0..n).map(|_| (next() >> 40) as f32 / 1e5 - 80.0).collect());
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brute(row: &[f32], k: usize) -> Vec<Scored> {
        let mut all: Vec<Scored> = row.iter().enumerate().map(|(i, &v)| (i as i32, v)).collect();
        // insertion sort: the definition, slowly
        for i in 1..all.len() {
            let mut j = i;
            while j > 0 && better(all[j], all[j - 1]) {
                all.swap(j, j - 1);
                j -= 1;
            }
        }
        all.truncate(k);
        all
    }

    fn same(a: &[Scored], b: &[Scored]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.0 == y.0 && x.1.to_bits() == y.1.to_bits())
    }

    #[test]
    fn top_k_follows_the_defined_order_on_adversarial_rows() {
        for row in adversarial_rows() {
            for k in [1usize, 2, 3, 8, 16, 40, 5000] {
                let got = top_k(&row, k, 0);
                assert!(same(&got, &brute(&row, k)), "k {k}, row of {}: {got:?}", row.len());
                assert_eq!(got.len(), k.min(row.len()));
            }
        }
        // ties keep the smallest ids; NaN after -inf
        assert_eq!(top_k(&[1.0, 2.0, 2.0, 2.0], 2, 10), vec![(11, 2.0), (12, 2.0)]);
        let r = top_k(&[f32::NAN, f32::NEG_INFINITY, f32::NAN], 3, 0);
        assert_eq!(r.iter().map(|c| c.0).collect::<Vec<_>>(), vec![1, 0, 2]);
    }

    #[test]
    fn merged_slices_give_the_whole_rows_top_k() {
        let mut next = xorshift(7);
        for row in adversarial_rows() {
            for k in [1usize, 4, 8, 16] {
                // slices of uneven sizes, some shorter than k, some empty
                let mut cuts = vec![0, row.len()];
                for _ in 0..(next() % 5) {
                    cuts.push((next() as usize) % (row.len() + 1));
                }
                cuts.sort();
                let parts: Vec<Vec<Scored>> =
                    cuts.windows(2).map(|w| top_k(&row[w[0]..w[1]], k, w[0] as i32)).collect();
                let got = merge(&parts, k);
                assert!(same(&got, &top_k(&row, k, 0)), "k {k}, cuts {cuts:?}");
            }
        }
    }
}
