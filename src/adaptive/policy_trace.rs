//! The controller's trace (`DFLASH2_TRACE_POLICY` set): every step's plan
//! and what it was decided on, every drafting step's charge, and the curves
//! as learned when the engine goes, to compare with the host's own costs (a
//! cost world's). Read once per process; nothing is printed without it.

use super::AdaptivePolicy;

fn enabled() -> bool {
    static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("DFLASH2_TRACE_POLICY").is_some())
}

impl AdaptivePolicy {
    /// The plan the step for `n` sequences took and what it was decided on.
    pub(super) fn trace_plan(&self, n: usize) {
        if enabled() {
            eprintln!(
                "TRACE plan {:?} n {n} rho {:.1} plain {:.1} loss {:.4} elapsed {:.3} verify(n) {:.4} draft(block) {:.4} p0 {:.2} p1 {:.2} p2 {:.2}",
                self.plan,
                self.step.rho,
                self.plain_rate(n),
                self.loss,
                self.elapsed,
                self.verify.predict(n, 0.0),
                self.draft.predict(self.n_positions + 1, 0.0),
                self.acceptance.p_position(0),
                self.acceptance.p_position(1),
                self.acceptance.p_position(2)
            );
        }
    }

    /// A drafting step's charge: its verify of `rows` rows, and the seconds
    /// of that verify, its draft side, a plain step, its wall and its loss.
    pub(super) fn trace_charge(&self, rows: usize, [verify, draft, plain_step, wall, lost]: [f64; 5]) {
        if enabled() {
            eprintln!(
                "TRACE charged {:?} requests {} tokens {} rows {rows} verify {verify:.4} draft {draft:.4} plain_step {plain_step:.4} wall {wall:.4} lost {lost:.4}",
                self.plan, self.step.requests, self.step.tokens
            );
        }
    }
}

impl Drop for AdaptivePolicy {
    fn drop(&mut self) {
        if enabled() {
            for (name, curve) in [("verify", &self.verify), ("draft", &self.draft), ("inject", &self.flush)] {
                let points: Vec<String> =
                    curve.points().map(|(rows, s, n)| format!("{rows:.0}:{:.2}ms/{n}", s * 1e3)).collect();
                eprintln!("TRACE learned {name} curve (rows:time/observations) {}", points.join(" "));
            }
        }
    }
}
