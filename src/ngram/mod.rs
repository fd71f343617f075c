//! N-gram branches: continuations of the sequence's own text proposed as extra
//! branches of a greedy draft tree, verified in the same target batch as the
//! lattice's nodes.
//!
//! Why: where the answer copies or edits text already in the prompt or the
//! answer (renaming a variable, fixing a typo, repeating a list) the drafter
//! is weak, while the text itself is the cheapest draft there is: the tokens
//! that followed the last occurrence of the current suffix. A tree can hold
//! both kinds of guess at once, so nothing is chosen between them: each node
//! competes for the budget by its own estimated acceptance.
//!
//! Each part has its own file:
//! - `history`: the committed tokens of a sequence by target position
//!   ([`TokenHistory`]), kept through rollbacks and shifts;
//! - `propose`: the suffix match that turns a history into branches
//!   ([`propose`], [`Branch`]);
//! - `acceptance`: what the target accepted of the branches, per match length
//!   and step along the branch ([`NgramAcceptance`]).
//!
//! Merging branches into a lattice tree is the tree's job
//! (`crate::tree::merge_branches`).

mod acceptance;
mod history;
mod propose;

pub use acceptance::NgramAcceptance;
pub use history::TokenHistory;
pub use propose::{Branch, propose};

/// Branches per sequence and step when the host does not say.
pub const DEFAULT_BRANCHES: usize = 2;
