//! The engine's configuration in Rust terms, parsed once from the C params at
//! the boundary: enums instead of int codes, `Option`s instead of sentinels.

use crate::error::{Error, Result};
use crate::params::{
    LLAMA_SPEC_DFLASH2_MAX_NGRAM_BRANCHES, LLAMA_SPEC_DFLASH2_MAX_SEQUENCES, llama_spec_dflash2_params,
};
use crate::sys::ggml_backend_dev_t;
use crate::tree::FirstChild;

/// How the drafted path is chosen from the selector lattice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Walk {
    /// Upstream's greedy chain.
    Greedy,
    /// The greedy chain cut to what pays for its verification (see `adaptive`).
    Adaptive,
}

/// Which graph computes the drafter's forward (the engine builds the drafter
/// it names: `engine::drafter`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DraftGraph {
    /// The library's own (weights, KV cache and graph of its own).
    Own,
    /// libllama's `dflash` graph.
    Libllama,
}

impl DraftGraph {
    pub fn name(self) -> &'static str {
        match self {
            DraftGraph::Own => "own",
            DraftGraph::Libllama => "libllama",
        }
    }
}

/// What happens to rows decoded from embeddings (M-RoPE image rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageRows {
    /// Each row takes its own dense draft position.
    Inject,
    /// The rows never reach the draft KV.
    Skip,
}

/// A checked engine configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Sequences served: ids 0 .. n_seq-1.
    pub n_seq: usize,
    /// Most tokens per draft; None: what the block allows.
    pub n_max: Option<usize>,
    pub n_min: usize,
    /// 0 disables the rule.
    pub p_min: f32,
    /// Noise block width; None: the drafter's trained one.
    pub block_size: Option<usize>,
    pub walk: Walk,
    pub image_rows: ImageRows,
    /// Devices for the drafter; None: the target's.
    pub devices: Option<Vec<ggml_backend_dev_t>>,
    /// Drafter layers to offload; None: all.
    pub n_gpu_layers: Option<u32>,
    /// Draft KV types as ggml type ids; None: F16.
    pub type_k: Option<u32>,
    pub type_v: Option<u32>,
    /// Physical batch of the draft context; None: sized from the blocks.
    pub n_ubatch: Option<u32>,
    /// Threads; None: the target context's.
    pub n_threads: Option<i32>,
    pub n_threads_batch: Option<i32>,
    pub use_extra_bufts: bool,
    /// N-gram branches per tree draft; 0: none.
    pub ngram_branches: usize,
    /// How a sampled tree's parents choose their first child; None: by the
    /// tree's size (`FirstChild::for_tree`).
    pub first_child: Option<FirstChild>,
    /// Whether an unset draft temperature is the engine's choice
    /// (`crate::draft_temperature`) rather than the request's temperature,
    /// and sampled trees grow by calibrated acceptance (`crate::calibration`).
    pub adapt_sampled_drafts: bool,
    /// The graph of the drafter's forward.
    pub draft_graph: DraftGraph,
}

impl Default for Config {
    fn default() -> Self {
        Config::from_c(&llama_spec_dflash2_params::default(), None).expect("the default params are valid")
    }
}

fn ggml_type(name: &str, id: i32) -> Result<Option<u32>> {
    match id {
        -1 => Ok(None),
        t if t >= 0 && dflash2_gguf::ggml_type_from_id(t as u32).is_some() => Ok(Some(t as u32)),
        t => Err(Error::invalid(format!("{name} = {t} is not a ggml type"))),
    }
}

fn threads(id: i32) -> Option<i32> {
    (id > 0).then_some(id)
}

impl Config {
    /// Checks the C params (every field that does not depend on the drafter)
    /// and converts them. `devices` is `params.devices` already read by the
    /// caller (a C pointer list cannot be read here). Errors name the field.
    pub fn from_c(p: &llama_spec_dflash2_params, devices: Option<Vec<ggml_backend_dev_t>>) -> Result<Config> {
        if p.n_seq == 0 || p.n_seq > LLAMA_SPEC_DFLASH2_MAX_SEQUENCES {
            return Err(Error::invalid(format!(
                "n_seq = {} (must be 1..={LLAMA_SPEC_DFLASH2_MAX_SEQUENCES})",
                p.n_seq
            )));
        }
        let n_max = match p.n_max {
            -1 => None,
            n if n > 0 => Some(n as usize),
            n => return Err(Error::invalid(format!("n_max = {n} (must be -1 for the block size, or > 0)"))),
        };
        if p.n_min < 0 {
            return Err(Error::invalid(format!("n_min = {} (must be >= 0)", p.n_min)));
        }
        let n_min = p.n_min as usize;
        if n_max.is_some_and(|n| n_min > n) {
            return Err(Error::invalid(format!("n_min = {} exceeds n_max = {}", p.n_min, p.n_max)));
        }
        if !(p.p_min.is_finite() && (0.0..=1.0).contains(&p.p_min)) {
            return Err(Error::invalid(format!("p_min = {} (must be in [0, 1])", p.p_min)));
        }
        let block_size = match p.block_size {
            0 => None,
            b if b >= 2 => Some(b as usize),
            b => return Err(Error::invalid(format!("block_size = {b} (0 for the trained size, or >= 2)"))),
        };
        let walk = match p.walk {
            0 => Walk::Greedy,
            1 => Walk::Adaptive,
            w => return Err(Error::invalid(format!("walk = {w} is not a walk kind"))),
        };
        let image_rows = match p.image_rows {
            0 => ImageRows::Inject,
            1 => ImageRows::Skip,
            r => return Err(Error::invalid(format!("image_rows = {r} is not an image-row policy"))),
        };
        let n_gpu_layers = match p.n_gpu_layers {
            -1 => None,
            n if n >= 0 => Some(n as u32),
            n => return Err(Error::invalid(format!("n_gpu_layers = {n}"))),
        };
        let ngram_branches = match p.ngram_branches {
            -1 => crate::ngram::DEFAULT_BRANCHES,
            n if (0..=LLAMA_SPEC_DFLASH2_MAX_NGRAM_BRANCHES).contains(&n) => n as usize,
            n => {
                return Err(Error::invalid(format!(
                    "ngram_branches = {n} (-1 for the default, 0 for none, at most \
                     {LLAMA_SPEC_DFLASH2_MAX_NGRAM_BRANCHES})"
                )));
            }
        };
        let first_child = match p.first_child {
            -1 => None,
            0 => Some(FirstChild::Drawn),
            1 => Some(FirstChild::Greedy),
            f => return Err(Error::invalid(format!("first_child = {f} (-1 default, 0 drawn, 1 greedy)"))),
        };
        let adapt_sampled_drafts = match p.adapt_sampled_drafts {
            -1 | 1 => true,
            0 => false,
            t => return Err(Error::invalid(format!("adapt_sampled_drafts = {t} (-1 default = 1 on, 0 off)"))),
        };
        let draft_graph = match p.draft_graph {
            -1 | 0 => DraftGraph::Own,
            1 => DraftGraph::Libllama,
            g => return Err(Error::invalid(format!("draft_graph = {g} (-1 default = 0 own, 1 libllama)"))),
        };
        if p.n_threads < 0 || p.n_threads_batch < 0 {
            return Err(Error::invalid("n_threads and n_threads_batch must be >= 0"));
        }
        Ok(Config {
            n_seq: p.n_seq as usize,
            n_max,
            n_min,
            p_min: p.p_min,
            block_size,
            walk,
            image_rows,
            devices,
            n_gpu_layers,
            type_k: ggml_type("type_k", p.type_k)?,
            type_v: ggml_type("type_v", p.type_v)?,
            n_ubatch: (p.n_ubatch > 0).then_some(p.n_ubatch),
            n_threads: threads(p.n_threads),
            n_threads_batch: threads(p.n_threads_batch),
            use_extra_bufts: p.use_extra_bufts,
            ngram_branches,
            first_child,
            adapt_sampled_drafts,
            draft_graph,
        })
    }
}
