//! Adaptive drafting: whether to draft, for which sequences, how long, and
//! how much of each draft the target verifies, as one model of tokens per
//! second measured online.
//!
//! Each part has its own file:
//! - `acceptance`: P(accept) per draft position and confidence bin
//!   ([`AcceptanceModel`]);
//! - `curve`: seconds against a row count, of any shape ([`StepCurve`]):
//!   the host's verify decodes and the draft decodes;
//! - `mean`: the running mean the measurements keep;
//! - `policy`: the plan of each step and the cut of each draft, the most
//!   expected tokens per second under a Thompson draw, with one safety rail
//!   ([`AdaptivePolicy`], [`Plan`]);
//! - `world` (tests): simulated hosts on the shipped cost curves.

mod acceptance;
mod curve;
mod mean;
mod policy;
#[cfg(test)]
mod world;

pub use acceptance::AcceptanceModel;
pub use curve::StepCurve;
pub use policy::{AdaptivePolicy, Plan};
