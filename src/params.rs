//! The engine's configuration as C sees it, with its defaults. `Config::from_c`
//! checks and converts it.

use crate::sys::ggml_backend_dev_t;

/// How the drafted path is chosen from the selector lattice.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum llama_spec_dflash2_walk {
    /// Greedy chain, exactly as upstream: at each position the best successor of
    /// the previous pick (first maximum on ties).
    LLAMA_SPEC_DFLASH2_WALK_GREEDY = 0,
    /// The greedy chain, then as many of its tokens as pay for their
    /// verification, as one model measured online: the host's verify time
    /// against the batch's total rows and the engine's draft decode time against
    /// its rows, each a curve of any shape (flat, linear, in steps), and the
    /// acceptance per draft position and lattice confidence. Each draft call
    /// takes the plan with the most expected tokens per second under a draw
    /// from those posteriors (Thompson sampling): no draft, one sequence in turn
    /// drafting, or every requesting sequence drafting, at a draft length; each
    /// draft then keeps the tokens whose expected acceptance pays for their
    /// rows along the cost curve at that rate. A plan is only taken while what
    /// it loses at worst against not drafting keeps the measured loss within 1%
    /// of the time measured (plus one plain step). Drafts may differ from
    /// upstream's; outputs stay lossless.
    LLAMA_SPEC_DFLASH2_WALK_ADAPTIVE = 1,
}

/// What the engine does with M-RoPE image rows (many rows pinned to one position).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum llama_spec_dflash2_image_rows {
    /// Inject each image row at its own dense draft position (the draft sees the image).
    LLAMA_SPEC_DFLASH2_IMAGE_ROWS_INJECT = 0,
    /// Leave image rows out of the draft KV (the draft skips the image).
    LLAMA_SPEC_DFLASH2_IMAGE_ROWS_SKIP = 1,
}

/// How each parent of a sampled tree (temperature > 0) chooses its first child.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum llama_spec_dflash2_first_child {
    /// Drawn from the draft distribution q like its siblings.
    LLAMA_SPEC_DFLASH2_FIRST_CHILD_DRAWN = 0,
    /// q's most probable token, taken without a draw: verified as a point mass
    /// (accepted with the target's probability of it, as sample-and-match
    /// accepts a greedy draft), its siblings drawn from q without it. Lossless
    /// like the drawn rule.
    LLAMA_SPEC_DFLASH2_FIRST_CHILD_GREEDY = 1,
}

/// Which graph computes the drafter's forward pass.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum llama_spec_dflash2_draft_graph {
    /// The library's own: it loads the drafter's weights into backend buffers
    /// on the drafter's devices, keeps its own draft KV cache and builds the
    /// drafter's graph (the selector's top-k included) through the linked
    /// ggml. Drafters it does not cover (YaRN rope scaling, a quantized draft
    /// KV type, a libllama that hides the target's tensors) fall back to
    /// libllama's graph, with one log line saying why.
    LLAMA_SPEC_DFLASH2_DRAFT_GRAPH_OWN = 0,
    /// libllama's `dflash` graph on a draft context libllama creates.
    /// DFlash2 drafters only (plain DFlash drafters need the own graph).
    LLAMA_SPEC_DFLASH2_DRAFT_GRAPH_LIBLLAMA = 1,
}

/// Configuration of a DFlash2 engine. Get it from
/// `llama_spec_dflash2_default_params()`, change fields, pass it by value.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct llama_spec_dflash2_params {
    /// Target sequences the engine serves: sequence ids 0 .. n_seq-1 (default 1).
    pub n_seq: u32,
    /// Most tokens drafted per step. -1 (default) = block_size-1; a larger value
    /// is clamped to block_size-1 with a logged warning. Never more than
    /// LLAMA_SPEC_DFLASH2_MAX_DRAFT.
    pub n_max: i32,
    /// A draft shorter than this is dropped (the step drafts nothing). Default 0.
    pub n_min: i32,
    /// Stop the walk before a token whose lattice softmax (over the top-k scores
    /// at that position) is below p_min; 0 disables. Same semantics as upstream
    /// DFlash2, so not comparable with a vocabulary probability. Default 0.
    pub p_min: f32,
    /// Noise block size (anchor + masks). 0 (default) = the drafter's trained
    /// block size; smaller is allowed, larger is an error.
    pub block_size: i32,
    /// Lattice walk, an `enum llama_spec_dflash2_walk` value (default greedy).
    /// Plain int32_t so that an out-of-range value from C is an error, not UB.
    pub walk: i32,
    /// M-RoPE image rows, an `enum llama_spec_dflash2_image_rows` value:
    /// inject at dense positions (default) or skip.
    pub image_rows: i32,
    /// NULL-terminated list of devices for the drafter (ggml devices, else
    /// _INVALID_ARGUMENT; CPU devices are ignored, an empty list = the CPU only).
    /// NULL (default) = the device that holds the target's output head (the CPU
    /// when the head stays in host memory). A drafter without its own head must
    /// be given the head's device when the head is on one; a target split by
    /// tensor (-sm tensor) cannot serve such a drafter (_UNSUPPORTED). Init
    /// refuses with _OUT_OF_MEMORY when the chosen devices report less free
    /// memory than llama_spec_dflash2_estimate_memory.
    pub devices: *mut ggml_backend_dev_t,
    /// Drafter layers to offload, as llama_model_params.n_gpu_layers (-1 = all,
    /// default; other negative values are _INVALID_ARGUMENT).
    pub n_gpu_layers: i32,
    /// Draft KV cache types as `enum ggml_type` values; -1 (default) = F16.
    pub type_k: i32,
    pub type_v: i32,
    /// Physical batch of the draft context. 0 (default) = large enough for one
    /// block of every sequence and for prompt injection.
    pub n_ubatch: u32,
    /// Draft threads; 0 (default) = the target context's.
    pub n_threads: i32,
    pub n_threads_batch: i32,
    /// Weight repacking (extra buffer types) for the drafter. Off by default:
    /// ggml's AMX repack path segfaults on some CPUs.
    pub use_extra_bufts: bool,
    /// N-gram branches: at most this many continuations of the sequence's own
    /// text (where its current suffix occurred before in the prompt or the
    /// answer) join each tree draft as extra branches, verified in the same
    /// batch and priced by their measured acceptance (in a sampled tree as
    /// children taken without a draw). -1 (default) = 2; 0 = none; at most
    /// LLAMA_SPEC_DFLASH2_MAX_NGRAM_BRANCHES. Where no occurrence matches
    /// more than the anchor (new text: an edit such as a fixed typo), up to
    /// 3 more (not 0) resume after an earlier occurrence of the text before
    /// the anchor, past 0, 1 or 2 of its tokens. The engine learns the prompt's
    /// text from llama_spec_dflash2_process_tokens or process_batch (the
    /// generated text from its own drafts); chains have none.
    pub ngram_branches: i32,
    /// How a sampled tree's parents choose their first child, an `enum
    /// llama_spec_dflash2_first_child` value; -1 (default) = greedy in trees
    /// of more than 15 nodes (whose q is not cut: `top_k` of the tree
    /// request), drawn in smaller ones.
    pub first_child: i32,
    /// Whether sampled drafts (temperature > 0) adapt to what this engine
    /// measured: -1 (default) or 1 = yes, 0 = no. Adapting: (1) a request that
    /// leaves draft_temperature unset (<= 0) gets the engine's choice, per
    /// request temperature and draft shape (a chain, or a tree by its node
    /// budget), from how well each candidate temperature's q would have
    /// overlapped the target's distributions verified so far (the request's
    /// temperature until it has seen enough); (2) sampled trees grow by each
    /// child's acceptance calibrated on the children this engine's sampled
    /// verification tested (per depth and sibling index). Lossless either way;
    /// but adapting, the draws of a request depend on what the engine verified
    /// before, so a seed reproduces its output only with 0 (and the greedy
    /// walk, whose draft lengths do not depend on timings).
    pub adapt_sampled_drafts: i32,
    /// The graph of the drafter's forward, an `enum
    /// llama_spec_dflash2_draft_graph` value; -1 (default) = own. The two
    /// compute the same ops in the same order: on one backend their drafts
    /// are identical.
    pub draft_graph: i32,
}

impl Default for llama_spec_dflash2_params {
    fn default() -> Self {
        llama_spec_dflash2_params {
            n_seq: 1,
            n_max: -1,
            n_min: 0,
            p_min: 0.0,
            block_size: 0,
            walk: llama_spec_dflash2_walk::LLAMA_SPEC_DFLASH2_WALK_GREEDY as i32,
            image_rows: llama_spec_dflash2_image_rows::LLAMA_SPEC_DFLASH2_IMAGE_ROWS_INJECT as i32,
            devices: std::ptr::null_mut(),
            n_gpu_layers: -1,
            type_k: -1,
            type_v: -1,
            n_ubatch: 0,
            n_threads: 0,
            n_threads_batch: 0,
            use_extra_bufts: false,
            ngram_branches: -1,
            first_child: -1,
            adapt_sampled_drafts: -1,
            draft_graph: -1,
        }
    }
}

/// Rows per target ubatch (the host's `n_ubatch`) at which a verify batch on a
/// CPU target with an f16 or f32 KV cache stays on the attention kernel that
/// decodes one token: ggml's CPU flash attention tiles 64 query rows and more,
/// and the tiled kernel rounds near-ties otherwise than target-only decoding
/// (T = 0 outputs then leave target-only's at 64+ verify rows). A host keeps
/// them identical on such targets with ubatches of at most this many rows (the
/// tools' default), or with verify batches (every sequence's draft and anchor)
/// of at most this many rows (llama-server's, whose prompts then decode as
/// without a drafter). GPU backends pick their kernels by batch size too; no
/// ubatch keeps them bit-identical.
pub const LLAMA_SPEC_DFLASH2_CPU_IDENTICAL_N_UBATCH: u32 = 63;

/// Most n-gram branches per tree draft (params.ngram_branches).
pub const LLAMA_SPEC_DFLASH2_MAX_NGRAM_BRANCHES: i32 = 16;

/// Most sequences one engine serves (n_seq); libllama's own limit is 256.
pub const LLAMA_SPEC_DFLASH2_MAX_SEQUENCES: u32 = 256;

/// Most tokens one draft ever has: an engine's n_max (params.n_max, the block
/// size less one, `llama_spec_dflash2_n_max()`) never exceeds it, and the
/// statistics track acceptance at this many draft positions. A host's verify
/// batch needs n_max + 1 rows per sequence (the anchor, then the draft).
pub const LLAMA_SPEC_DFLASH2_MAX_DRAFT: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, ImageRows, Walk};

    #[test]
    fn defaults_are_valid() {
        let c = Config::from_c(&llama_spec_dflash2_params::default(), None).unwrap();
        assert_eq!((c.n_max, c.block_size, c.type_k, c.n_threads), (None, None, None, None));
        assert_eq!((c.walk, c.image_rows), (Walk::Greedy, ImageRows::Inject));
    }

    #[test]
    fn out_of_range_fields_are_rejected_with_their_name() {
        type Mutation = fn(&mut llama_spec_dflash2_params);
        let cases: Vec<(Mutation, &str)> = vec![
            (|p| p.n_seq = 0, "n_seq"),
            (|p| p.n_seq = 100_000, "n_seq"),
            (|p| p.n_max = 0, "n_max"),
            (|p| p.n_max = -5, "n_max"),
            (|p| p.n_min = -1, "n_min"),
            (
                |p| {
                    p.n_max = 2;
                    p.n_min = 3
                },
                "n_min",
            ),
            (|p| p.p_min = f32::NAN, "p_min"),
            (|p| p.p_min = 1.5, "p_min"),
            (|p| p.block_size = 1, "block_size"),
            (|p| p.block_size = -3, "block_size"),
            (|p| p.type_k = 4, "type_k"),
            (|p| p.type_v = 999, "type_v"),
            (|p| p.n_threads = -2, "n_threads"),
            (|p| p.walk = 3, "walk"),
            (|p| p.image_rows = -1, "image_rows"),
            (|p| p.ngram_branches = -2, "ngram_branches"),
            (|p| p.ngram_branches = 17, "ngram_branches"),
            (|p| p.first_child = 2, "first_child"),
            (|p| p.first_child = -2, "first_child"),
            (|p| p.adapt_sampled_drafts = 2, "adapt_sampled_drafts"),
            (|p| p.adapt_sampled_drafts = -2, "adapt_sampled_drafts"),
            (|p| p.draft_graph = 2, "draft_graph"),
            (|p| p.draft_graph = -2, "draft_graph"),
        ];
        for (mutate, field) in cases {
            let mut p = llama_spec_dflash2_params::default();
            mutate(&mut p);
            let err = Config::from_c(&p, None).unwrap_err();
            assert!(err.message.contains(field), "{field}: {}", err.message);
        }
    }
}
