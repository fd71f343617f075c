//! P(the target accepts a drafted token | it reached the token's draft
//! position), learned per position and lattice-confidence bin
//! ([`AcceptanceModel`]).

/// Confidence bins of the lattice softmax at a pick.
const BINS: usize = 10;

/// The Beta(1, 1) posterior mean of (reached, accepted).
fn posterior_mean((reached, accepted): (f64, f64)) -> f64 {
    (accepted + 1.0) / (reached + 2.0)
}

fn bin(confidence: f32) -> usize {
    ((confidence.clamp(0.0, 1.0) * BINS as f32) as usize).min(BINS - 1)
}

/// P(accept | the target reached this draft position), per position and bin.
#[derive(Clone, Debug)]
pub struct AcceptanceModel {
    /// [position][bin] -> (reached, accepted)
    counts: Vec<[(f64, f64); BINS]>,
    /// each trial at a position first fades its earlier ones by 1 - 1 / memory
    memory: Option<f64>,
}

impl AcceptanceModel {
    pub fn new(n_positions: usize) -> Self {
        AcceptanceModel { counts: vec![[(0.0, 0.0); BINS]; n_positions.max(1)], memory: None }
    }

    /// A model that weighs about the last `trials` trials of each position:
    /// a prompt whose easy start is behind it is not priced by that start.
    pub fn with_memory(n_positions: usize, trials: f64) -> Self {
        AcceptanceModel { memory: Some(trials.max(1.0)), ..Self::new(n_positions) }
    }

    /// The posterior standard deviation of the acceptance at `position`.
    pub fn sd_position(&self, position: usize) -> f64 {
        let counts = self.position_counts(position);
        let p = posterior_mean(counts);
        (p * (1.0 - p) / (counts.0 + 3.0)).sqrt()
    }

    /// Every trial weighs `share` less (trials age).
    pub fn fade(&mut self, share: f64) {
        for position in 0..self.counts.len() {
            self.fade_position(position, share);
        }
    }

    fn fade_position(&mut self, position: usize, share: f64) {
        for cell in self.counts[position].iter_mut() {
            cell.0 *= 1.0 - share;
            cell.1 *= 1.0 - share;
        }
    }

    fn fade_trial(&mut self, position: usize) {
        if let Some(memory) = self.memory {
            self.fade_position(position, 1.0 / memory);
        }
    }

    /// Probability that a token at `position` with lattice softmax `confidence`
    /// is accepted when reached; a Beta(1, 1) prior for what has not been seen,
    /// falling back on the position's other bins.
    pub fn p_accept(&self, position: usize, confidence: f32) -> f64 {
        posterior_mean(self.cell(position, confidence))
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

    /// A verified draft: tokens before the first rejection were accepted, the
    /// first rejected one was reached, the rest were never reached.
    pub fn observe(&mut self, confidences: &[f32], n_accepted: usize) {
        let last = self.counts.len() - 1;
        for (m, &c) in confidences.iter().enumerate().take(n_accepted + 1) {
            self.fade_trial(m.min(last));
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
        self.fade_trial(position.min(last));
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
    }

    #[test]
    fn a_model_with_a_memory_follows_a_falling_acceptance() {
        let mut m = AcceptanceModel::with_memory(2, 64.0);
        for _ in 0..200 {
            m.observe(&[0.5, 0.5], 2);
        }
        let sure = m.sd_position(0);
        for _ in 0..64 {
            m.observe(&[0.5, 0.5], 0);
        }
        // the last 64 trials weigh about 1 - 1/e: below a half from 0.99
        assert!(m.p_position(0) < 0.5, "{}", m.p_position(0));
        // and the posterior is wider where its trials disagree
        assert!(m.sd_position(0) > sure);
        let mut all = AcceptanceModel::new(2);
        for _ in 0..200 {
            all.observe(&[0.5], 1);
        }
        for _ in 0..64 {
            all.observe(&[0.5], 0);
        }
        assert!(all.p_position(0) > 0.7);
    }
}
