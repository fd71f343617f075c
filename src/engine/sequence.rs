//! One target sequence as the engine tracks it: the rows in the draft KV, the
//! committed rows waiting for injection, and the rows of an outstanding verify
//! batch held until the host says how many were accepted.

use super::row_queue::RowQueue;
use super::sampled::{SampledDraft, SeqRng};
use super::tree_sampled::SampledTreeDraft;
use crate::draft_temperature::Tuning;
use crate::ngram::TokenHistory;
use crate::positions::{KvEdit, SeqMap, TargetRange};
use crate::tree::Tree;

/// The last draft handed to the host, not yet accepted.
#[derive(Clone, Debug, Default)]
pub struct Outstanding {
    pub tokens: Vec<i32>,
    /// Lattice softmax of each token (the adaptive walk learns from them).
    pub confidences: Vec<f32>,
    /// Target position of the newest committed row when the draft was made:
    /// the verify rows (anchor first) come after it.
    pub after_target: Option<i32>,
    /// A sampled draft's q and verification progress (None: greedy).
    pub sampled: Option<SampledDraft>,
    /// A tree draft (`tree_step`): `tokens` are its nodes' in tree order, its
    /// verify rows the anchor's then one per node in that order, and only
    /// accept_tree() settles it.
    pub tree: Option<Tree>,
    /// A sampled tree's q and verification progress (None: a greedy tree or a
    /// chain); its tree is `tree`'s.
    pub sampled_tree: Option<SampledTreeDraft>,
    /// A sampled draft whose draft temperature the engine chose: its
    /// verification scores the other candidate temperatures.
    pub tuning: Option<Tuning>,
}

pub struct Sequence {
    pub map: SeqMap,
    /// Committed rows not yet in the draft KV.
    pub queued: RowQueue,
    /// Verify rows of the outstanding draft.
    pub held: RowQueue,
    pub outstanding: Option<Outstanding>,
    /// The generators of sampled drafts, from the first one on; dropped when
    /// the sequence is emptied (`sampled`).
    pub rng: Option<SeqRng>,
    /// The committed tokens, for n-gram branches.
    pub history: TokenHistory,
}

impl Sequence {
    pub fn new(n_feat: usize) -> Sequence {
        Sequence {
            map: SeqMap::default(),
            queued: RowQueue::new(n_feat),
            held: RowQueue::new(n_feat),
            outstanding: None,
            rng: None,
            history: TokenHistory::default(),
        }
    }

    /// Rows arriving now belong to a verify batch (held), not to the sequence yet.
    pub fn holds_rows(&self) -> bool {
        self.outstanding.as_ref().is_some_and(|o| !o.tokens.is_empty())
    }

    /// Verify rows the outstanding draft has room for (anchor + its tokens).
    pub fn verify_rows(&self) -> usize {
        self.outstanding.as_ref().map_or(0, |o| if o.tokens.is_empty() { 0 } else { o.tokens.len() + 1 })
    }

    /// The outstanding draft's tree, if it is one.
    pub fn tree(&self) -> Option<&Tree> {
        self.outstanding.as_ref().and_then(|o| o.tree.as_ref())
    }

    /// Rows arriving now are verify rows of a tree (of one node or more).
    pub fn holds_tree(&self) -> bool {
        self.holds_rows() && self.tree().is_some()
    }

    /// Target position of the newest committed row.
    pub fn last_target_pos(&self) -> Option<i32> {
        self.queued.last_target().or(self.map.last_target_pos())
    }

    /// Target position of the newest row the engine holds, committed or held.
    pub fn last_seen_pos(&self) -> Option<i32> {
        self.held.last_target().or(self.last_target_pos())
    }

    /// Takes a row the target decoded: held while a draft awaits accept(),
    /// else committed. (A held row's token is known: the anchor's or the
    /// draft's; `token` is the host's word for a committed one.)
    pub fn take_row(&mut self, target: i32, features: &[f32], token: Option<i32>) {
        if self.holds_rows() {
            self.held.push(target, features);
        } else {
            self.queued.push(target, features);
            self.history.commit(target, token);
        }
    }

    /// The token of held row `i`: the anchor's (the request's id_last), then
    /// the outstanding draft's, in row order.
    fn held_token(&self, i: usize) -> Option<i32> {
        match i {
            0 => self.history.anchor(),
            _ => self.outstanding.as_ref().and_then(|o| o.tokens.get(i - 1).copied()),
        }
    }

    /// Commits the held rows at indices `rows` (ascending) to the history.
    fn commit_history(&mut self, rows: impl Iterator<Item = usize>) {
        for i in rows {
            let token = self.held_token(i);
            self.history.commit(self.held.targets()[i], token);
        }
    }

    /// Commits the first `n` held rows, drops the rest and closes the draft;
    /// returns how many rows were dropped.
    pub fn resolve_held(&mut self, n: usize) -> usize {
        let n = n.min(self.held.len());
        self.commit_history(0..n);
        self.queued.extend_from(&self.held, n);
        let dropped = self.held.len() - n;
        self.held.clear();
        self.outstanding = None;
        dropped
    }

    /// Commits the held rows at indices `rows` (ascending: a tree's anchor row
    /// and its accepted path), drops the others and closes the draft; returns
    /// how many rows were dropped.
    pub fn resolve_held_rows(&mut self, rows: &[usize]) -> usize {
        let kept: Vec<usize> = rows.iter().copied().filter(|&i| i < self.held.len()).collect();
        self.commit_history(kept.iter().copied());
        for &i in &kept {
            self.queued.push(self.held.targets()[i], self.held.row(i));
        }
        let dropped = self.held.len() - kept.len();
        self.held.clear();
        self.outstanding = None;
        dropped
    }

    /// The first `n` queued rows went into the draft KV.
    pub fn injected(&mut self, n: usize) {
        self.map.inject(&self.queued.targets()[..n]);
        self.queued.drop_front(n);
    }

    /// Forgets the rows at target positions in `range`; returns the draft KV
    /// edits to apply. Removing every position from the outstanding draft's
    /// anchor on cancels that draft: none of its verify rows can remain.
    pub fn remove(&mut self, range: TargetRange, can_shift: bool) -> Vec<KvEdit> {
        // a tree's held rows are its nodes by index: losing any of them loses the tree
        let breaks_tree = self.tree().is_some() && self.held.targets().iter().any(|&t| range.contains(t));
        let edits = self.map.remove(range, can_shift);
        self.history.remove(range);
        self.queued.remove(range);
        self.held.remove(range);
        let anchor = self.outstanding.as_ref().map(|o| o.after_target.map_or(0, |t| t.saturating_add(1)));
        if breaks_tree || anchor.is_some_and(|a| range.p0 <= a && range.p1 == i32::MAX) {
            self.held.clear();
            self.outstanding = None;
        }
        // an emptied sequence starts over: its next sampled draft reseeds
        if self.outstanding.is_none() && self.map.in_kv().is_empty() && self.queued.is_empty() && self.held.is_empty() {
            self.rng = None;
        }
        edits
    }

    /// The highest target position of a row (in the KV, queued or held) in `range`.
    pub fn last_target_in(&self, range: TargetRange) -> Option<i32> {
        let kv = self.map.in_kv().iter().map(|e| e.target);
        let rows = self.queued.targets().iter().chain(self.held.targets()).copied();
        kv.chain(rows).filter(|&t| range.contains(t)).max()
    }

    /// The target moved the rows at positions in `range` by `delta`.
    pub fn shift_target(&mut self, range: TargetRange, delta: i32) {
        self.map.shift_target(range, delta);
        self.history.shift(range, delta);
        self.queued.shift_target(range, delta);
        self.held.shift_target(range, delta);
        if let Some(t) = self.outstanding.as_mut().and_then(|o| o.after_target.as_mut()) {
            if range.contains(*t) {
                *t = t.saturating_add(delta);
            }
        }
    }
}
