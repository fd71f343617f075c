//! The host sampler's truncation applied to a draft distribution q
//! ([`Truncation`]), and q's whole shape ([`DraftQ`]).
//!
//! Why: a sampled child is accepted with the overlap of the target's p and
//! q. A llama.cpp host's p is truncated (top-k, top-p, min-p, then the
//! temperature), so a candidate the host's chain would drop has p = 0: drawn,
//! it is always rejected, and as a sibling it spends a verify row on nothing.
//! Cutting q the same way moves its mass onto tokens p can accept. It stays
//! lossless: q is whatever distribution the draft was drawn from, and the
//! verifier is given exactly that q.
//!
//! The cut mirrors llama.cpp's chain on the drafter's candidates: masses at
//! temperature 1 (the softmax of the edge scores, duplicates merged), top-k
//! first, then top-p on what is left (renormalized: the smallest prefix by
//! mass whose share reaches top_p), then min-p (at least min_p times the
//! largest); the draft temperature is applied after, as llama.cpp's
//! temperature comes after its truncation. The most probable candidate always
//! stays, so a one-hot q (draft temperature 0) is never cut.

use crate::error::{Error, Result};

/// The most nodes of a tree whose q is cut ([`Truncation::for_draft`]).
pub const TRUNCATED_TREE_MAX_NODES: usize = 15;

/// top-k / top-p / min-p as a llama.cpp sampler chain sets them; each one off
/// at its neutral value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Truncation {
    /// 0: off.
    top_k: usize,
    /// 1: off.
    top_p: f64,
    /// 0: off.
    min_p: f64,
}

impl Default for Truncation {
    fn default() -> Self {
        Truncation::NONE
    }
}

impl Truncation {
    /// No cut.
    pub const NONE: Truncation = Truncation { top_k: 0, top_p: 1.0, min_p: 0.0 };

    /// From a request's fields: top_k <= 0 is off; top_p <= 0 or >= 1 is off
    /// (a zero-initialized field cuts nothing); min_p <= 0 is off, above 1
    /// refused. NaN and infinities are refused.
    pub fn new(top_k: i32, top_p: f32, min_p: f32) -> Result<Truncation> {
        if !top_p.is_finite() {
            return Err(Error::invalid(format!("top_p {top_p} (must be finite; <= 0 or >= 1: off)")));
        }
        if !(min_p.is_finite() && min_p <= 1.0) {
            return Err(Error::invalid(format!("min_p {min_p} (must be finite and <= 1; <= 0: off)")));
        }
        Ok(Truncation {
            top_k: top_k.max(0) as usize,
            top_p: if top_p > 0.0 && top_p < 1.0 { top_p as f64 } else { 1.0 },
            min_p: min_p.max(0.0) as f64,
        })
    }

    pub fn is_none(&self) -> bool {
        *self == Truncation::NONE
    }

    /// The cut a draft applies: a chain's and a small tree's (at most
    /// `TRUNCATED_TREE_MAX_NODES`) q is cut, a bigger tree's is not
    /// (`tree_nodes`: None for a chain, else the tree's node budget). Why:
    /// the cut moves a draw's mass onto the tokens p keeps, which is what a
    /// chain or a few children need; the drafter's cut is its own guess at
    /// p's, though, and a wide tree loses more by never drafting the tokens
    /// it wrongly drops than it gains by not drawing the ones it rightly
    /// drops (its calibrated growth ranks those children low anyway).
    /// Measured (mixed-16, T = 0.8, llama-server's sampler, tau cut vs not):
    /// 7 nodes 1.92 vs 1.82, 15 nodes 1.94 vs 1.96, 31 nodes 1.86 vs 1.95,
    /// the controller's 63 1.82 vs 2.16.
    pub fn for_draft(self, tree_nodes: Option<usize>) -> Truncation {
        match tree_nodes {
            Some(n) if n > TRUNCATED_TREE_MAX_NODES => Truncation::NONE,
            _ => self,
        }
    }

    /// Zeroes the weights (`weight`, per candidate) of the candidates whose
    /// token the cut drops. `ids`: each candidate's token (None: unusable);
    /// `mass`: each candidate's temperature-1 weight (any positive scale).
    pub fn apply(&self, ids: &[Option<i32>], mass: &[f64], weight: &mut [f64]) {
        if self.is_none() {
            return;
        }
        // distinct tokens and their summed mass, in candidate order
        let mut tokens: Vec<(i32, f64)> = Vec::with_capacity(ids.len());
        for (id, &m) in ids.iter().zip(mass) {
            if let Some(id) = *id {
                match tokens.iter_mut().find(|t| t.0 == id) {
                    Some(t) => t.1 += m,
                    None => tokens.push((id, m)),
                }
            }
        }
        // by mass, largest first (stable: candidate order among equals)
        tokens.sort_by(|a, b| b.1.total_cmp(&a.1));
        let mut n = tokens.len();
        if self.top_k > 0 {
            n = n.min(self.top_k);
        }
        if self.top_p < 1.0 {
            let total: f64 = tokens[..n].iter().map(|t| t.1).sum();
            let mut cum = 0.0;
            for (i, t) in tokens[..n].iter().enumerate() {
                cum += t.1;
                if cum >= self.top_p * total {
                    n = i + 1;
                    break;
                }
            }
        }
        if self.min_p > 0.0 && n > 0 {
            let floor = self.min_p * tokens[0].1;
            n = tokens[..n].iter().take_while(|t| t.1 >= floor).count().max(1);
        }
        let kept = &tokens[..n.max(1).min(tokens.len())];
        for (id, w) in ids.iter().zip(weight.iter_mut()) {
            if id.is_none_or(|id| !kept.iter().any(|t| t.0 == id)) {
                *w = 0.0;
            }
        }
    }
}

/// How a sampled draft's q is made from a lattice row: softmax(S / t) over
/// the usable candidates the truncation keeps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DraftQ {
    pub t: f32,
    pub truncation: Truncation,
}

impl DraftQ {
    /// q at temperature `t`, not truncated.
    pub fn at(t: f32) -> DraftQ {
        DraftQ { t, truncation: Truncation::NONE }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(t: Truncation, ids: &[Option<i32>], mass: &[f64]) -> Vec<i32> {
        let mut w = vec![1.0; ids.len()];
        t.apply(ids, mass, &mut w);
        ids.iter().zip(&w).filter(|e| *e.1 > 0.0).map(|e| e.0.unwrap()).collect()
    }

    #[test]
    fn chains_and_small_trees_are_cut_bigger_trees_are_not() {
        let t = Truncation::new(40, 0.95, 0.05).unwrap();
        assert_eq!(t.for_draft(None), t);
        assert_eq!(t.for_draft(Some(1)), t);
        assert_eq!(t.for_draft(Some(TRUNCATED_TREE_MAX_NODES)), t);
        assert_eq!(t.for_draft(Some(TRUNCATED_TREE_MAX_NODES + 1)), Truncation::NONE);
        assert_eq!(t.for_draft(Some(63)), Truncation::NONE);
    }

    #[test]
    fn each_cut_keeps_what_llama_cpp_s_chain_keeps() {
        let ids = [Some(1), Some(2), Some(3), Some(4), Some(5)];
        let mass = [0.4, 0.3, 0.15, 0.1, 0.05];
        let t = |k, p, m| Truncation::new(k, p, m).unwrap();
        assert_eq!(kept(t(0, 0.0, 0.0), &ids, &mass), [1, 2, 3, 4, 5]);
        assert_eq!(kept(t(2, 0.0, 0.0), &ids, &mass), [1, 2]);
        // top-p: 0.4 + 0.3 = 0.7 < 0.8, + 0.15 reaches it
        assert_eq!(kept(t(0, 0.8, 0.0), &ids, &mass), [1, 2, 3]);
        // top-p after top-k renormalizes: of 0.4 + 0.3, 0.4 is 57% >= 0.5
        assert_eq!(kept(t(2, 0.5, 0.0), &ids, &mass), [1]);
        // min-p: at least 0.3 x 0.4 = 0.12
        assert_eq!(kept(t(0, 0.0, 0.3), &ids, &mass), [1, 2, 3]);
        // the most probable token always stays
        assert_eq!(kept(t(0, 1e-9, 1.0), &ids, &mass), [1]);
    }

    #[test]
    fn duplicates_count_as_one_token_and_unusable_candidates_go() {
        // token 7 twice (0.25 + 0.25) outweighs token 1 (0.4)
        let ids = [Some(1), Some(7), None, Some(7), Some(9)];
        let mass = [0.4, 0.25, 0.9, 0.25, 0.1];
        assert_eq!(kept(Truncation::new(1, 0.0, 0.0).unwrap(), &ids, &mass), [7, 7]);
        assert_eq!(kept(Truncation::new(0, 0.0, 0.5).unwrap(), &ids, &mass), [1, 7, 7]);
    }

    #[test]
    fn bad_values_are_refused_and_neutral_ones_cut_nothing() {
        for (k, p, m) in [(0, f32::NAN, 0.0), (0, 0.5, f32::INFINITY), (0, 0.5, 1.5), (0, 0.5, f32::NAN)] {
            assert!(Truncation::new(k, p, m).is_err(), "{k} {p} {m}");
        }
        for (k, p, m) in [(0, 0.0, 0.0), (-1, 1.0, -0.5), (0, 2.0, 0.0)] {
            assert!(Truncation::new(k, p, m).unwrap().is_none(), "{k} {p} {m}");
        }
    }
}
