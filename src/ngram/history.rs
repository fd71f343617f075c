//! The committed tokens of one sequence, by target position: what the n-gram
//! matcher reads. The engine learns a token from the host's rows (prompts,
//! `llama_spec_dflash2_process_tokens` / `process_batch`) or, for generated
//! text, from its own drafts: the anchor of each draft request (the host's last
//! sampled token) and the drafted tokens the host accepted.

use crate::positions::TargetRange;

/// Tokens of committed rows in position order; a row whose token is unknown
/// (an embedding row, a host that passed none) holds -1, which matches nothing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenHistory {
    positions: Vec<i32>,
    tokens: Vec<i32>,
    /// The anchor of the latest draft request: the token of the next committed
    /// row when the host does not pass one.
    anchor: Option<i32>,
}

/// Tokens beyond which the oldest half is forgotten: the matcher's scan stays
/// bounded whatever the context length.
const MAX_TOKENS: usize = 1 << 16;

impl TokenHistory {
    /// The token of the row a draft request anchors on (its id_last).
    pub fn set_anchor(&mut self, token: i32) {
        self.anchor = Some(token);
    }

    /// The anchor of the outstanding draft, if a request set one.
    pub fn anchor(&self) -> Option<i32> {
        self.anchor
    }

    /// A committed row at `pos`: `token` when the host passed one, else the
    /// pending anchor. A row at or before the newest position replaces what
    /// is there and forgets everything after it (the host rewrote the text).
    pub fn commit(&mut self, pos: i32, token: Option<i32>) {
        let token = token.or(self.anchor.take()).unwrap_or(-1);
        self.anchor = None;
        if self.positions.last().is_some_and(|&last| pos <= last) {
            let keep = self.positions.partition_point(|&p| p < pos);
            self.positions.truncate(keep);
            self.tokens.truncate(keep);
        }
        if self.tokens.len() >= MAX_TOKENS {
            let half = MAX_TOKENS / 2;
            self.positions.drain(..half);
            self.tokens.drain(..half);
        }
        self.positions.push(pos);
        self.tokens.push(token);
    }

    /// Forgets the rows at positions in `range`. (Text on both sides of a
    /// removed stretch then reads as adjacent: a match across it is only a
    /// guess the target rejects.)
    pub fn remove(&mut self, range: TargetRange) {
        // positions are kept in order (see `shift`): the range is one stretch,
        // found in O(log n) (hosts trim their verify rows every step)
        let lo = self.positions.partition_point(|&p| p < range.p0);
        let hi = self.positions.partition_point(|&p| p < range.p1);
        if lo < hi {
            self.positions.drain(lo..hi);
            self.tokens.drain(lo..hi);
        }
    }

    /// The target moved the rows at positions in `range` by `delta`.
    pub fn shift(&mut self, range: TargetRange, delta: i32) {
        let mut moved = false;
        for p in &mut self.positions {
            if range.contains(*p) {
                *p = p.saturating_add(delta);
                moved = true;
            }
        }
        // a context shift keeps the order; a shift past other rows re-sorts them
        if moved && !self.positions.is_sorted() {
            let mut rows: Vec<(i32, i32)> = self.positions.iter().copied().zip(self.tokens.iter().copied()).collect();
            rows.sort_by_key(|&(p, _)| p);
            (self.positions, self.tokens) = rows.into_iter().unzip();
        }
    }

    /// The committed rows as (position, token), in position order.
    pub fn rows(&self) -> impl ExactSizeIterator<Item = (i32, i32)> + '_ {
        self.positions.iter().copied().zip(self.tokens.iter().copied())
    }

    /// A history of these rows (a state blob's); None unless their positions
    /// ascend strictly, as committed rows' do.
    pub fn from_rows(rows: Vec<(i32, i32)>) -> Option<TokenHistory> {
        if rows.windows(2).any(|w| w[0].0 >= w[1].0) || rows.len() > MAX_TOKENS {
            return None;
        }
        let (positions, tokens) = rows.into_iter().unzip();
        Some(TokenHistory { positions, tokens, anchor: None })
    }

    /// Forgets everything (a sequence emptied).
    pub fn clear(&mut self) {
        *self = TokenHistory::default();
    }

    /// The committed tokens in position order.
    pub fn tokens(&self) -> &[i32] {
        &self.tokens
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history(tokens: &[i32]) -> TokenHistory {
        let mut h = TokenHistory::default();
        for (p, &t) in tokens.iter().enumerate() {
            h.commit(p as i32, Some(t));
        }
        h
    }

    #[test]
    fn a_row_without_a_token_takes_the_pending_anchor_once() {
        let mut h = history(&[5, 6]);
        h.set_anchor(7);
        h.commit(2, None);
        h.commit(3, None);
        assert_eq!(h.tokens(), &[5, 6, 7, -1]);
        // a host's token wins over the anchor, and the anchor is spent
        h.set_anchor(9);
        h.commit(4, Some(8));
        h.commit(5, None);
        assert_eq!(h.tokens(), &[5, 6, 7, -1, 8, -1]);
    }

    #[test]
    fn rollbacks_and_shifts_follow_the_target() {
        let mut h = history(&[1, 2, 3, 4, 5]);
        h.remove(TargetRange::new(3, -1)); // seq_rm from position 3 on
        assert_eq!(h.tokens(), &[1, 2, 3]);
        h.commit(3, Some(9));
        assert_eq!(h.tokens(), &[1, 2, 3, 9]);
        // a context shift: drop [1, 2), move the rest back by one
        h.remove(TargetRange::new(1, 2));
        h.shift(TargetRange::new(2, -1), -1);
        assert_eq!(h.tokens(), &[1, 3, 9]);
        h.commit(3, Some(4));
        assert_eq!(h.tokens(), &[1, 3, 9, 4]);
        // a row at an earlier position rewrites the text from there
        h.commit(1, Some(7));
        assert_eq!(h.tokens(), &[1, 7]);
        h.clear();
        assert!(h.is_empty() && h.anchor().is_none());
    }
}
