//! Adaptive draft length: how many drafted tokens are worth verifying, and
//! whether to draft at all.
//!
//! A drafted token at position m pays for itself when the probability that the
//! target reaches and accepts it is at least the rate the host already achieves
//! (tokens per second) times the cost of verifying one more row (seconds): with
//! long-run rate rho and marginal verify cost b, keep token m iff
//! P(tokens 1..m accepted) >= rho * b (renewal-reward). Drafting at all pays when
//! the expected accepted tokens exceed rho times the draft decode plus the extra
//! verify rows. Everything here is measured online: acceptance per draft position
//! and lattice-confidence bin, the host's verify time against the rows it
//! verified, the draft decode time against the rows it decoded, the tokens per
//! second of whole steps.
//!
//! Each part has its own file:
//! - `acceptance`: P(accept) per draft position and confidence bin
//!   ([`AcceptanceModel`]);
//! - `cost`: a time against a row count, the verify and the draft decodes'
//!   ([`CostModel`]);
//! - `mean`: the running mean the measurements keep;
//! - `policy`: what each step does ([`Plan`]), how much of a draft it keeps,
//!   and what learning may cost ([`AdaptivePolicy`]).

mod acceptance;
mod cost;
mod mean;
mod policy;

pub use acceptance::AcceptanceModel;
pub use cost::CostModel;
pub use policy::{AdaptivePolicy, Plan};

/// Plain steps measured before drafting where a draft decode is dear: the
/// yardstick (one probe after the first of them times a draft decode; where
/// it is cheap, that first step is the yardstick).
const ARM_MIN_STEPS: u32 = 4;

/// A time observation counts as this many times what was expected at most.
const SPIKE: f64 = 2.0;
