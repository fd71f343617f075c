//! P(the target accepts a drafted token | it reached the token's draft
//! position), learned per position and lattice-confidence bin
//! ([`AcceptanceModel`]).

/// Confidence bins of the lattice softmax at a pick.
const BINS: usize = 10;

/// Posterior standard deviations an optimistic estimate adds. Cutting drafts
/// by the posterior mean, a position whose first trials were rejected is
/// priced below its rows and never drafted again, so never observed again.
/// Simulated (`AdaptivePolicy`'s tests: a CPU whose verify rows cost a third
/// of a step, acceptance 0.95, 9 seeds x 5000 steps), where seven-token
/// drafts would pay 1.51x the mean cut drafted two and ran at 1.10-1.11x
/// plain; with one token more where its optimistic estimate pays
/// (`AdaptivePolicy::keep`, when drafting for all), 1.50-1.53x. One to two
/// deviations gave the same figures within 0.02x in these worlds (after two
/// rejections: 0.44 to 0.63).
const OPTIMISM: f64 = 1.5;

/// The Beta(1, 1) posterior mean of (reached, accepted).
fn posterior_mean((reached, accepted): (f64, f64)) -> f64 {
    (accepted + 1.0) / (reached + 2.0)
}

/// `OPTIMISM` posterior standard deviations of an estimate `p` resting on the
/// trials of `counts` (reached, accepted).
fn optimism(counts: (f64, f64), p: f64) -> f64 {
    OPTIMISM * (p * (1.0 - p) / (counts.0 + 3.0)).sqrt()
}

fn bin(confidence: f32) -> usize {
    ((confidence.clamp(0.0, 1.0) * BINS as f32) as usize).min(BINS - 1)
}

/// P(accept | the target reached this draft position), per position and bin.
#[derive(Clone, Debug)]
pub struct AcceptanceModel {
    /// [position][bin] -> (reached, accepted)
    counts: Vec<[(f64, f64); BINS]>,
}

impl AcceptanceModel {
    pub fn new(n_positions: usize) -> Self {
        AcceptanceModel { counts: vec![[(0.0, 0.0); BINS]; n_positions] }
    }

    /// Probability that a token at `position` with lattice softmax `confidence`
    /// is accepted when reached; a Beta(1, 1) prior for what has not been seen,
    /// falling back on the position's other bins.
    pub fn p_accept(&self, position: usize, confidence: f32) -> f64 {
        posterior_mean(self.cell(position, confidence))
    }

    /// `p_accept` plus `OPTIMISM` posterior standard deviations of the
    /// position's acceptance: a position a few early rejections put below its
    /// price is drafted (and observed) again until its trials say so. The
    /// position's, not the bin's: the confidence bins of a position reached
    /// often hold few trials each, and every one would be drafted again
    /// (measured: a CPU run drafting 207 tokens, 39 accepted, where the mean
    /// cut drafted 38).
    pub fn p_accept_optimistic(&self, position: usize, confidence: f32) -> f64 {
        let p = self.p_accept(position, confidence);
        (p + optimism(self.position_counts(position), p)).min(1.0)
    }

    /// P(accept | reached) at `position`, whatever the confidence.
    pub fn p_position(&self, position: usize) -> f64 {
        posterior_mean(self.position_counts(position))
    }

    /// (reached, accepted) of the bin, or of the position where the bin has none.
    fn cell(&self, position: usize, confidence: f32) -> (f64, f64) {
        let cell = self.counts[position.min(self.counts.len() - 1)][bin(confidence)];
        if cell.0 >= 1.0 { cell } else { self.position_counts(position) }
    }

    fn position_counts(&self, position: usize) -> (f64, f64) {
        let row = &self.counts[position.min(self.counts.len() - 1)];
        row.iter().fold((0.0, 0.0), |(r, a), &(x, y)| (r + x, a + y))
    }

    /// Drafts verified so far (each reached its first position).
    pub fn n_observed(&self) -> f64 {
        self.counts[0].iter().map(|c| c.0).sum()
    }

    /// A typical draft of `n` positions cut where a token stops paying `price`
    /// rows: (expected accepted tokens, tokens kept).
    pub fn expected_chain(&self, n: usize, price: f64) -> (f64, usize) {
        let (mut reach, mut gain, mut kept) = (1.0, 0.0, 0);
        for m in 0..n {
            reach *= self.p_position(m);
            if reach < price {
                break;
            }
            gain += reach;
            kept = m + 1;
        }
        (gain, kept)
    }

    /// Expected accepted tokens of a draft of `n` tokens.
    pub fn expected_accepted(&self, n: usize) -> f64 {
        let (mut reach, mut sum) = (1.0, 0.0);
        for m in 0..n {
            reach *= self.p_position(m);
            sum += reach;
        }
        sum
    }

    /// A verified draft: tokens before the first rejection were accepted, the
    /// first rejected one was reached, the rest were never reached.
    pub fn observe(&mut self, confidences: &[f32], n_accepted: usize) {
        let last = self.counts.len() - 1;
        for (m, &c) in confidences.iter().enumerate().take(n_accepted + 1) {
            let cell = &mut self.counts[m.min(last)][bin(c)];
            cell.0 += 1.0;
            if m < n_accepted {
                cell.1 += 1.0;
            }
        }
    }

    /// One token the target reached at `position`: accepted or not
    /// (`crate::calibration` observes every child of a tree's reached nodes).
    pub fn observe_trial(&mut self, position: usize, confidence: f32, accepted: bool) {
        let last = self.counts.len() - 1;
        let cell = &mut self.counts[position.min(last)][bin(confidence)];
        cell.0 += 1.0;
        cell.1 += accepted as u8 as f64;
    }

    /// Draft positions measured (deeper ones count in the last).
    pub fn n_positions(&self) -> usize {
        self.counts.len()
    }

    /// (reached, accepted) per confidence bin at `position` (bin b holds
    /// confidences in [b, b + 1) / bins, the last one also 1).
    pub fn counts(&self, position: usize) -> &[(f64, f64)] {
        &self.counts[position.min(self.counts.len() - 1)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acceptance_is_learned_per_position_and_confidence() {
        let mut m = AcceptanceModel::new(4);
        for _ in 0..50 {
            m.observe(&[0.95, 0.2], 1); // confident first accepted, unsure second rejected
        }
        assert!(m.p_accept(0, 0.95) > 0.9);
        assert!(m.p_accept(1, 0.2) < 0.1);
        // an unseen bin falls back on the position's other bins
        assert!(m.p_accept(0, 0.05) > 0.9);
        // never reached: the prior
        assert_eq!(m.p_accept(3, 0.5), 0.5);
        // a typical chain: 51/52 at the first position, cut at the second (1/52 < 0.1)
        let (gain, kept) = m.expected_chain(4, 0.1);
        assert_eq!(kept, 1, "{gain}");
        assert!((gain - 51.0 / 52.0).abs() < 1e-9, "{gain}");
    }

    #[test]
    fn the_optimistic_estimate_comes_down_to_the_mean_as_trials_add_up() {
        let mut m = AcceptanceModel::new(2);
        // two rejections at the second position: a mean of 1/4, drafted again
        m.observe(&[0.5, 0.5], 1);
        m.observe(&[0.5, 0.5], 1);
        assert!((m.p_position(1) - 0.25).abs() < 1e-12);
        let sd = (0.25f64 * 0.75 / 5.0).sqrt();
        assert!((m.p_accept_optimistic(1, 0.5) - (0.25 + OPTIMISM * sd)).abs() < 1e-12);
        // a hundred more: within a few hundredths of the mean
        for _ in 0..100 {
            m.observe(&[0.5, 0.5], 1);
        }
        let gap = m.p_accept_optimistic(1, 0.5) - m.p_accept(1, 0.5);
        assert!(gap > 0.0 && gap < 0.04, "{gap}");
        // never above 1
        for _ in 0..10 {
            m.observe(&[0.5, 0.5], 2);
        }
        assert!(m.p_accept_optimistic(0, 0.5) <= 1.0);
    }
}
