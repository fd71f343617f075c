//! Walks over the DFlash2 selector lattice. Pure functions, no model needed.
//!
//! The drafter writes one lattice row per block position (block-major), each
//! `n_embd` floats wide. Row 0 of a block (the anchor) is unused. Row p holds:
//! - floats `[0, k)`: the top-k candidate ids of position p, as f32, in no
//!   particular order (ggml's top-k does not sort; slot 0 is not the best);
//! - float `k + i*k + j`: the edge score of predecessor candidate i (of
//!   position p-1; at p = 1 the anchor, repeated over i) and successor
//!   candidate j (of position p);
//! - zero padding up to `n_embd`.

/// Stopping rules of a walk, as upstream applies them.
#[derive(Clone, Copy, Debug)]
pub struct WalkLimits {
    /// Most tokens to emit (the block yields at most its width - 1).
    pub n_max: usize,
    /// A walk that emits fewer tokens than this returns none.
    pub n_min: usize,
    /// Stop before a token whose softmax over its k lattice scores is below
    /// this; 0 disables the rule.
    pub p_min: f32,
}

/// One block's lattice rows.
#[derive(Clone, Copy)]
pub struct Lattice<'a> {
    rows: &'a [f32],
    n_embd: usize,
    top_k: usize,
}

impl<'a> Lattice<'a> {
    /// `rows` holds the block's rows, anchor row first; `n_embd >= k*(k+1)`.
    pub fn new(rows: &'a [f32], n_embd: usize, top_k: usize) -> Option<Lattice<'a>> {
        let ok = top_k > 0 && n_embd >= top_k * (top_k + 1) && rows.len() % n_embd == 0;
        ok.then_some(Lattice { rows, n_embd, top_k })
    }

    /// Rows in the block, the anchor included.
    pub fn n_rows(&self) -> usize {
        self.rows.len() / self.n_embd
    }

    fn row(&self, p: usize) -> &'a [f32] {
        &self.rows[p * self.n_embd..(p + 1) * self.n_embd]
    }

    /// Candidate ids of position p (as stored: f32).
    pub fn candidates(&self, p: usize) -> &'a [f32] {
        &self.row(p)[..self.top_k]
    }

    /// Edge scores from predecessor candidate `pred` to every candidate of position p.
    pub fn scores(&self, p: usize, pred: usize) -> &'a [f32] {
        let k = self.top_k;
        &self.row(p)[k + pred * k..k + (pred + 1) * k]
    }
}

/// Index of the first maximum, with C++'s `std::max_element` semantics (a NaN
/// never replaces the running maximum, and one in front stays).
fn first_max(s: &[f32]) -> usize {
    let mut best = 0;
    for j in 1..s.len() {
        if s[best] < s[j] {
            best = j;
        }
    }
    best
}

/// Softmax of `s` at `at`: 1 / sum_j exp(s_j - s_at).
fn softmax_at(s: &[f32], at: usize) -> f32 {
    let sum: f32 = s.iter().map(|&x| (x - s[at]).exp()).sum();
    1.0 / sum
}

/// A drafted token and the softmax of its lattice scores at the pick.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pick {
    pub token: i32,
    pub confidence: f32,
}

/// The greedy chain, exactly as upstream: start from the anchor, at each
/// position take the best successor of the previous pick. `n_vocab` bounds the
/// ids a row may produce: a corrupt candidate ends the walk instead of being
/// handed to the host.
pub fn greedy_walk_scored(lattice: &Lattice, limits: WalkLimits, n_vocab: usize) -> Vec<Pick> {
    let n_positions = lattice.n_rows().saturating_sub(1).min(limits.n_max);
    let mut picks = Vec::with_capacity(n_positions);
    let mut pred = 0;
    for p in 1..=n_positions {
        let scores = lattice.scores(p, pred);
        pred = first_max(scores);
        let confidence = softmax_at(scores, pred);
        if limits.p_min > 0.0 && confidence < limits.p_min {
            break;
        }
        let id = lattice.candidates(p)[pred];
        if !(id >= 0.0 && (id as usize) < n_vocab) {
            break;
        }
        picks.push(Pick { token: id as i32, confidence });
    }
    if picks.len() < limits.n_min {
        picks.clear();
    }
    picks
}

/// `greedy_walk_scored` without the confidences.
pub fn greedy_walk(lattice: &Lattice, limits: WalkLimits, n_vocab: usize) -> Vec<i32> {
    greedy_walk_scored(lattice, limits, n_vocab).into_iter().map(|p| p.token).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: usize = 3;
    const N_EMBD: usize = 16; // >= k*(k+1) = 12

    /// Builds a block: `cands[p]` and `scores[p][i][j]` for p >= 1.
    fn block(cands: &[[f32; K]], scores: &[[[f32; K]; K]]) -> Vec<f32> {
        let mut rows = vec![0.0; N_EMBD]; // anchor row
        for (c, s) in cands.iter().zip(scores) {
            let mut row = vec![0.0; N_EMBD];
            row[..K].copy_from_slice(c);
            for i in 0..K {
                row[K + i * K..K + (i + 1) * K].copy_from_slice(&s[i]);
            }
            rows.extend(row);
        }
        rows
    }

    fn limits(n_max: usize) -> WalkLimits {
        WalkLimits { n_max, n_min: 0, p_min: 0.0 }
    }

    fn same(s: [f32; K]) -> [[f32; K]; K] {
        [s; K]
    }

    #[test]
    fn follows_the_best_successor_of_each_pick_not_slot_zero() {
        let rows = block(
            &[[10.0, 11.0, 12.0], [20.0, 21.0, 22.0]],
            &[same([0.1, 0.9, 0.2]), [[5.0, 0.0, 0.0], [0.0, 0.0, 3.0], [0.0, 9.0, 0.0]]],
        );
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        // position 1 picks candidate 1 (id 11); position 2 reads predecessor row 1 -> candidate 2 (id 22)
        assert_eq!(greedy_walk(&lat, limits(8), 100), vec![11, 22]);
    }

    #[test]
    fn ties_break_on_the_first_maximum() {
        let rows = block(&[[7.0, 8.0, 9.0]], &[same([1.0, 1.0, 1.0])]);
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        assert_eq!(greedy_walk(&lat, limits(8), 100), vec![7]);
    }

    #[test]
    fn nan_scores_never_win() {
        let rows = block(&[[7.0, 8.0, 9.0]], &[same([0.5, f32::NAN, 2.0])]);
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        assert_eq!(greedy_walk(&lat, limits(8), 100), vec![9]);
    }

    #[test]
    fn n_max_limits_the_positions_walked() {
        let rows = block(&[[1.0, 2.0, 3.0]; 3], &[same([0.0, 1.0, 0.0]); 3]);
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        assert_eq!(greedy_walk(&lat, limits(2), 100), vec![2, 2]);
        assert_eq!(greedy_walk(&lat, limits(9), 100), vec![2, 2, 2]);
    }

    #[test]
    fn p_min_is_the_softmax_over_the_lattice_scores() {
        // confident first position, flat second
        let rows = block(&[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], &[same([0.0, 10.0, 0.0]), same([1.0, 1.1, 1.0])]);
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        let walk = |p_min| greedy_walk(&lat, WalkLimits { n_max: 8, n_min: 0, p_min }, 100);
        assert_eq!(walk(0.0), vec![2, 5]);
        // softmax at the second pick is ~0.356
        assert_eq!(walk(0.3), vec![2, 5]);
        assert_eq!(walk(0.4), vec![2]);
        // softmax at the first pick is 1 / (1 + 2e^-10) = 0.99991
        assert_eq!(walk(0.9999), vec![2]);
        assert_eq!(walk(0.99995), Vec::<i32>::new());
    }

    #[test]
    fn scored_walk_reports_the_softmax_of_each_pick() {
        let rows = block(&[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], &[same([0.0, 10.0, 0.0]), same([1.0, 1.1, 1.0])]);
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        let picks = greedy_walk_scored(&lat, limits(8), 100);
        assert_eq!(picks.iter().map(|p| p.token).collect::<Vec<_>>(), vec![2, 5]);
        assert!((picks[0].confidence - 0.99991).abs() < 1e-4);
        assert!((picks[1].confidence - 0.3559).abs() < 1e-3);
    }

    #[test]
    fn a_walk_shorter_than_n_min_drafts_nothing() {
        let rows = block(&[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], &[same([0.0, 10.0, 0.0]), same([1.0, 1.1, 1.0])]);
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        let walk = |n_min| greedy_walk(&lat, WalkLimits { n_max: 8, n_min, p_min: 0.4 }, 100);
        assert_eq!(walk(1), vec![2]);
        assert_eq!(walk(2), Vec::<i32>::new());
    }

    #[test]
    fn out_of_vocabulary_candidates_end_the_walk() {
        let rows = block(&[[1.0, 2.0, 3.0], [4.0, 500.0, 6.0]], &[same([0.0, 1.0, 0.0]); 2]);
        let lat = Lattice::new(&rows, N_EMBD, K).unwrap();
        assert_eq!(greedy_walk(&lat, limits(8), 100), vec![2]);
    }

    #[test]
    fn rows_too_narrow_for_the_lattice_are_refused() {
        assert!(Lattice::new(&[0.0; 22], 11, K).is_none());
        assert!(Lattice::new(&[0.0; 17], N_EMBD, K).is_none());
    }
}
