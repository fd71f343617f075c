//! The engine's side of `crate::draft_temperature`: a sampled request that
//! leaves its draft temperature unset gets the engine's choice for its class,
//! and every verified node of such a draft (a chain position, or a tree node
//! with drawn children) scores the candidate temperatures against the
//! target's p there. Only p the host passed for verification is read, after
//! the verification succeeded; nothing here draws from a sequence's
//! generators.

use super::sampled::{self, Mode};
use super::{Engine, Request};
use crate::draft_temperature::{Class, Tuning};
use crate::error::Result;
use crate::sampling::Dist;
use crate::tree::SampledTree;

/// A verified node of a tuned draft, kept to be scored after the call that
/// verified it is done with the draft: q's ids and probabilities, and the
/// children drawn from q.
pub(super) struct VerifiedNode {
    q: Option<(Vec<i32>, Vec<f32>)>,
    n_drawn: usize,
}

impl VerifiedNode {
    /// Node `at` (None: the anchor) of a sampled tree.
    pub fn of_tree(tree: &SampledTree, at: Option<usize>) -> VerifiedNode {
        let (q, n_drawn) = tree.drawn_from(at);
        let q = match q {
            Some(Dist::Sparse { ids, probs }) => Some((ids.to_vec(), probs.to_vec())),
            _ => None,
        };
        VerifiedNode { q, n_drawn }
    }
}

impl Engine {
    /// Scores the candidate draft temperatures on `node` against `p`, the
    /// target's distribution at its row.
    pub(super) fn observe_node(&mut self, tuning: Option<Tuning>, node: &VerifiedNode, p: Dist) {
        let q = node.q.as_ref().map(|(ids, probs)| Dist::Sparse { ids, probs });
        self.observe_tuning(tuning, q, p, node.n_drawn);
    }

    /// How request `r` drafts: as `sampled::mode` says, q cut as the draft's
    /// shape says (`Truncation::for_draft`), with the engine's draft
    /// temperature where the request leaves it unset and tuning is on.
    /// `tree_nodes`: None for a chain, else the tree's node budget.
    pub(super) fn mode_of(&self, r: &Request, tree_nodes: Option<usize>) -> Result<Mode> {
        let mode = match sampled::mode(r)? {
            Mode::Sampled { t_draft, seed, truncation, tuning } => {
                Mode::Sampled { t_draft, seed, truncation: truncation.for_draft(tree_nodes), tuning }
            }
            greedy => greedy,
        };
        let (Mode::Sampled { seed, truncation, .. }, Some(temps)) = (mode, self.controller.draft_temperatures.as_ref())
        else {
            return Ok(mode);
        };
        if !sampled::leaves_draft_temperature(r) {
            return Ok(mode);
        }
        let class = Class::new(r.temperature, tree_nodes);
        let t_draft = temps.choose(r.temperature, class);
        Ok(Mode::Sampled { t_draft, seed, truncation, tuning: Some(Tuning { class, t_draft }) })
    }

    /// Counts a tuned draft in the statistics.
    pub(super) fn record_tuning(&mut self, r: &Request, mode: Mode) {
        if let Some(t) = mode.tuning() {
            self.stats.n_tuned_drafts += 1;
            self.stats.tuned_ratio_milli += (t.t_draft / r.temperature * 1000.0).round() as u64;
        }
    }

    /// A verified node of a tuned draft: q (drawn at `tuning.t_draft`), the
    /// target's p at the node's row, and the children drawn from q.
    pub(super) fn observe_tuning(&mut self, tuning: Option<Tuning>, q: Option<Dist>, p: Dist, n_drawn: usize) {
        let (Some(tuning), Some(Dist::Sparse { ids, probs }), Some(temps)) =
            (tuning, q, self.controller.draft_temperatures.as_mut())
        else {
            return;
        };
        temps.observe(tuning, probs, &p_at(p, ids), n_drawn);
    }
}

/// p at q's tokens. p was checked (finite, >= 0, summing to 1 within
/// `sampling::SUM_TOLERANCE`) by the verification that just succeeded, so it
/// is read as given: checking and renormalizing it again would walk a dense
/// vocabulary once more per verified node, for a score that does not need it.
fn p_at(p: Dist, ids: &[i32]) -> Vec<f64> {
    match p {
        Dist::Dense(probs) => ids.iter().map(|&id| probs.get(id as usize).map_or(0.0, |&x| x as f64)).collect(),
        Dist::Sparse { ids: p_ids, probs } => {
            let mut out = vec![0.0; ids.len()];
            for (id, &x) in p_ids.iter().zip(probs) {
                if let Some(k) = ids.iter().position(|q| q == id) {
                    out[k] += x as f64; // duplicates sum, as in `Checked`
                }
            }
            out
        }
    }
}
