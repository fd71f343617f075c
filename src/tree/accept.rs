//! Accepting a path of a tree: greedy ([`accept_greedy`]) or, at T > 0,
//! sample-and-match ([`accept_matching`]), lossless for any tree.

use super::{Tree, slot};
use crate::error::{Error, Result};

// ---- acceptance ------------------------------------------------------------

/// Result of verifying a tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeVerdict {
    /// Accepted nodes, depth 1 first: a path from the anchor.
    pub path: Vec<usize>,
    /// Tokens to emit: the path's, then the bonus or replacement token
    /// (always `path.len() + 1`).
    pub tokens: Vec<i32>,
}

/// Follows the target: at the anchor row, then at each accepted node's row,
/// `target(row)` gives the target's token there (row None: the anchor); if a
/// child carries it, that child is accepted and the walk goes on, otherwise
/// the token is the bonus and the walk ends. Rows are asked in path order,
/// once each, so a host may sample lazily with its own stateful sampler: at
/// T = 0 this is greedy acceptance, at T > 0 sample-and-match, lossless for
/// any tree (the emitted tokens are the target's own samples).
pub fn accept_matching(tree: &Tree, mut target: impl FnMut(Option<usize>) -> i32) -> TreeVerdict {
    let (mut path, mut tokens, mut at) = (Vec::new(), Vec::new(), None);
    loop {
        let t = target(at);
        tokens.push(t);
        match tree.children(at).find(|&c| tree.nodes[c].token == t) {
            Some(c) => {
                path.push(c);
                at = Some(c);
            }
            None => return TreeVerdict { path, tokens },
        }
    }
}

/// Greedy acceptance: `argmax[0]` is the target's argmax at the anchor row,
/// `argmax[i + 1]` at node i's. The longest path whose every node carries its
/// parent row's argmax, and the deepest accepted row's argmax as bonus.
pub fn accept_greedy(tree: &Tree, argmax: &[i32]) -> Result<TreeVerdict> {
    if argmax.len() != tree.len() + 1 {
        return Err(Error::invalid(format!(
            "{} nodes need {} argmax rows; got {}",
            tree.len(),
            tree.len() + 1,
            argmax.len()
        )));
    }
    Ok(accept_matching(tree, |row| argmax[slot(row)]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::Rng;
    use crate::selector::Lattice;
    use crate::tree::test_support::{clean_block, node};
    use crate::tree::{TreeLimits, grow_tree};

    // ---- greedy acceptance -------------------------------------------------

    #[test]
    fn greedy_acceptance_on_a_chain_is_chain_acceptance() {
        let mut rng = Rng::new(4);
        for _ in 0..2000 {
            let (rows, n_embd, k) = clean_block(&mut rng, 8);
            let lat = Lattice::new(&rows, n_embd, k).unwrap();
            let chain = grow_tree(&lat, TreeLimits::chain(8, 0.0), 8);
            let draft = chain.tokens(&(0..chain.len()).collect::<Vec<_>>());
            // targets that often agree with the draft
            let argmax: Vec<i32> = (0..=draft.len())
                .map(|i| if i < draft.len() && rng.next_u64() % 3 > 0 { draft[i] } else { (rng.next_u64() % 8) as i32 })
                .collect();
            let n_acc = draft.iter().zip(&argmax).take_while(|(d, a)| d == a).count();
            let v = accept_greedy(&chain, &argmax).unwrap();
            assert_eq!(v.path, (0..n_acc).collect::<Vec<_>>());
            assert_eq!(v.tokens, argmax[..=n_acc].to_vec());
        }
    }

    #[test]
    fn greedy_acceptance_follows_the_argmax_down_any_branch() {
        let t = Tree::from_nodes(vec![
            node(10, -1, 1),
            node(11, -1, 1),
            node(20, 0, 2),
            node(21, 1, 2),
            node(22, 1, 2),
            node(30, 4, 3),
        ])
        .unwrap();
        //            anchor  0   1   2   3   4   5
        let argmax = [11, 20, 22, 0, 0, 30, 7];
        assert_eq!(
            accept_greedy(&t, &argmax).unwrap(),
            TreeVerdict { path: vec![1, 4, 5], tokens: vec![11, 22, 30, 7] }
        );
        assert_eq!(accept_greedy(&t, &[12, 0, 0, 0, 0, 0, 0]).unwrap(), TreeVerdict { path: vec![], tokens: vec![12] });
        assert!(accept_greedy(&t, &argmax[..6]).is_err());
        // rows are asked lazily, in path order, once each
        let mut asked = Vec::new();
        accept_matching(&t, |r| {
            asked.push(r);
            argmax[slot(r)]
        });
        assert_eq!(asked, vec![None, Some(1), Some(4), Some(5)]);
        // reach under a per-node model, and the lattice estimate
        let reach = t.reach(|n| if n.depth == 1 { 0.5 } else { 0.2 });
        let want = [0.5, 0.5, 0.1, 0.1, 0.1, 0.02];
        assert!(reach.iter().zip(want).all(|(r, w)| (r - w).abs() < 1e-15), "{reach:?}");
        assert!((t.expected_accepted() - (0.5 + 0.5 + 0.25 * 3.0 + 0.125)).abs() < 1e-12);
    }
}
