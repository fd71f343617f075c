//! The suffix match: where the text's current suffix (ending in the draft's
//! anchor) occurred before, the tokens that followed it are a guess at what
//! follows now. Like llama.cpp's n-gram drafters (prompt lookup), but several
//! occurrences with different continuations give several branches.

use std::collections::HashMap;

/// One proposed continuation of the anchor.
#[derive(Clone, Debug, PartialEq)]
pub struct Branch {
    pub tokens: Vec<i32>,
    /// Tokens of the suffix that matched (the anchor included), at most
    /// [`MAX_MATCH`]: how much context vouches for the continuation.
    pub match_len: usize,
}

/// Longest suffix compared: beyond this a match is as good as certain.
pub const MAX_MATCH: usize = 8;

/// Branches continuing `text` followed by `anchor`: for each distinct next
/// token, the continuation (at most `max_len` tokens) of the occurrence with
/// the longest matching suffix, then the longest continuation, the most
/// recent on ties; the `max_branches`
/// best by match length, then recency. Unknown tokens (negative) match
/// nothing and end a continuation.
pub fn propose(text: &[i32], anchor: i32, max_len: usize, max_branches: usize) -> Vec<Branch> {
    if max_len == 0 || max_branches == 0 || anchor < 0 {
        return Vec::new();
    }
    let n = text.len();
    // candidates as (match length, end of the occurrence in `text`), one per
    // next token (a common anchor has many occurrences and successors)
    let mut best: Vec<(usize, usize)> = Vec::new();
    let mut by_next: HashMap<i32, usize> = HashMap::new();
    for end in (0..n).rev() {
        // text[end] is the occurrence's anchor; it continues with text[end + 1..]
        if text[end] != anchor || end + 1 >= n || text[end + 1] < 0 {
            continue;
        }
        let mut len = 1;
        while len < MAX_MATCH && len <= end && n >= len && text[end - len] >= 0 && text[end - len] == text[n - len] {
            len += 1;
        }
        let next = text[end + 1];
        let key = (len, (n - end - 1).min(max_len));
        match by_next.get(&next) {
            // scanning from the newest, an older occurrence replaces only a
            // shorter match or continuation (a periodic text's newest
            // occurrence runs into the text's end)
            Some(&i) if (best[i].0, (n - best[i].1 - 1).min(max_len)) < key => best[i] = (len, end),
            Some(_) => {}
            None => {
                by_next.insert(next, best.len());
                best.push((len, end));
            }
        }
    }
    // longest match first; among equals the newest (larger end)
    best.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
    best.truncate(max_branches);
    best.into_iter()
        .map(|(match_len, end)| Branch {
            tokens: text[end + 1..].iter().take(max_len).take_while(|&&t| t >= 0).copied().collect(),
            match_len,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_continuation_of_the_longest_earlier_match_comes_first() {
        // "1 2 3 4 5 | 9 3 4 6 | 1 2 3" + anchor 4: "2 3 4" matched before 5, "3 4" before 6
        let text = [1, 2, 3, 4, 5, 9, 3, 4, 6, 1, 2, 3];
        let b = propose(&text, 4, 3, 4);
        assert_eq!(b[0], Branch { tokens: vec![5, 9, 3], match_len: 4 });
        assert_eq!(b[1], Branch { tokens: vec![6, 1, 2], match_len: 2 });
        assert_eq!(b.len(), 2);
        assert_eq!(propose(&text, 4, 3, 1).len(), 1);
    }

    #[test]
    fn continuations_stop_at_the_text_end_and_at_unknown_tokens() {
        assert_eq!(propose(&[7, 8], 7, 5, 2), vec![Branch { tokens: vec![8], match_len: 1 }]);
        assert_eq!(propose(&[7, 8, -1, 9, 7], 7, 5, 2), vec![Branch { tokens: vec![8], match_len: 1 }]);
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
}
