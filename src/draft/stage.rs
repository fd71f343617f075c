//! A scheduler and the graph it last ran, kept for the next decode of the
//! same shape: between steps a noise decode differs only in its inputs
//! (positions, cells, masks), an injection of as many rows likewise, so the
//! graph is neither built nor allocated again. Injections and noise decodes
//! alternate every step, so each has its own scheduler (and compute buffers).

use crate::error::Result;
use crate::sys::ggml::{GraphCtx, Sched};

/// A scheduler with its kept graph.
pub struct Stage {
    sched: Sched,
    /// The shape key and graph of the last allocated graph.
    kept: Option<(Vec<i64>, GraphCtx)>,
    /// A new graph was built since `take_rebuilt` last looked.
    rebuilt: bool,
}

impl Stage {
    pub fn new(sched: Sched) -> Stage {
        Stage { sched, kept: None, rebuilt: false }
    }

    pub fn sched(&self) -> &Sched {
        &self.sched
    }

    pub fn sched_mut(&mut self) -> &mut Sched {
        self.kept = None;
        &mut self.sched
    }

    /// The allocated graph for `key`: the kept one when the key matches, else
    /// a new one `build` fills (in a context of `capacity` tensors), allocated.
    pub fn graph(&mut self, key: Vec<i64>, capacity: usize, build: impl FnOnce(&GraphCtx)) -> Result<&GraphCtx> {
        if self.kept.as_ref().is_none_or(|(k, _)| *k != key) {
            self.kept = None;
            let g = GraphCtx::new(capacity)?;
            build(&g);
            self.sched.alloc(&g)?;
            self.kept = Some((key, g));
            self.rebuilt = true;
        }
        Ok(&self.kept.as_ref().expect("kept above").1)
    }

    /// Whether `graph` built (and allocated) a new graph since the last call
    /// of this: what was derived from the kept graph's shape is stale.
    pub fn take_rebuilt(&mut self) -> bool {
        std::mem::take(&mut self.rebuilt)
    }

    /// The kept graph (after `graph`).
    pub fn graph_kept(&self) -> Result<&GraphCtx> {
        self.kept.as_ref().map(|(_, g)| g).ok_or_else(|| crate::error::Error::internal("no draft graph kept"))
    }

    /// Computes the kept graph (its inputs written) with `n_threads` threads.
    pub fn compute(&mut self, n_threads: i32) -> Result<()> {
        let (_, g) = self.kept.as_ref().expect("compute after graph()");
        for b in self.sched.backends() {
            b.set_threads(n_threads);
        }
        let result = self.sched.compute(g);
        if result.is_err() {
            // a failed graph is not trusted again
            self.kept = None;
        }
        result
    }
}
