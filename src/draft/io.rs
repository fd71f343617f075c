//! Names of a draft graph's inputs and outputs: a graph kept between
//! decodes finds them again by name (`GraphCtx::tensor`). Below both the
//! graphs (`graph`, `lattice`) that name them and the drafter that reads them.

pub const FEATURES: &str = "inp_target_features";
pub const TOKENS: &str = "inp_tokens";
pub const POSITIONS: &str = "inp_pos";
pub const CELLS: &str = "inp_kv_cells";
pub const SHIFT: &str = "inp_shift";
pub const LATTICE: &str = "lattice";
/// The hidden states the head reads, and (a head split by tensor) the
/// merge of its slices' candidates.
pub const HEAD_IN: &str = "head_in";
pub const HEAD_MERGE: &str = "head_merge";

/// Logits of slice `j` of a split head.
pub fn head_logits(j: usize) -> String {
    format!("head_logits_{j}")
}

/// Candidate ids of slice `j` (as they leave its device).
pub fn head_part(j: usize) -> String {
    format!("head_part_{j}")
}

/// Slice `j`'s top-k ids (I32) and logits, when the merge is the host's.
pub fn head_part_ids(j: usize) -> String {
    format!("head_part_ids_{j}")
}
pub fn head_part_logits(j: usize) -> String {
    format!("head_part_logits_{j}")
}

/// The selection graph's inputs: each row's merged candidates and logits.
pub const SEL_IDS: &str = "sel_ids";
pub const SEL_LOGITS: &str = "sel_logits";

/// The mask of attention run `run` (windowed layers: `swa`).
pub fn mask(run: usize, swa: bool) -> String {
    format!("inp_kq_mask{}_{run}", if swa { "_swa" } else { "" })
}
