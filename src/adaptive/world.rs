//! Simulated hosts for the controller's tests: a target whose verify decode
//! costs what a shipped cost curve (`tools/cost-worlds/`) or a measured CPU
//! line says, a drafter, an acceptance, and a machine's noise.

use std::time::{Duration, Instant};

use super::AdaptivePolicy;

/// Waiting rows a plain step injects at once (the engine's `FLUSH_ROWS`).
const BULK_ROWS: usize = 64;

/// The shipped cost worlds, by name: (rows, relative time of a decode).
pub const SHIPPED: [(&str, &str); 4] = [
    ("flat", include_str!("../../tools/cost-worlds/flat.txt")),
    ("cuda-3090", include_str!("../../tools/cost-worlds/cuda-3090.txt")),
    ("cuda-4090", include_str!("../../tools/cost-worlds/cuda-4090.txt")),
    ("metal-m4pro", include_str!("../../tools/cost-worlds/metal-m4pro.txt")),
];

/// The points of a cost-world file.
pub fn parse_curve(text: &str) -> Vec<(f64, f64)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let mut it = l.split_whitespace().map(|x| x.parse::<f64>().expect("a number"));
            (it.next().expect("rows"), it.next().expect("time"))
        })
        .collect()
}

/// What a verify decode costs.
#[derive(Clone, Debug)]
pub enum TargetCost {
    /// `step` for the plain batch, `per_row` a drafted row more, and `jump`
    /// once a batch has any (a CPU leaving its one-row path)
    Line { step: f64, per_row: f64, jump: f64 },
    /// `one_row` times a curve of (rows, relative time)
    Curve { one_row: f64, points: Vec<(f64, f64)> },
}

impl TargetCost {
    pub fn seconds(&self, n_seqs: usize, rows: usize) -> f64 {
        match self {
            TargetCost::Line { step, per_row, jump } => {
                let extra = rows.saturating_sub(n_seqs);
                step + per_row * extra as f64 + if extra > 0 { *jump } else { 0.0 }
            }
            TargetCost::Curve { one_row, points } => one_row * interpolate(points, rows as f64),
        }
    }
}

fn interpolate(p: &[(f64, f64)], x: f64) -> f64 {
    let i = p.partition_point(|&(r, _)| r < x).clamp(1, p.len() - 1);
    let ((x0, y0), (x1, y1)) = (p[i - 1], p[i]);
    (y0 + (y1 - y0) * (x - x0) / (x1 - x0)).max(p[0].1)
}

#[derive(Clone, Debug)]
pub struct World {
    pub n_seqs: usize,
    pub n_max: usize,
    pub target: TargetCost,
    /// a draft decode of `rows` rows: `draft_fixed` + `draft_row` each
    pub draft_fixed: f64,
    pub draft_row: f64,
    /// an injection of rows into the draft KV: a drafting step's of the rows
    /// that waited for it, a plain step's once `BULK_ROWS` wait, a prompt's
    pub flush: f64,
    /// the first drafting step's injection takes this long (0: `flush`)
    pub first_flush: f64,
    /// each request's prompt rows, injected before its first step (0: none)
    pub prompt: usize,
    /// each drafted token is accepted with this probability while the ones
    /// before it were
    pub p_accept: f64,
    /// this many first drafted tokens are rejected, whatever p_accept
    pub unlucky: usize,
    /// a loaded machine: each decode takes `spike` times longer with
    /// probability `p_spike`, and from step `drift_after` on every decode
    /// takes `drift` times longer
    pub p_spike: f64,
    pub spike: f64,
    pub drift_after: usize,
    pub drift: f64,
    pub seed: u64,
    /// the first step's decodes take this many times longer
    pub first_slowdown: f64,
    /// from this step on, drafted tokens are accepted with this probability
    pub later: Option<(usize, f64)>,
    /// in these steps every drafted token is rejected (an unlucky streak)
    pub streak: std::ops::Range<usize>,
    /// requests of this many tokens each, in waves of `n_seqs` that start
    /// together and end when the last of them does (0: they never end)
    pub wave: usize,
    /// every `away_every`-th step (0: never) the host is away `away` seconds
    /// before the next one (another job's turn): not the run's time
    pub away_every: usize,
    pub away: f64,
}

#[derive(Debug, Default)]
pub struct Run {
    pub seconds: f64,
    pub tokens: usize,
    pub plain: usize,
    /// steps where every sequence drafted, and where one did
    pub all: usize,
    pub one: usize,
    pub drafted: usize,
    pub rows: usize,
}

impl Run {
    pub fn rate(&self) -> f64 {
        self.tokens as f64 / self.seconds
    }
}

impl World {
    /// SmolLM2-135M on two CPU cores with its weak drafter: a draft block of
    /// 8 rows costs as much as 3.5 target steps, a verify row an eighth of one.
    pub fn cpu(n_seqs: usize, p_accept: f64) -> World {
        World {
            n_seqs,
            n_max: 7,
            target: TargetCost::Line { step: 0.008 + 0.002 * n_seqs as f64, per_row: 0.0015, jump: 0.0 },
            draft_fixed: 0.002,
            draft_row: 0.0035,
            flush: 0.0,
            first_flush: 0.0,
            prompt: 0,
            p_accept,
            unlucky: 0,
            p_spike: 0.0,
            spike: 1.0,
            drift_after: usize::MAX,
            drift: 1.0,
            seed: 0,
            first_slowdown: 1.0,
            later: None,
            streak: 0..0,
            wave: 0,
            away_every: 0,
            away: 0.0,
        }
    }

    /// A shipped curve: a one-row target decode of 30 ms, a draft decode of
    /// a block 0.15 of it (mostly fixed: memory-bound as well).
    pub fn shipped(name: &str, n_seqs: usize, p_accept: f64) -> World {
        let text = SHIPPED.iter().find(|(n, _)| *n == name).expect("a shipped world").1;
        let one_row = 0.030;
        World {
            target: TargetCost::Curve { one_row, points: parse_curve(text) },
            draft_fixed: 0.15 * one_row * 0.9,
            draft_row: 0.15 * one_row * 0.1 / 8.0,
            ..World::cpu(n_seqs, p_accept)
        }
    }

    /// Tokens per second of plain steps (each sequence's row injected in a
    /// bulk injection once `BULK_ROWS` wait).
    pub fn plain_rate(&self) -> f64 {
        let n = self.n_seqs;
        n as f64 / (self.target.seconds(n, n) + self.flush * n as f64 / BULK_ROWS as f64)
    }

    /// Tokens per second of every sequence drafting `k` tokens every step.
    pub fn fixed_rate(&self, k: usize) -> f64 {
        let n = self.n_seqs;
        let gain: f64 = (1..=k).map(|m| self.p_accept.powi(m as i32)).sum();
        let seconds =
            self.flush + self.draft_fixed + self.draft_row * (n * (k + 1)) as f64 + self.target.seconds(n, n + n * k);
        n as f64 * (1.0 + gain) / seconds
    }

    /// The best of plain steps and every fixed draft length.
    pub fn best_rate(&self) -> f64 {
        (1..=self.n_max).map(|k| self.fixed_rate(k)).fold(self.plain_rate(), f64::max)
    }

    pub fn run(&self, p: &mut AdaptivePolicy, steps: usize) -> Run {
        let t0 = Instant::now();
        let mut now = 0.0;
        let at = |s: f64| t0 + Duration::from_secs_f64(s);
        let mut rng = 0x2545_f491_4f6c_dd1du64 ^ self.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut uniform = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut run = Run::default();
        let mut away = 0.0;
        // tokens each sequence has left (requests that never end: as good as endless)
        let mut left = vec![if self.wave > 0 { 0 } else { usize::MAX }; self.n_seqs];
        // rows committed and not injected yet, and whether a drafting step injected any
        let (mut waiting, mut injected) = (0, false);
        for step in 0..steps {
            if step == 0 || left.iter().all(|&l| l == 0) {
                if self.wave > 0 {
                    left.fill(self.wave);
                }
                if self.prompt > 0 && self.flush > 0.0 {
                    // before the step's clock: the prompts' injections
                    p.inject_seen(self.prompt, self.flush);
                }
            }
            let active: Vec<usize> = (0..self.n_seqs).filter(|&i| left[i] > 0).collect();
            let n_seqs = active.len();
            let drift = if step >= self.drift_after { self.drift } else { 1.0 };
            let drift = if step == 0 { drift * self.first_slowdown } else { drift };
            let mut load = |x: f64| {
                let spiked = if self.p_spike > 0.0 && uniform() < self.p_spike { self.spike } else { 1.0 };
                x * drift * spiked
            };
            let plan = p.begin_step(at(now), n_seqs);
            let caps: Vec<usize> = (0..n_seqs).map(|i| plan.cap(i, self.n_max)).collect();
            let width = plan.block_rows(caps.iter().copied().max().unwrap_or(0));
            let blocks = caps.iter().filter(|&&c| c > 0).count();
            match blocks {
                0 => run.plain += 1,
                b if b == n_seqs => run.all += 1,
                _ => run.one += 1,
            }
            let mut seconds = 0.0;
            let mut kept = vec![0; n_seqs];
            if (blocks > 0 || waiting >= BULK_ROWS) && self.flush > 0.0 && waiting > 0 {
                let slow_first = blocks > 0 && !injected && self.first_flush > 0.0;
                let f = if slow_first { self.first_flush } else { load(self.flush) };
                p.inject_seen(waiting, f);
                if blocks > 0 {
                    p.flush_seen(waiting, f);
                    injected = true;
                }
                seconds += f;
                waiting = 0;
            }
            if blocks > 0 {
                let rows = blocks * width;
                let d = load(self.draft_fixed + self.draft_row * rows as f64);
                p.draft_decode_seen(rows, d);
                seconds += d;
                for (i, &c) in caps.iter().enumerate() {
                    if c > 0 {
                        kept[i] = p.keep(&vec![0.5; c]);
                    }
                }
            }
            p.draft_done(at(now + seconds));
            let rows = n_seqs + kept.iter().sum::<usize>();
            seconds += load(self.target.seconds(n_seqs, rows));
            p.verify_seen(at(now + seconds), rows);
            run.rows += rows;
            for (&k, &i) in kept.iter().zip(&active) {
                let p_accept = match self.later {
                    Some((from, p)) if step >= from => p,
                    _ => self.p_accept,
                };
                let lucky = run.drafted >= self.unlucky && !self.streak.contains(&step);
                let mut n_acc = 0;
                while lucky && n_acc < k && uniform() < p_accept {
                    n_acc += 1;
                }
                if k > 0 {
                    p.accepted(&vec![0.5; k], n_acc);
                }
                let gained = (1 + n_acc).min(left[i]);
                left[i] -= gained;
                waiting += gained;
                run.tokens += gained;
                run.drafted += k;
            }
            now += seconds;
            if self.away_every > 0 && (step + 1) % self.away_every == 0 {
                now += self.away;
                away += self.away;
            }
        }
        run.seconds = now - away;
        run
    }
}

/// Plan counts of a run, for messages.
pub fn plans(run: &Run) -> String {
    format!("plain {} one {} all {} ({run:?})", run.plain, run.one, run.all)
}
