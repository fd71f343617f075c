//! The per-sequence map between target positions and dense draft positions.
//!
//! Every committed target row gets the next draft position of its sequence,
//! whatever its target position: an M-RoPE image span (many rows pinned to one
//! position) or a position jump never reaches the draft. Host memory operations
//! arrive in target coordinates and are translated here into draft KV edits.
//! Pure bookkeeping; the engine applies the edits to the draft context.

/// Target positions at or above this are refused (process, shifts, state
/// blobs): no context holds them, and keeping below it leaves shifts room
/// before i32 overflows.
/// cbindgen:ignore
pub const MAX_TARGET_POS: i32 = 1 << 30;

/// One row in the draft KV: its target position and its draft position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub target: i32,
    pub draft: i32,
}

/// An edit of one sequence's cells in the draft KV, in draft positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvEdit {
    /// Remove cells in [p0, p1).
    Remove { p0: i32, p1: i32 },
    /// Add `delta` to the positions of cells in [p0, p1).
    Shift { p0: i32, p1: i32, delta: i32 },
}

/// A target range [p0, p1) with llama's conventions: p0 < 0 means 0, p1 < 0
/// means no upper bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetRange {
    pub p0: i32,
    pub p1: i32,
}

impl TargetRange {
    pub fn new(p0: i32, p1: i32) -> TargetRange {
        TargetRange { p0: p0.max(0), p1: if p1 < 0 { i32::MAX } else { p1 } }
    }

    pub fn all() -> TargetRange {
        TargetRange::new(-1, -1)
    }

    pub fn contains(&self, pos: i32) -> bool {
        pos >= self.p0 && pos < self.p1
    }
}

/// The rows of one sequence that are in the draft KV, in draft order. Rows
/// committed but not yet injected have no draft position yet; they wait in the
/// engine's row queue and take `next_draft_pos()` onwards when injected.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeqMap {
    in_kv: Vec<Entry>,
}

impl SeqMap {
    pub fn in_kv(&self) -> &[Entry] {
        &self.in_kv
    }

    pub fn is_empty(&self) -> bool {
        self.in_kv.is_empty()
    }

    /// The draft position the next injected row (or a noise block) takes.
    pub fn next_draft_pos(&self) -> i32 {
        self.in_kv.last().map_or(0, |e| e.draft + 1)
    }

    /// Target position of the newest row in the draft KV.
    pub fn last_target_pos(&self) -> Option<i32> {
        self.in_kv.last().map(|e| e.target)
    }

    /// Draft positions `n` rows injected now would take.
    pub fn pending_draft_positions(&self, n: usize) -> std::ops::Range<i32> {
        let next = self.next_draft_pos();
        next..next + n as i32
    }

    /// Records rows (by target position, in order) injected at the next draft
    /// positions; returns those positions.
    pub fn inject(&mut self, targets: &[i32]) -> std::ops::Range<i32> {
        let positions = self.pending_draft_positions(targets.len());
        for (draft, &target) in positions.clone().zip(targets) {
            self.in_kv.push(Entry { target, draft });
        }
        positions
    }

    /// Removes every row whose target position lies in `range` and returns the
    /// KV edits to apply, in order. With `can_shift` the rows after a removed
    /// span move down so that draft positions stay contiguous; without (an
    /// M-RoPE draft cache cannot shift, but accepts gaps) they keep their positions.
    pub fn remove(&mut self, range: TargetRange, can_shift: bool) -> Vec<KvEdit> {
        let mut edits = Vec::new();
        // removed spans of draft positions, in order
        let mut i = 0;
        while i < self.in_kv.len() {
            if !range.contains(self.in_kv[i].target) {
                i += 1;
                continue;
            }
            let start = i;
            while i < self.in_kv.len() && range.contains(self.in_kv[i].target) {
                i += 1;
            }
            edits.push(KvEdit::Remove { p0: self.in_kv[start].draft, p1: self.in_kv[i - 1].draft + 1 });
        }
        self.in_kv.retain(|e| !range.contains(e.target));
        if can_shift {
            // move each kept run down to the index it now has
            let mut i = 0;
            while i < self.in_kv.len() {
                let start = i;
                let old = self.in_kv[start].draft;
                while i + 1 < self.in_kv.len() && self.in_kv[i + 1].draft == self.in_kv[i].draft + 1 {
                    i += 1;
                }
                let delta = start as i32 - old;
                if delta != 0 {
                    edits.push(KvEdit::Shift { p0: old, p1: self.in_kv[i].draft + 1, delta });
                    for e in &mut self.in_kv[start..=i] {
                        e.draft += delta;
                    }
                }
                i += 1;
            }
        }
        edits
    }

    /// Adds `delta` to the target positions in `range` (a context shift on the
    /// target). Draft positions do not change.
    pub fn shift_target(&mut self, range: TargetRange, delta: i32) {
        for e in &mut self.in_kv {
            if range.contains(e.target) {
                e.target = e.target.saturating_add(delta);
            }
        }
    }

    /// Rebuilds a map from saved entries, checking what every map holds:
    /// draft positions increase from >= 0 (from 0 without gaps when `dense`),
    /// target positions lie in [0, MAX_TARGET_POS) and never go back.
    pub fn from_parts(in_kv: Vec<Entry>, dense: bool) -> Option<SeqMap> {
        let increasing = in_kv.windows(2).all(|w| w[0].draft < w[1].draft && w[0].target <= w[1].target);
        let in_range = in_kv.iter().all(|e| e.draft >= 0 && (0..MAX_TARGET_POS).contains(&e.target));
        let gapless = !dense || in_kv.iter().enumerate().all(|(i, e)| e.draft == i as i32);
        (increasing && in_range && gapless).then_some(SeqMap { in_kv })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(targets: &[i32]) -> SeqMap {
        let mut m = SeqMap::default();
        assert_eq!(m.inject(targets), 0..targets.len() as i32);
        m
    }

    fn drafts(m: &SeqMap) -> Vec<i32> {
        m.in_kv().iter().map(|e| e.draft).collect()
    }

    #[test]
    fn pinned_image_rows_take_distinct_dense_positions() {
        // text 0..3, an image pinned at 3 (4 rows), text continues at 7
        let m = map(&[0, 1, 2, 3, 3, 3, 3, 7, 8]);
        assert_eq!(drafts(&m), (0..9).collect::<Vec<_>>());
        assert_eq!(m.next_draft_pos(), 9);
    }

    #[test]
    fn removing_the_tail_is_one_edit() {
        let mut m = map(&[0, 1, 2, 3, 4]);
        let edits = m.remove(TargetRange::new(3, -1), true);
        assert_eq!(edits, vec![KvEdit::Remove { p0: 3, p1: 5 }]);
        assert_eq!(m.next_draft_pos(), 3);
    }

    #[test]
    fn removing_a_middle_span_compacts_when_the_cache_can_shift() {
        // a context shift on the target: drop [2, 4), then targets 4.. move down by 2
        let mut m = map(&[0, 1, 2, 3, 4, 5]);
        let edits = m.remove(TargetRange::new(2, 4), true);
        assert_eq!(edits, vec![KvEdit::Remove { p0: 2, p1: 4 }, KvEdit::Shift { p0: 4, p1: 6, delta: -2 }]);
        assert_eq!(drafts(&m), vec![0, 1, 2, 3]);
        m.shift_target(TargetRange::new(4, -1), -2);
        assert_eq!(m.in_kv().iter().map(|e| e.target).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    }

    #[test]
    fn without_shift_gaps_stay() {
        let mut m = map(&[0, 1, 2, 3, 4, 5]);
        let edits = m.remove(TargetRange::new(2, 4), false);
        assert_eq!(edits, vec![KvEdit::Remove { p0: 2, p1: 4 }]);
        assert_eq!(drafts(&m), vec![0, 1, 4, 5]);
        assert_eq!(m.next_draft_pos(), 6);
    }

    #[test]
    fn removing_several_spans_shifts_each_kept_run_to_its_index() {
        let mut m = map(&[0, 10, 1, 11, 2, 3]);
        // targets >= 10 are removed: draft positions 1 and 3
        let edits = m.remove(TargetRange::new(10, -1), true);
        assert_eq!(
            edits,
            vec![
                KvEdit::Remove { p0: 1, p1: 2 },
                KvEdit::Remove { p0: 3, p1: 4 },
                KvEdit::Shift { p0: 2, p1: 3, delta: -1 },
                KvEdit::Shift { p0: 4, p1: 6, delta: -2 },
            ]
        );
        assert_eq!(drafts(&m), vec![0, 1, 2, 3]);
    }

    #[test]
    fn injection_continues_after_the_last_draft_position() {
        let mut m = map(&[0, 1]);
        assert_eq!(m.pending_draft_positions(2), 2..4);
        assert_eq!(m.inject(&[2, 3]), 2..4);
        m.remove(TargetRange::new(3, -1), true);
        assert_eq!(m.last_target_pos(), Some(2));
        assert_eq!(m.inject(&[3]), 3..4);
    }

    #[test]
    fn ranges_follow_llamas_negative_conventions() {
        assert!(TargetRange::new(-1, -1).contains(0));
        assert!(TargetRange::new(-1, -1).contains(i32::MAX - 1));
        assert!(!TargetRange::new(2, 4).contains(4));
    }

    #[test]
    fn saved_parts_must_have_increasing_draft_positions() {
        let e = |target, draft| Entry { target, draft };
        assert!(SeqMap::from_parts(vec![e(0, 0), e(1, 2)], false).is_some());
        assert!(SeqMap::from_parts(vec![e(0, 0), e(1, 2)], true).is_none());
        assert!(SeqMap::from_parts(vec![e(0, 0), e(0, 1), e(3, 2)], true).is_some());
        assert!(SeqMap::from_parts(vec![e(0, 1), e(1, 1)], false).is_none());
        assert!(SeqMap::from_parts(vec![e(0, -1)], false).is_none());
        assert!(SeqMap::from_parts(vec![e(-1, 0)], false).is_none());
        assert!(SeqMap::from_parts(vec![e(MAX_TARGET_POS, 0)], false).is_none());
        assert!(SeqMap::from_parts(vec![e(2, 0), e(1, 1)], false).is_none());
    }
}
