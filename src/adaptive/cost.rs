//! A time against a row count ([`CostModel`]): what the host's verify
//! decodes and the draft decodes cost.

use super::mean::Mean;
use super::{ARM_MIN_STEPS, SPIKE};

/// Slopes between runs of different row counts before a cost model has a
/// slope (one slowed-down decode spoils two).
const SLOPE_MIN: u32 = 5;

/// Slopes before the dearest of them is known (`dearest_slope`): of three,
/// one slowed-down decode spoils two, and the third is clean. Two do where
/// the middle of their three runs has the most rows (a plain step, a probe,
/// a plain step): a slowed-down decode there raises both slopes, one at
/// either end lowers only its own, so the dearer of the two is at least a
/// clean one.
const DEAR_SLOPES_MIN: usize = 3;

/// A time against a row count as a + b * rows. The level is a running mean;
/// the slope b is the median of the last slopes between neighbouring runs of
/// observations of one row count (each run's running mean; the run going on
/// counts as it stands). Neighbours share the machine's load (a slope against
/// a mean of older decodes reads a machine slowed down since as the cost of
/// rows), and one decode slowed down alone spoils the two slopes of its run
/// among five at least, not the fit (as it would a least-squares slope from
/// three probes). Not a lower quantile, though slowed-down decodes mostly
/// spoil slopes upwards: where rows are dear, a cost read too low is the
/// expensive error (full blocks verified every step).
#[derive(Clone, Copy, Debug, Default)]
pub struct CostModel {
    pub(super) n: Mean,
    pub(super) t: Mean,
    count: f64,
    /// the run of observations going on and the one before it, as (rows,
    /// mean seconds), newest first
    runs: [Option<(usize, Mean)>; 2],
    /// the row count of the run before `runs[1]`
    older_rows: Option<usize>,
    /// the slopes of runs that ended (a ring)
    slopes: [f64; SLOPES],
    n_slopes: usize,
    /// Whether the ended slopes settle the slope (see `settled`).
    pub(super) settled: bool,
    /// The median of the slopes (with the run going on's) once SLOPE_MIN
    /// were seen; kept while every observation has the same row
    /// count (drafting off: the cost of a row does not fade).
    pub(super) slope: Option<f64>,
    /// The dearest slope seen (with the run going on's) once DEAR_SLOPES_MIN were.
    dearest: Option<f64>,
}

/// Slopes between runs that the slope's median spans.
const SLOPES: usize = 16;

/// The median of sorted values (not empty).
fn median(sorted: &[f64]) -> f64 {
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 { sorted[mid] } else { 0.5 * (sorted[mid - 1] + sorted[mid]) }
}

/// Sorted slopes agree when their middle half lies within half their median.
fn agree(sorted: &[f64]) -> bool {
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    at(0.75) - at(0.25) <= 0.5 * at(0.5).abs()
}

impl CostModel {
    pub fn observe(&mut self, rows: usize, seconds: f64) {
        // a decode slowed down by the machine (a busy core, ggml's threads
        // spinning at a barrier) counts as SPIKE times what was expected at
        // most: one such decode among a few must not make the rows look dear
        let seconds = if self.count >= ARM_MIN_STEPS as f64 && self.t.value > 0.0 {
            seconds.min(SPIKE * self.predict(rows).max(self.t.value))
        } else {
            seconds
        };
        match &mut self.runs[0] {
            Some((r, mean)) if *r == rows => mean.add(seconds),
            _ => {
                if let Some(slope) = self.run_slope() {
                    self.slopes[self.n_slopes % SLOPES] = slope;
                    self.n_slopes += 1;
                }
                let mut mean = Mean::default();
                mean.add(seconds);
                self.older_rows = self.runs[1].map(|(r, _)| r);
                self.runs = [Some((rows, mean)), self.runs[0]];
            }
        }
        // slopes change only here: sorted once per observation, on the stack
        let n = self.n_slopes.min(SLOPES);
        let mut sorted = [0.0; SLOPES + 1];
        sorted[..n].copy_from_slice(&self.slopes[..n]);
        sorted[..n].sort_by(f64::total_cmp);
        self.settled = n >= 2 * SLOPE_MIN as usize || (n >= SLOPE_MIN as usize && agree(&sorted[..n]));
        let mut len = n;
        if let Some(ongoing) = self.run_slope() {
            sorted[len] = ongoing;
            len += 1;
            sorted[..len].sort_by(f64::total_cmp);
        }
        if len >= SLOPE_MIN as usize {
            self.slope = Some(median(&sorted[..len]).max(0.0));
        }
        if len >= DEAR_SLOPES_MIN || (len == 2 && self.middle_run_is_widest()) {
            self.dearest = Some(sorted[len - 1].max(0.0));
        }
        self.count += 1.0;
        self.n.add(rows as f64);
        self.t.add(seconds);
    }

    /// Whether the run before the one going on has more rows than both its
    /// neighbours (see DEAR_SLOPES_MIN).
    fn middle_run_is_widest(&self) -> bool {
        match (self.older_rows, self.runs[1], self.runs[0]) {
            (Some(a), Some((b, _)), Some((c, _))) => b > a && b > c,
            _ => false,
        }
    }

    /// The slope between the run going on and the one before it.
    fn run_slope(&self) -> Option<f64> {
        let ((a, ta), (b, tb)) = (self.runs[1]?, self.runs[0]?);
        Some((tb.value - ta.value) / (b as f64 - a as f64))
    }

    /// Whether the slope rests on enough slopes that slowed-down decodes
    /// (each spoiling two) cannot have set it: SLOPE_MIN that agree, or twice
    /// as many.
    pub fn settled(&self) -> bool {
        self.settled
    }

    /// Seconds per extra row, once rows have varied enough to tell.
    pub fn per_row(&self) -> Option<f64> {
        self.slope
    }

    /// The dearest of the slopes seen, once DEAR_SLOPES_MIN were: a slowed-
    /// down decode raises both its slopes when it verified more rows than its
    /// neighbours and lowers them when it verified fewer, so among three
    /// slopes the dearest is at least a clean one (a row is not taken for
    /// cheaper than it is).
    pub fn dearest_slope(&self) -> Option<f64> {
        self.dearest
    }

    pub fn seen(&self) -> bool {
        self.t.seen
    }

    /// The mean time observed.
    pub fn mean(&self) -> f64 {
        self.t.value
    }

    /// The expected time of `rows` rows: the fit when rows have varied, else
    /// proportional to the rows seen (dearer than the fit for larger batches:
    /// a batch of more rows is not assumed cheaper per row before it is seen).
    pub fn predict(&self, rows: usize) -> f64 {
        self.predict_by(rows, self.slope)
    }

    /// `predict` with another slope (None: proportional to the rows seen).
    pub fn predict_by(&self, rows: usize, slope: Option<f64>) -> f64 {
        let rows = rows as f64;
        match slope {
            Some(b) => (self.t.value + b * (rows - self.n.value)).max(0.0),
            None if self.n.value > 0.0 => self.t.value * rows / self.n.value,
            None => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_cost_slope_is_fitted_once_rows_vary() {
        let mut c = CostModel::default();
        for _ in 0..10 {
            c.observe(8, 0.008 + 8.0 * 0.003);
        }
        assert!(c.per_row().is_none(), "one row count cannot give a slope");
        // before the slope, a prediction is proportional to the rows
        assert!((c.predict(16) - 2.0 * 0.032).abs() < 1e-12);
        for i in 0..200 {
            let rows = 1 + i % 8;
            c.observe(rows, 0.008 + rows as f64 * 0.003);
        }
        let b = c.per_row().unwrap();
        assert!((b - 0.003).abs() < 3e-4, "{b}");
        assert!((c.predict(32) - (0.008 + 32.0 * 0.003)).abs() < 1e-3, "{}", c.predict(32));
        // one-row verifies only (drafting off): the slope stays known
        for _ in 0..5000 {
            c.observe(1, 0.011);
        }
        assert!(c.per_row().is_some_and(|x| (x - b).abs() < 1e-3), "{:?}", c.per_row());
    }

    #[test]
    fn slowed_down_decodes_and_a_slower_machine_do_not_set_the_slope() {
        // one-row plain steps at 30 ms, a row costs 0.1 ms; probes of 2 and 3
        // rows in turn, the first and the fourth slowed down threefold
        let mut c = CostModel::default();
        for _ in 0..4 {
            c.observe(1, 0.030);
        }
        for (i, rows) in [2, 3, 2, 3, 2, 3, 2].into_iter().enumerate() {
            let t = 0.030 + 0.0001 * (rows - 1) as f64;
            c.observe(rows, if i == 0 || i == 3 { 3.0 * t } else { t });
        }
        c.observe(1, 0.030);
        let b = c.per_row().expect("a slope from 8 runs");
        assert!(b < 0.002, "{b}");
        // the machine slows down twice over while rows keep their cost
        // relative to a step: slopes between neighbours follow it (once
        // most of the slopes the quantile spans were taken since)
        let mut c = CostModel::default();
        for i in 0..110 {
            let slow = if i < 30 { 1.0 } else { 2.0 };
            let rows = if i % 5 == 4 { 3 } else { 1 };
            c.observe(rows, slow * (0.010 + 0.002 * rows as f64));
        }
        let b = c.per_row().unwrap();
        assert!((b - 0.004).abs() < 5e-4, "{b}");
    }

    #[test]
    fn two_slopes_price_a_row_only_around_a_wider_batch() {
        // a plain step, a probe, a plain step: the dearer slope is a clean
        // one whichever decode was slowed down
        for slow in [None, Some(0), Some(1), Some(2)] {
            let mut c = CostModel::default();
            for (i, rows) in [4, 6, 4].into_iter().enumerate() {
                let t = 0.030 + 0.001 * rows as f64;
                c.observe(rows, if slow == Some(i) { 3.0 * t } else { t });
            }
            let b = c.dearest_slope().expect("two slopes around the widest run");
            assert!(b >= 0.001 - 1e-12, "slowed {slow:?}: {b}");
        }
        // the middle run the narrowest: slowed down, it lowers both slopes
        let mut c = CostModel::default();
        for (i, rows) in [6, 4, 6].into_iter().enumerate() {
            let t = 0.030 + 0.001 * rows as f64;
            c.observe(rows, if i == 1 { 3.0 * t } else { t });
        }
        assert_eq!(c.dearest_slope(), None);
        c.observe(4, 0.034);
        assert!(c.dearest_slope().is_some_and(|b| b >= 0.001 - 1e-12), "{:?}", c.dearest_slope());
    }

    #[test]
    fn rare_other_row_counts_give_the_slope() {
        // drafting off: one probe of 3 extra rows in 100 plain steps of 4 rows
        let mut c = CostModel::default();
        for i in 0..400 {
            let rows = if i % 100 == 50 { 7 } else { 4 };
            c.observe(rows, 0.010 + rows as f64 * 0.002);
        }
        let b = c.per_row().expect("a slope from 4 probes");
        assert!((b - 0.002).abs() < 1e-6, "{b}");
    }
}
