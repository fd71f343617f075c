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
