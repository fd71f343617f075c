//! The suffix match: where the text's current suffix (ending in the draft's
//! anchor) occurred before, the tokens that followed it are a guess at what
//! follows now. Like llama.cpp's n-gram drafters (prompt lookup), but several
//! occurrences with different continuations give several branches.
//!
//! Where the anchor itself matches little (it is new text: an edit such as a
//! fixed typo or a renamed word), the text before it may still have occurred:
//! the continuation then resumes past the tokens the anchor replaced (none,
//! one or two of them), as a copy resumes after an edit.

use std::collections::HashMap;

/// One proposed continuation of the anchor.
#[derive(Clone, Debug, PartialEq)]
pub struct Branch {
    pub tokens: Vec<i32>,
    /// Tokens of the suffix that matched, at most [`MAX_MATCH`]: how much
    /// context vouches for the continuation. The anchor included, except
    /// after an edit, where it is what came before the anchor.
    pub match_len: usize,
    /// Proposed after an edit ([`propose`]): the anchor is taken for new text.
    pub after_edit: bool,
}

impl Branch {
    /// The class its acceptance is measured in (`NgramAcceptance`), 1 to
    /// [`N_CLASSES`]: the match length, or [`MAX_MATCH`] + the match length
    /// after an edit.
    pub fn class(&self) -> usize {
        let len = self.match_len.clamp(1, MAX_MATCH);
        if self.after_edit { MAX_MATCH + len } else { len }
    }
}

/// Longest suffix compared: beyond this a match is as good as certain.
pub const MAX_MATCH: usize = 8;

/// Classes of [`Branch::class`].
pub const N_CLASSES: usize = 2 * MAX_MATCH;

/// The shortest match of the text before the anchor that proposes branches
/// after an edit, and the longest match of the anchor's own suffix that
/// still does (a longer one is better evidence than any edit).
const EDIT_CONTEXT: usize = 2;

/// Most earlier tokens an edit's anchor is taken to replace.
const MAX_EDIT_SKIP: usize = 2;

/// Branches continuing `text` followed by `anchor`: for each distinct next
/// token, the continuation (at most `max_len` tokens) of the occurrence with
/// the longest matching suffix, then the longest continuation, the most
/// recent on ties; the `max_branches`
/// best by match length, then recency. Unknown tokens (negative) match
/// nothing and end a continuation. Where no occurrence matches more than the
/// anchor, up to [`MAX_EDIT_SKIP`] + 1 more after an edit ([`after_edit`]).
pub fn propose(text: &[i32], anchor: i32, max_len: usize, max_branches: usize) -> Vec<Branch> {
    if max_len == 0 || max_branches == 0 || anchor < 0 {
        return Vec::new();
    }
    let n = text.len();
    // candidates as (match length, end of the occurrence in `text`), one per
    // next token (a common anchor has many occurrences and successors)
    let mut per_next = PerNextToken::default();
    // scanning from the newest, an older occurrence replaces only a shorter
    // match or continuation (a periodic text's newest occurrence runs into the
    // text's end)
    let key = |&(len, end): &(usize, usize)| (len, (n - end - 1).min(max_len));
    for end in (0..n).rev() {
        // text[end] is the occurrence's anchor; it continues with text[end + 1..]
        if text[end] != anchor || end + 1 >= n || text[end + 1] < 0 {
            continue;
        }
        let len = 1 + common_suffix(text, end, MAX_MATCH - 1);
        per_next.offer(text[end + 1], (len, end), |new, old| key(old) < key(new));
    }
    let mut best = per_next.best;
    // longest match first; among equals the newest (larger end)
    best.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
    best.truncate(max_branches);
    let mut branches: Vec<Branch> = best
        .into_iter()
        .map(|(match_len, end)| Branch { tokens: continuation(text, end + 1, max_len), match_len, after_edit: false })
        .collect();
    if branches.first().is_none_or(|b| b.match_len < EDIT_CONTEXT) {
        let exact: Vec<i32> = branches.iter().map(|b| b.tokens[0]).collect();
        branches.extend(after_edit(text, max_len).into_iter().filter(|b| !exact.contains(&b.tokens[0])));
    }
    branches
}

/// Branches after an edit: where the text before the anchor (at least
/// [`EDIT_CONTEXT`] tokens) occurred before, what followed that occurrence
/// once the anchor replaced 0 to [`MAX_EDIT_SKIP`] of its tokens; one per
/// next token, the longest match first, then the newest, then the fewest
/// tokens replaced; as many as there are skips (the newest occurrence's
/// every skip, where a longer match does not beat it).
fn after_edit(text: &[i32], max_len: usize) -> Vec<Branch> {
    let n = text.len();
    // (match length, end of the occurrence, start of the continuation) per
    // next token; scanning from the newest occurrence and the fewest tokens
    // skipped, a later candidate replaces only a shorter match
    let mut per_next = PerNextToken::default();
    // text[..j] ends like the text does: an earlier occurrence of its tail
    for j in (1..n).rev() {
        let len = common_suffix(text, j, MAX_MATCH);
        if len < EDIT_CONTEXT {
            continue;
        }
        for start in (j..n).take(MAX_EDIT_SKIP + 1) {
            if text[start] < 0 {
                break;
            }
            per_next.offer(text[start], (len, j, start), |new, old| old.0 < new.0);
        }
    }
    let mut best = per_next.best;
    best.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    best.truncate(MAX_EDIT_SKIP + 1);
    best.into_iter()
        .map(|(match_len, _, start)| Branch { tokens: continuation(text, start, max_len), match_len, after_edit: true })
        .collect()
}

/// One candidate per next token, in the order first seen: a later offer
/// replaces the kept one only where `better(new, kept)`.
struct PerNextToken<C> {
    best: Vec<C>,
    index: HashMap<i32, usize>,
}

impl<C> Default for PerNextToken<C> {
    fn default() -> Self {
        Self { best: Vec::new(), index: HashMap::new() }
    }
}

impl<C> PerNextToken<C> {
    fn offer(&mut self, next: i32, candidate: C, better: impl FnOnce(&C, &C) -> bool) {
        match self.index.get(&next) {
            Some(&i) => {
                if better(&candidate, &self.best[i]) {
                    self.best[i] = candidate;
                }
            }
            None => {
                self.index.insert(next, self.best.len());
                self.best.push(candidate);
            }
        }
    }
}

/// How many tokens before `text[at]` equal those before the text's end (at
/// most `max`; unknown tokens match nothing).
fn common_suffix(text: &[i32], at: usize, max: usize) -> usize {
    let n = text.len();
    let mut len = 0;
    while len < max && len < at && text[at - 1 - len] >= 0 && text[at - 1 - len] == text[n - 1 - len] {
        len += 1;
    }
    len
}

/// At most `max_len` tokens from `start`, up to the first unknown one.
fn continuation(text: &[i32], start: usize, max_len: usize) -> Vec<i32> {
    text[start..].iter().take(max_len).take_while(|&&t| t >= 0).copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_continuation_of_the_longest_earlier_match_comes_first() {
        // "1 2 3 4 5 | 9 3 4 6 | 1 2 3" + anchor 4: "2 3 4" matched before 5, "3 4" before 6
        let text = [1, 2, 3, 4, 5, 9, 3, 4, 6, 1, 2, 3];
        let b = propose(&text, 4, 3, 4);
        assert_eq!(b[0], Branch { tokens: vec![5, 9, 3], match_len: 4, after_edit: false });
        assert_eq!(b[1], Branch { tokens: vec![6, 1, 2], match_len: 2, after_edit: false });
        assert_eq!(b.len(), 2);
        assert_eq!(propose(&text, 4, 3, 1).len(), 1);
    }

    #[test]
    fn continuations_stop_at_the_text_end_and_at_unknown_tokens() {
        assert_eq!(propose(&[7, 8], 7, 5, 2), vec![Branch { tokens: vec![8], match_len: 1, after_edit: false }]);
        assert_eq!(
            propose(&[7, 8, -1, 9, 7], 7, 5, 2),
            vec![Branch { tokens: vec![8], match_len: 1, after_edit: false }]
        );
        // an unknown token never matches, even another unknown one
        assert_eq!(propose(&[-1, 7, 8, -1], 7, 5, 2)[0].match_len, 1);
    }

    #[test]
    fn nothing_is_proposed_without_an_earlier_occurrence() {
        assert!(propose(&[1, 2, 3], 4, 5, 2).is_empty());
        assert!(propose(&[], 4, 5, 2).is_empty());
        assert!(propose(&[4, 5], 4, 0, 2).is_empty());
        assert!(propose(&[4, 5], -1, 3, 2).is_empty());
    }

    #[test]
    fn one_branch_per_next_token_the_newest_among_equal_matches() {
        // 4 followed by 5 twice (with different continuations) and by 6 once
        let text = [4, 5, 1, 4, 6, 2, 4, 5, 3];
        let b = propose(&text, 4, 2, 4);
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].tokens, vec![5, 3]);
        assert_eq!(b[1].tokens, vec![6, 2]);
    }

    #[test]
    fn a_repeating_text_continues_its_own_period() {
        let text: Vec<i32> = (0..21).map(|i| 1 + i % 2).collect(); // 1 2 1 2 ... 1
        let b = propose(&text, 2, 4, 1);
        assert_eq!(b[0].tokens, vec![1, 2, 1, 2]);
        assert_eq!(b[0].match_len, MAX_MATCH);
    }

    #[test]
    fn after_an_edit_the_copy_resumes_past_the_replaced_tokens() {
        // "1 2 3 9 4 5 6 | 7 | 1 2 3" + anchor 8 (new): "1 2 3" occurred before 9
        let text = [1, 2, 3, 9, 4, 5, 6, 7, 1, 2, 3];
        let b = propose(&text, 8, 3, 2);
        // 8 replaced nothing (9 4 5 follow) or 9 (4 5 6 follow); 8 is no token of the text
        assert_eq!(b[0], Branch { tokens: vec![9, 4, 5], match_len: 3, after_edit: true });
        assert_eq!(b[1], Branch { tokens: vec![4, 5, 6], match_len: 3, after_edit: true });
        assert_eq!(b[1].class(), MAX_MATCH + 3);
        assert_eq!(b[2].tokens, vec![5, 6, 7]);
        assert_eq!(b.len(), MAX_EDIT_SKIP + 1);
        // a context of one token proposes nothing
        assert!(propose(&[1, 9, 4, 5, 1], 8, 3, 2).is_empty());
    }

    #[test]
    fn an_anchor_matched_with_context_proposes_no_edit() {
        // "2 3" + anchor 9 occurred: an exact match of 3 tokens, no edit branch
        let text = [1, 2, 3, 9, 4, 5, 1, 2, 3];
        let b = propose(&text, 9, 2, 4);
        assert_eq!(b, vec![Branch { tokens: vec![4, 5], match_len: 4, after_edit: false }]);
        // an anchor matched alone (its own token only) still gets them, after
        // its exact branch, without repeating that branch's next token
        let text = [1, 2, 3, 9, 4, 5, 6, 8, 4, 1, 2, 3];
        let b = propose(&text, 8, 2, 2);
        assert_eq!(b[0], Branch { tokens: vec![4, 1], match_len: 1, after_edit: false });
        assert!(b[1..].iter().all(|e| e.after_edit && e.tokens[0] != 4), "{b:?}");
        assert_eq!(b[1].tokens, vec![9, 4]);
    }
}
