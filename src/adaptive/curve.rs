//! Seconds against a row count, learned online as a curve of any shape
//! ([`StepCurve`]): flat (a big target on a GPU), linear (a CPU), or in steps
//! (a kernel switching at a batch size).

use super::mean::Mean;

/// Row counts up to this one each have their own bin; above it, bins are a
/// quarter of an octave wide.
const EXACT_ROWS: usize = 16;

/// An observation counts as this many times its prediction at most once the
/// curve has seen `SETTLE` observations (a decode slowed down by a busy core
/// must not make rows look dear for long).
const SPIKE: f64 = 2.0;
const SETTLE: u32 = 4;

/// How far one observation moves the machine's load factor.
const LOAD_STEP: f64 = 0.2;

/// A bin's first observations whose median is its value (one slowed-down
/// first decode must not price a row count for dozens of steps).
const EARLY: usize = 5;

#[derive(Clone, Copy, Debug, Default)]
struct Bin {
    key: usize,
    rows: Mean,
    /// seconds over the load factor at the time: the median of the first
    /// `EARLY`, then a running mean from it
    early: [f64; EARLY],
    shape: Mean,
    n: u32,
}

impl Bin {
    fn add(&mut self, shape: f64) {
        let n = self.n as usize;
        if n < EARLY {
            self.early[n] = shape;
            let mut sorted = self.early;
            sorted[..=n].sort_by(f64::total_cmp);
            self.shape = Mean::default();
            self.shape.add(if n % 2 == 0 { sorted[n / 2] } else { 0.5 * (sorted[n / 2] + sorted[n / 2 + 1]) });
        } else {
            self.shape.add(shape);
        }
        self.n += 1;
    }
}

/// A time against a row count, as a common load factor times a curve of
/// bins. The load factor follows every observation of a bin seen before, so
/// that a machine that slows down (or speeds up) moves the whole curve, not
/// only the bins the current steps happen to use; the bins keep the shape.
/// Predictions interpolate linearly between the bins seen, made monotone
/// (more rows never cost less), and are uncertain past the widest bin seen:
/// anywhere from flat to proportional to the rows (`predict`'s `draw`).
#[derive(Clone, Debug)]
pub struct StepCurve {
    bins: Vec<Bin>,
    load: f64,
    n: u32,
    /// the bins' (rows, shape) made monotone, by rows, with their counts
    points: Vec<(f64, f64, u32)>,
}

impl Default for StepCurve {
    fn default() -> Self {
        StepCurve { bins: Vec::new(), load: 1.0, n: 0, points: Vec::new() }
    }
}

fn bin_key(rows: usize) -> usize {
    if rows <= EXACT_ROWS { rows } else { EXACT_ROWS + 1 + (4.0 * (rows as f64 / EXACT_ROWS as f64).log2()) as usize }
}

impl StepCurve {
    pub fn seen(&self) -> bool {
        self.n > 0
    }

    /// The bins as learned: (rows, seconds at the current load, observations).
    pub fn points(&self) -> impl Iterator<Item = (f64, f64, u32)> + '_ {
        self.points.iter().map(|&(x, y, n)| (x, self.load * y, n))
    }

    /// Whether a decode of about these rows was observed.
    pub fn seen_rows(&self, rows: usize) -> bool {
        self.bins.iter().any(|b| b.key == bin_key(rows))
    }

    pub fn observe(&mut self, rows: usize, seconds: f64) {
        let rows = rows.max(1);
        if !(seconds.is_finite() && seconds > 0.0) {
            return;
        }
        let mut seconds = if self.n >= SETTLE { seconds.min(SPIKE * self.predict(rows, 1.0)) } else { seconds };
        if self.points.last().is_some_and(|p| rows as f64 > p.0) {
            // a batch costs at most what its parts cost apart
            seconds = seconds.min(self.predict(rows, 1.0));
        }
        let key = bin_key(rows);
        if let Some(wider) = self.points.get(self.bins.partition_point(|b| b.key <= key)) {
            // fewer rows never cost more: a first observation far above a
            // wider batch's time is the machine, not the rows
            seconds = seconds.min(SPIKE * self.load * wider.1);
        }
        let at = self.bins.partition_point(|b| b.key < key);
        if self.bins.get(at).is_none_or(|b| b.key != key) {
            self.bins.insert(at, Bin { key, ..Bin::default() });
        }
        let bin = &mut self.bins[at];
        if bin.n >= SETTLE {
            let ratio = seconds / (self.load * bin.shape.value);
            self.load *= 1.0 + LOAD_STEP * (ratio.clamp(1.0 / SPIKE, SPIKE) - 1.0);
        }
        bin.rows.add(rows as f64);
        bin.add(seconds / self.load);
        self.n += 1;
        self.points = monotone(&self.bins);
    }

    /// The seconds of a decode of `rows` rows, under a draw in [0, 1] from
    /// the curve's posterior (1: its dearest, for the worst case). Past the
    /// widest bin seen, anywhere from flat (0: a kernel whose rows are free
    /// from there on) to time in proportion to the rows (1: a batch costs at
    /// most what its parts cost apart). A bin of fewer than `EARLY`
    /// observations may be as cheap as the bin before it (0) or cost what
    /// it was seen at (1): one slowed-down decode of a row count does not
    /// keep it dear for good. Below the narrowest bin seen, anywhere from
    /// time in proportion to the rows (0: the cheapest a smaller batch may
    /// be, so a plain step for fewer sequences than seen is priced low and
    /// tried before drafting is judged against it) to that bin's (1). 0
    /// before anything was seen.
    pub fn predict(&self, rows: usize, draw: f64) -> f64 {
        let (x, draw) = (rows as f64, draw.clamp(0.0, 1.0));
        let p = &self.points;
        let Some(&(x_last, _, _)) = p.last() else { return 0.0 };
        let y = if x <= p[0].0 {
            self.drawn(0, draw) * (1.0 - (1.0 - draw) * (1.0 - x / p[0].0))
        } else if x <= x_last {
            let i = p.partition_point(|&(r, _, _)| r < x);
            let ((x0, y0), (x1, y1)) = ((p[i - 1].0, self.drawn(i - 1, draw)), (p[i].0, self.drawn(i, draw)));
            y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        } else {
            self.drawn(p.len() - 1, draw) * (1.0 + draw * (x / x_last - 1.0))
        };
        self.load * y
    }

    /// Point `i`'s value under the draw (see `predict`).
    fn drawn(&self, i: usize, draw: f64) -> f64 {
        let (_, y, n) = self.points[i];
        let lower = if i == 0 { y } else { self.points[i - 1].1 };
        let unsure = EARLY.saturating_sub(n as usize) as f64 / EARLY as f64;
        lower + (y - lower) * (1.0 - (1.0 - draw) * unsure)
    }
}

/// Pool-adjacent-violators over the bins by rows, weighted by their counts:
/// the closest curve that never falls as rows grow.
fn monotone(bins: &[Bin]) -> Vec<(f64, f64, u32)> {
    // (rows, shape, weight) blocks; pooled blocks keep their first rows
    let mut blocks: Vec<(f64, f64, f64)> = Vec::with_capacity(bins.len());
    for b in bins {
        blocks.push((b.rows.value, b.shape.value, b.n as f64));
        while blocks.len() >= 2 && blocks[blocks.len() - 2].1 > blocks[blocks.len() - 1].1 {
            let (x1, y1, w1) = blocks.pop().unwrap_or_default();
            let last = blocks.last_mut().expect("two blocks");
            let w = last.2 + w1;
            *last = (last.0.min(x1), (last.1 * last.2 + y1 * w1) / w, w);
        }
    }
    // a pooled block spans its bins' rows: expand it back to one point per bin
    let mut points = Vec::with_capacity(bins.len());
    let mut j = 0;
    for b in bins {
        while j + 1 < blocks.len() && blocks[j + 1].0 <= b.rows.value {
            j += 1;
        }
        points.push((b.rows.value, blocks[j].1, b.n));
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    fn learned(curve: impl Fn(usize) -> f64, rows: &[usize], reps: usize) -> StepCurve {
        let mut c = StepCurve::default();
        for _ in 0..reps {
            for &r in rows {
                c.observe(r, curve(r));
            }
        }
        c
    }

    #[test]
    fn a_curve_with_a_step_is_learned_as_a_step() {
        // flat to 8 rows, a jump at 9, flat to 16, then linear
        let truth = |r: usize| match r {
            0..=8 => 0.010,
            9..=16 => 0.0155,
            _ => 0.0155 + 0.0005 * (r - 16) as f64,
        };
        let c = learned(truth, &[1, 4, 8, 9, 12, 16, 32, 64], 20);
        for r in [1, 4, 8, 9, 12, 16, 32, 64] {
            assert!((c.predict(r, 0.0) - truth(r)).abs() < 1e-9, "{r}: {}", c.predict(r, 0.0));
        }
        // between bins: interpolated; past the widest: from flat to proportional
        assert!((c.predict(48, 0.0) - truth(48)).abs() < 1e-3);
        assert!((c.predict(128, 0.0) - truth(64)).abs() < 1e-9);
        assert!((c.predict(128, 1.0) - 2.0 * truth(64)).abs() < 1e-9);
        assert!((c.predict(96, 0.5) - 1.25 * truth(64)).abs() < 1e-9);
    }

    #[test]
    fn noise_that_makes_more_rows_look_cheaper_is_pooled() {
        let mut c = StepCurve::default();
        for (r, t) in [(1, 0.010), (2, 0.012), (3, 0.011), (4, 0.013)] {
            c.observe(r, t);
        }
        let at = |r| c.predict(r, 1.0);
        assert!(at(1) <= at(2) && at(2) <= at(3) && at(3) <= at(4), "{} {} {} {}", at(1), at(2), at(3), at(4));
        assert!((at(2) - 0.0115).abs() < 1e-9 && (at(3) - 0.0115).abs() < 1e-9);
    }

    #[test]
    fn a_slower_machine_moves_the_whole_curve_and_a_spike_little() {
        let mut c = learned(|r| 0.010 + 0.001 * r as f64, &[1, 8], 20);
        // only 8-row decodes from now on, twice as slow
        for _ in 0..40 {
            c.observe(8, 2.0 * 0.018);
        }
        let one = c.predict(1, 0.0);
        assert!(one > 1.6 * 0.011 && one < 2.1 * 0.011, "{one}");
        // one decode ten times slower moves it little, and not for long
        let before = c.predict(1, 0.0);
        c.observe(1, 10.0 * before);
        assert!(c.predict(1, 0.0) < 1.3 * before, "{} {}", c.predict(1, 0.0), before);
        for _ in 0..5 {
            c.observe(1, before);
        }
        assert!(c.predict(1, 0.0) < 1.1 * before, "{} {}", c.predict(1, 0.0), before);
        // a slowed-down first decode of a row count does not price it
        let mut c = StepCurve::default();
        for t in [0.090, 0.030, 0.030] {
            c.observe(1, t);
        }
        assert!((c.predict(1, 0.0) - 0.030).abs() < 1e-12);
        // nor one far above a wider batch's time: fewer rows never cost more
        let mut c = StepCurve::default();
        c.observe(64, 0.002);
        c.observe(4, 0.120);
        assert!(c.predict(4, 1.0) <= SPIKE * 0.002 && c.predict(64, 1.0) <= SPIKE * 0.002, "{}", c.predict(4, 1.0));
    }

    #[test]
    fn fewer_rows_than_seen_are_priced_from_proportional_to_flat() {
        // only 4-row decodes seen (four sequences): a plain step for one
        // sequence may cost as little as a quarter of one, at most all of it
        let c = learned(|_| 0.100, &[4], 10);
        assert!((c.predict(1, 0.0) - 0.025).abs() < 1e-12, "{}", c.predict(1, 0.0));
        assert!((c.predict(1, 1.0) - 0.100).abs() < 1e-12);
        assert!((c.predict(2, 0.5) - 0.075).abs() < 1e-12);
        assert!((c.predict(4, 0.0) - 0.100).abs() < 1e-12);
    }
}
