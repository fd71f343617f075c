//! N-gram branches merged into a grown lattice tree: a branch token that is
//! already a node there marks that node (its estimate becomes the larger of
//! the two), any other becomes a new node; then the budget is spent again
//! over both kinds, best-first by estimated reach (the product of the
//! estimated edge acceptances from the anchor), within the tree's limits.
//! With no branch the lattice tree comes back as it was grown, when it was
//! grown by the same estimate (`grow_tree_by` with the calibrated key).

use super::grow::Shape;
use super::{NOT_IN_LATTICE, Node, Tree, TreeLimits, slot};
use crate::ngram::{Branch, NgramAcceptance};

/// `tree` (grown best-first by `lattice_p`) with `branches` merged in, cut to
/// `limits`. `lattice_p(node)` and `branch_p(class, depth)` estimate
/// P(accepted | parent accepted) of a lattice node and of a branch token.
/// Nodes come in best-first order, so that their first k still form a tree
/// (the controller's cut, `AdaptivePolicy::keep_tree`).
pub fn merge_branches(
    tree: &Tree,
    branches: &[Branch],
    limits: TreeLimits,
    lattice_p: impl Fn(&Node) -> f64,
    branch_p: impl Fn(usize, usize) -> f64,
) -> Tree {
    let mut nodes: Vec<Node> = tree.nodes().to_vec();
    let mut key: Vec<f64> = nodes.iter().map(&lattice_p).collect();
    for b in branches {
        let class = b.class().min(u8::MAX as usize);
        let mut parent: Option<usize> = None;
        for (s, &token) in b.tokens.iter().enumerate() {
            let depth = s + 1;
            if depth > limits.max_depth {
                break;
            }
            let p_branch = branch_p(class, depth);
            let p_parent = parent.map_or(-1, |p| p as i32);
            let at = nodes.iter().position(|n| n.parent == p_parent && n.token == token);
            let i = match at {
                Some(i) => {
                    // the node is measured in the class that trusts it most
                    let marked = nodes[i].ngram as usize;
                    if marked == 0 || branch_p(marked, depth) < p_branch {
                        nodes[i].ngram = class as u8;
                    }
                    key[i] = key[i].max(p_branch);
                    i
                }
                None => {
                    nodes.push(Node {
                        token,
                        parent: p_parent,
                        depth,
                        prob: p_branch as f32,
                        path_prob: 0.0,
                        candidate: NOT_IN_LATTICE,
                        ngram: class as u8,
                    });
                    key.push(p_branch);
                    nodes.len() - 1
                }
            };
            parent = Some(i);
        }
    }
    // reach in candidate order (parents precede children in both parts)
    let mut reach = vec![0.0f64; nodes.len()];
    for i in 0..nodes.len() {
        reach[i] = nodes[i].parent().map_or(1.0, |p| reach[p]) * key[i].clamp(0.0, 1.0);
    }
    // best-first; a parent's reach is at least its child's, and on a tie the
    // shallower (then the earlier) comes first, so parents precede children
    let mut order: Vec<usize> = (0..nodes.len()).collect();
    order.sort_by(|&a, &b| reach[b].total_cmp(&reach[a]).then(nodes[a].depth.cmp(&nodes[b].depth)).then(a.cmp(&b)));
    let mut new_index = vec![None::<usize>; nodes.len()];
    let mut shape = Shape::new();
    let mut out: Vec<Node> = Vec::with_capacity(limits.n_nodes);
    for i in order {
        if out.len() >= limits.n_nodes {
            break;
        }
        let parent = match nodes[i].parent() {
            None => None,
            Some(p) => match new_index[p] {
                Some(np) => Some(np),
                None => continue, // its parent was left out
            },
        };
        let s = slot(parent);
        if !shape.may_add(s, &limits) {
            continue;
        }
        shape.add(s);
        new_index[i] = Some(out.len());
        // a lattice node keeps the lattice's path probability (its ancestors
        // are the lattice's too); a branch's own node extends its parent's
        let n = nodes[i];
        let path_prob = if n.in_lattice() { n.path_prob } else { parent.map_or(1.0, |p| out[p].path_prob) * n.prob };
        out.push(Node { parent: parent.map_or(-1, |p| p as i32), path_prob, ..n });
    }
    Tree { nodes: out }
}

/// A greedy tree was verified and `path` accepted: every branch node
/// (`Node::ngram` > 0) whose parent was reached is a trial of `acceptance`.
/// Only the first `n_verified` nodes count (the host verified those); returns
/// the branch nodes reached and accepted. Here rather than in `crate::ngram`,
/// which knows branches but not trees (the tree is built on the n-grams).
pub fn observe_branches(
    acceptance: &mut NgramAcceptance,
    tree: &Tree,
    path: &[usize],
    n_verified: usize,
) -> (usize, usize) {
    let mut on_path = vec![false; tree.len()];
    path.iter().for_each(|&i| on_path[i] = true);
    let (mut reached, mut accepted) = (0, 0);
    for (i, n) in tree.nodes().iter().enumerate().take(n_verified) {
        let parent_reached = n.parent().is_none_or(|p| on_path[p]);
        if n.ngram > 0 && parent_reached {
            acceptance.observe(n.ngram as usize, n.depth, on_path[i]);
            reached += 1;
            accepted += on_path[i] as usize;
        }
    }
    (reached, accepted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::accept_greedy;

    fn lattice_node(token: i32, parent: i32, depth: usize, prob: f32) -> Node {
        Node { token, parent, depth, prob, path_prob: prob, candidate: 0, ngram: 0 }
    }

    /// anchor -> 10 (0.8) -> 11 (0.7); anchor -> 20 (0.1)
    fn lattice() -> Tree {
        Tree::from_nodes(vec![lattice_node(10, -1, 1, 0.8), lattice_node(11, 0, 2, 0.7), lattice_node(20, -1, 1, 0.1)])
            .unwrap()
    }

    fn raw(n: &Node) -> f64 {
        n.prob as f64
    }

    #[test]
    fn without_branches_the_lattice_tree_is_unchanged() {
        let t = lattice();
        let m = merge_branches(&t, &[], TreeLimits::tree(3, 7), raw, |_, _| 0.5);
        assert_eq!(m.tokens(&[0, 1, 2]), t.tokens(&[0, 1, 2]));
        assert_eq!(m.nodes().iter().map(|n| n.parent).collect::<Vec<_>>(), vec![-1, 0, -1]);
    }

    #[test]
    fn a_branch_marks_the_nodes_it_shares_and_adds_the_rest() {
        let t = lattice();
        let b = Branch { tokens: vec![10, 12, 13], match_len: 4, after_edit: false };
        let m = merge_branches(&t, &[b], TreeLimits::tree(6, 7), raw, |_, _| 0.9);
        let tokens: Vec<i32> = m.nodes().iter().map(|n| n.token).collect();
        // 10 (0.9), 12 (0.81), 13 (0.729), 11 (0.63), 20 (0.1)
        assert_eq!(tokens, vec![10, 12, 13, 11, 20]);
        assert_eq!(m.nodes()[0].ngram, 4);
        assert!(m.nodes()[0].in_lattice());
        assert!(!m.nodes()[1].in_lattice() && !m.nodes()[2].in_lattice());
        assert_eq!(m.nodes()[3].ngram, 0);
        Tree::from_nodes(m.nodes().to_vec()).unwrap();
        // greedy acceptance follows the branch where the target agrees with it
        let argmax = [10, 12, 13, 99, 99, 99];
        assert_eq!(accept_greedy(&m, &argmax).unwrap().path, vec![0, 1, 2]);
    }

    #[test]
    fn branch_nodes_whose_parent_was_reached_are_the_trials_of_their_acceptance() {
        let t = lattice();
        let b = Branch { tokens: vec![10, 12, 13], match_len: 4, after_edit: false };
        // 10 (branch and lattice), 12, 13 (branch), 11, 20 (lattice)
        let m = merge_branches(&t, &[b], TreeLimits::tree(6, 7), raw, |_, _| 0.9);
        let mut acceptance = NgramAcceptance::default();
        // 10 and 12 accepted: 10, 12 and 13 reached (13's parent was), 11 and 20 no branch nodes
        assert_eq!(observe_branches(&mut acceptance, &m, &[0, 1], m.len()), (3, 2));
        let mut expected = NgramAcceptance::default();
        for (depth, accepted) in [(1, true), (2, true), (3, false)] {
            expected.observe(4, depth, accepted);
        }
        assert_eq!(acceptance, expected);
        // only what the host verified counts; nothing reached past a rejected parent
        let mut acceptance = NgramAcceptance::default();
        assert_eq!(observe_branches(&mut acceptance, &m, &[0, 1], 2), (2, 2));
        assert_eq!(observe_branches(&mut acceptance, &m, &[], m.len()), (1, 0));
    }

    #[test]
    fn a_shared_node_is_measured_in_the_class_that_trusts_it_most() {
        let exact = Branch { tokens: vec![10, 12], match_len: 1, after_edit: false };
        let edit = Branch { tokens: vec![10, 12, 14], match_len: 4, after_edit: true };
        let (c_exact, c_edit) = (exact.class(), edit.class());
        let p = |class: usize, _: usize| if class == c_edit { 0.3 } else { 0.15 };
        for branches in [[exact.clone(), edit.clone()], [edit.clone(), exact.clone()]] {
            let m = merge_branches(&lattice(), &branches, TreeLimits::tree(6, 7), raw, p);
            let class_of = |token: i32| m.nodes().iter().find(|n| n.token == token).unwrap().ngram as usize;
            assert_eq!((class_of(10), class_of(12), class_of(14)), (c_edit, c_edit, c_edit));
        }
        // the other way round, the exact branch's class
        let p = |class: usize, _: usize| if class == c_exact { 0.3 } else { 0.15 };
        let m = merge_branches(&lattice(), &[edit, exact], TreeLimits::tree(6, 7), raw, p);
        assert_eq!(m.nodes().iter().find(|n| n.token == 12).unwrap().ngram as usize, c_exact);
    }

    #[test]
    fn a_path_through_a_branch_tells_the_controller_the_lattice_failed_there() {
        let b = [
            Branch { tokens: vec![10, 12, 13], match_len: 4, after_edit: false },
            Branch { tokens: vec![30, 31], match_len: 4, after_edit: true },
        ];
        let m = merge_branches(&lattice(), &b, TreeLimits::tree(8, 7), raw, |_, _| 0.9);
        let at = |token: i32| m.nodes().iter().position(|n| n.token == token).unwrap();
        let (n10, n12, n13, n30, n31) = (at(10), at(12), at(13), at(30), at(31));
        // 10 is the lattice's (marked), 12 only the branch's: the lattice's 11 was passed over
        assert_eq!(m.path_confidences(&[n10, n12, n13]), (vec![0.8, 0.7], 1));
        assert_eq!(m.path_confidences(&[n10]), (vec![0.8, 0.7], 1));
        // a path off the lattice at once: its first child, 10, was rejected
        assert_eq!(m.path_confidences(&[n30, n31]), (vec![0.8], 0));
        assert_eq!(m.path_confidences(&[]), (vec![0.8], 0));
    }

    #[test]
    fn the_budget_goes_to_the_best_estimates_of_either_kind() {
        let t = lattice();
        let b = Branch { tokens: vec![30, 31], match_len: 1, after_edit: false };
        // a weak branch (0.2) beats the weak lattice sibling (0.1) for the last node
        let m = merge_branches(&t, std::slice::from_ref(&b), TreeLimits::tree(3, 7), raw, |_, _| 0.2);
        let tokens: Vec<i32> = m.nodes().iter().map(|n| n.token).collect();
        assert_eq!(tokens, vec![10, 11, 30]);
        // the limits hold: one leaf means one path
        let mut one_leaf = TreeLimits::tree(6, 7);
        one_leaf.max_leaves = 1;
        let m = merge_branches(&t, &[b], one_leaf, raw, |_, _| 0.2);
        assert_eq!(m.leaves().len(), 1);
        // and the depth limit cuts a branch
        let deep = Branch { tokens: vec![40, 41, 42, 43], match_len: 8, after_edit: false };
        let m = merge_branches(&t, &[deep], TreeLimits::tree(10, 2), raw, |_, _| 0.99);
        assert!(m.nodes().iter().all(|n| n.depth <= 2));
        assert_eq!(m.nodes().iter().filter(|n| !n.in_lattice()).count(), 2);
    }

    #[test]
    fn the_first_k_nodes_of_a_merged_tree_are_a_tree() {
        let t = lattice();
        let b = [
            Branch { tokens: vec![10, 12, 13], match_len: 3, after_edit: false },
            Branch { tokens: vec![50, 51], match_len: 2, after_edit: false },
        ];
        let m = merge_branches(&t, &b, TreeLimits::tree(8, 7), raw, |m, d| 0.3 + 0.1 * m as f64 - 0.01 * d as f64);
        for k in 0..=m.len() {
            let mut cut = m.clone();
            cut.truncate(k);
            Tree::from_nodes(cut.nodes().to_vec()).unwrap();
        }
    }
}
