//! The running mean the measurements keep ([`Mean`]).

/// Weight of the newest observation in the running averages.
const DECAY: f64 = 0.05;

/// An exponentially weighted running mean; the first 1 / DECAY observations
/// weigh equally (a mean seeded with its first observation would be that
/// observation for dozens of steps: one slow step on a loaded machine would
/// decide what the first steps measured).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Mean {
    pub(super) value: f64,
    pub(super) seen: bool,
    count: f64,
}

impl Mean {
    pub(super) fn add(&mut self, x: f64) {
        self.count += 1.0;
        self.add_weighted(x, (1.0 / self.count).max(DECAY));
    }

    fn add_weighted(&mut self, x: f64, w: f64) {
        self.value = if self.seen { self.value + w * (x - self.value) } else { x };
        self.seen = true;
    }
}

/// Values the median of recent ones weighs.
const WINDOW: usize = 15;

/// The median of the last `WINDOW` values: a typical value that rare
/// outliers do not move (a step whose host was away: between requests, or
/// while another job had the machine).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RecentMedian {
    pub(super) value: f64,
    recent: [f64; WINDOW],
    count: usize,
}

impl RecentMedian {
    pub(super) fn add(&mut self, x: f64) {
        self.recent[self.count % WINDOW] = x;
        self.count += 1;
        let n = self.count.min(WINDOW);
        let mut sorted = self.recent;
        sorted[..n].sort_by(f64::total_cmp);
        self.value = if n % 2 == 1 { sorted[n / 2] } else { 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rare_outlier_does_not_move_the_recent_median() {
        let mut m = RecentMedian::default();
        for i in 0..40 {
            // every 16th value 200 times the others (a lockstep turn's step)
            m.add(if i % 16 == 15 { 0.2 } else { 0.001 });
        }
        assert!((m.value - 0.001).abs() < 1e-12, "{}", m.value);
        let mut first = RecentMedian::default();
        first.add(0.004);
        first.add(0.002);
        assert!((first.value - 0.003).abs() < 1e-12);
    }
}
