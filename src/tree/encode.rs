//! The encoding that verifies a tree in one llama.cpp batch: its rows
//! ([`Tree::verify_rows`], [`VerifyRow`]) and the memory calls around the
//! decode ([`Tree::kv_prepare`], [`Tree::kv_commit`], [`KvOp`]).
//!
//! # Verifying a tree in one batch (llama.cpp)
//! One sequence id per root-to-leaf path; a row belongs to the ids of every
//! leaf below it. The KV mask keeps cell j for query i when j carries the
//! query's first sequence id and pos(j) <= pos(i): a node's first id is a leaf
//! below it, whose path cells are exactly the node's ancestors, so it sees the
//! prefix, the anchor and its ancestors, nothing else. [`Tree::verify_rows`]
//! gives the rows (anchor first, then nodes in tree order: every path id needs
//! non-decreasing positions through the batch), [`Tree::kv_prepare`] and
//! [`Tree::kv_commit`] the `llama_memory_seq_cp/rm` calls around the decode.
//!
//! Budget for one sequence, a tree of N nodes with L leaves (L <= N):
//! - KV cells: the batch writes 1 + N cells (anchor and nodes), as a chain of N
//!   drafted tokens does; after the commit 1 + accepted remain. The prefix is
//!   shared by tagging its cells with every path id (`seq_cp` within one stream
//!   copies no data), which is why the cache must be unified (`kv_unified`:
//!   otherwise the splitter refuses coupled sequences and cross-stream copies
//!   copy whole buffers).
//! - Sequence ids: L path ids. The sequence's own id may serve as the first
//!   path's (pool[0] == seq): then L - 1 extra ids, and a chain needs none.
//!   A context serving S slots with trees of at most L_max leaves needs
//!   n_seq_max >= S * L_max (reusing ids) or S * (1 + L_max) (fresh ids), and
//!   at most LLAMA_MAX_SEQ (256 in the pinned llama.cpp). `TreeLimits::max_leaves`
//!   caps L at growth.

use super::Tree;
use crate::error::{Error, Result};

impl Tree {
    /// For every node, the leaves (indices into `leaves()`) below it, ascending.
    fn leaves_below(&self) -> Vec<Vec<usize>> {
        let mut below = vec![Vec::new(); self.nodes.len()];
        for (l, leaf) in self.leaves().into_iter().enumerate() {
            for i in std::iter::successors(Some(leaf), |&i| self.nodes[i].parent()) {
                below[i].push(l);
            }
        }
        below
    }

    /// Checks a pool of path ids for this tree: one per leaf, >= 0, distinct;
    /// `seq` (the sequence's own id) may only be the first.
    fn path_ids<'p>(&self, pool: &'p [i32], seq: Option<i32>) -> Result<&'p [i32]> {
        let n_leaves = self.leaves().len();
        let Some(ids) = pool.get(..n_leaves) else {
            return Err(Error::invalid(format!(
                "{n_leaves} leaves need {n_leaves} path ids; the pool has {}",
                pool.len()
            )));
        };
        for (i, &id) in ids.iter().enumerate() {
            if id < 0 || ids[..i].contains(&id) || (i > 0 && Some(id) == seq) {
                return Err(Error::invalid(format!(
                    "path id {id} at {i}: ids must be >= 0, distinct, and the sequence's own id only first"
                )));
            }
        }
        Ok(ids)
    }

    /// For each node, the path sequence ids it belongs to: `pool[l]` for every
    /// leaf l below it, in leaf order. The first is the id its attention mask
    /// follows. `pool` needs one id per leaf (more are ignored).
    pub fn node_seq_ids(&self, pool: &[i32]) -> Result<Vec<Vec<i32>>> {
        let ids = self.path_ids(pool, None)?;
        Ok(self.leaves_below().into_iter().map(|ls| ls.into_iter().map(|l| ids[l]).collect()).collect())
    }

    /// The verify batch for a sequence whose own id is `seq` and whose next
    /// position is `n_past` (the anchor's): row 0 the anchor (`seq` and every
    /// path id), row i + 1 node i at `n_past + depth`. Every row wants logits.
    /// Add them to the batch in this order.
    pub fn verify_rows(&self, anchor: i32, n_past: i32, seq: i32, pool: &[i32]) -> Result<Vec<VerifyRow>> {
        let ids = self.path_ids(pool, Some(seq))?;
        let mut anchor_ids = vec![seq];
        anchor_ids.extend(ids.iter().filter(|&&id| id != seq));
        let mut rows = vec![VerifyRow { token: anchor, pos: n_past, seq_ids: anchor_ids }];
        for (n, seq_ids) in self.nodes.iter().zip(self.node_seq_ids(ids)?) {
            rows.push(VerifyRow { token: n.token, pos: n_past + n.depth as i32, seq_ids });
        }
        Ok(rows)
    }

    /// Memory calls before the verify decode: every path id gets the
    /// committed prefix `seq` holds (in a unified cache a tag, not a copy).
    /// The path ids must hold nothing before (after [`Tree::kv_commit`] they don't).
    pub fn kv_prepare(&self, seq: i32, pool: &[i32]) -> Result<Vec<KvOp>> {
        let ids = self.path_ids(pool, Some(seq))?;
        Ok(ids.iter().filter(|&&id| id != seq).map(|&dst| KvOp::SeqCp { src: seq, dst, p0: -1, p1: -1 }).collect())
    }

    /// Memory calls after verification accepted `path` (node indices, depth 1
    /// first, possibly empty): `seq` keeps the prefix, the anchor and the
    /// accepted nodes at positions n_past + 1 ..= n_past + path.len(); every
    /// path id is emptied and the rejected nodes' cells freed.
    pub fn kv_commit(&self, path: &[usize], n_past: i32, seq: i32, pool: &[i32]) -> Result<Vec<KvOp>> {
        let ids = self.path_ids(pool, Some(seq))?;
        self.check_path(path)?;
        let (start, end) = (n_past + 1, n_past + 1 + path.len() as i32);
        // The accepted nodes are, below the anchor, exactly the cells of any
        // leaf's path under the deepest one, up to its depth.
        let keep = path.last().map(|&a| self.leaves_below()[a][0]);
        let reused = ids.first() == Some(&seq);
        let mut ops = Vec::new();
        match keep {
            // seq's own path runs through the accepted nodes: cut it below them
            Some(0) if reused => ops.push(KvOp::SeqRm { seq, p0: end, p1: -1 }),
            _ => {
                if reused {
                    ops.push(KvOp::SeqRm { seq, p0: start, p1: -1 });
                }
                if let Some(l) = keep {
                    ops.push(KvOp::SeqCp { src: ids[l], dst: seq, p0: start, p1: end });
                }
            }
        }
        ops.extend(ids.iter().filter(|&&id| id != seq).map(|&id| KvOp::SeqRm { seq: id, p0: -1, p1: -1 }));
        Ok(ops)
    }

    /// A path must start at depth 1 and go from parent to child.
    fn check_path(&self, path: &[usize]) -> Result<()> {
        let mut parent = -1;
        for &i in path {
            match self.nodes.get(i) {
                Some(n) if n.parent == parent => parent = i as i32,
                _ => return Err(Error::invalid(format!("path {path:?} is not a path from the anchor in this tree"))),
            }
        }
        Ok(())
    }
}

/// One row of the verify batch (`common_batch_add(batch, token, pos, seq_ids, true)`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyRow {
    pub token: i32,
    pub pos: i32,
    pub seq_ids: Vec<i32>,
}

/// A memory call on the target context: `llama_memory_seq_cp(mem, src, dst,
/// p0, p1)` or `llama_memory_seq_rm(mem, seq, p0, p1)`; -1 is an open end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvOp {
    SeqCp { src: i32, dst: i32, p0: i32, p1: i32 },
    SeqRm { seq: i32, p0: i32, p1: i32 },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::Rng;
    use crate::selector::Lattice;
    use crate::tree::test_support::{node, random_block};
    use crate::tree::{TreeLimits, accept_greedy, grow_tree};
    use std::collections::BTreeSet;

    // ---- encoding --------------------------------------------------------

    #[test]
    fn trees_are_checked_and_seq_ids_follow_the_leaves() {
        assert!(Tree::from_nodes(vec![node(1, 0, 1)]).is_err()); // parent not earlier
        assert!(Tree::from_nodes(vec![node(1, -1, 2)]).is_err()); // wrong depth
        assert!(Tree::from_nodes(vec![node(1, -1, 1), node(1, -1, 1)]).is_err()); // twin siblings
        assert!(Tree::from_nodes(vec![node(1, -2, 1)]).is_err());
        assert!(Tree::from_nodes(vec![node(-3, -1, 1)]).is_err());
        //      anchor
        //      /    \
        //     0      1
        //    / \      \
        //   2   3      4
        //   |
        //   5
        let t = Tree::from_nodes(vec![
            node(10, -1, 1),
            node(11, -1, 1),
            node(20, 0, 2),
            node(21, 0, 2),
            node(22, 1, 2),
            node(30, 2, 3),
        ])
        .unwrap();
        assert_eq!(t.leaves(), vec![3, 4, 5]);
        assert_eq!(t.paths(), vec![vec![0, 3], vec![1, 4], vec![0, 2, 5]]);
        let ids = t.node_seq_ids(&[7, 8, 9, 100]).unwrap();
        assert_eq!(ids, vec![vec![7, 9], vec![8], vec![9], vec![7], vec![8], vec![9]]);
        let rows = t.verify_rows(42, 100, 3, &[7, 8, 9]).unwrap();
        assert_eq!(rows[0], VerifyRow { token: 42, pos: 100, seq_ids: vec![3, 7, 8, 9] });
        assert_eq!(rows[6], VerifyRow { token: 30, pos: 103, seq_ids: vec![9] });
        // the sequence's own id may serve the first path
        let rows = t.verify_rows(42, 100, 7, &[7, 8, 9]).unwrap();
        assert_eq!(rows[0].seq_ids, vec![7, 8, 9]);
        for bad in [&[7, 8][..], &[7, 7, 9], &[7, -1, 9], &[8, 3, 9]] {
            let e = t.verify_rows(42, 100, 3, bad).unwrap_err();
            assert_eq!(e.status, crate::error::Status::LLAMA_SPEC_DFLASH2_ERR_INVALID_ARGUMENT);
        }
        assert!(t.kv_commit(&[1, 3], 100, 3, &[7, 8, 9]).is_err()); // not a path
        assert!(t.kv_commit(&[2], 100, 3, &[7, 8, 9]).is_err()); // not from the anchor
        // a chain reusing the sequence's id: upstream's own calls
        let chain = Tree::from_nodes(vec![node(1, -1, 1), node(2, 0, 2), node(3, 1, 3)]).unwrap();
        assert_eq!(chain.kv_prepare(5, &[5]).unwrap(), vec![]);
        assert!(chain.verify_rows(0, 10, 5, &[5]).unwrap().iter().all(|r| r.seq_ids == vec![5]));
        assert_eq!(chain.kv_commit(&[0, 1], 10, 5, &[5]).unwrap(), vec![KvOp::SeqRm { seq: 5, p0: 13, p1: -1 }]);
    }

    /// llama.cpp's KV cells as far as trees touch them: positions, sequence
    /// sets, `seq_rm`/`seq_cp` in one stream, the batch checks of
    /// `llama_batch_allocr::init`, and the mask (first sequence id, causal).
    #[derive(Default)]
    struct Kv {
        cells: Vec<(usize, i32, BTreeSet<i32>)>, // (cell id, pos, seqs)
        next: usize,
    }

    impl Kv {
        fn add(&mut self, pos: i32, seqs: &[i32]) -> usize {
            self.next += 1;
            self.cells.push((self.next, pos, seqs.iter().copied().collect()));
            self.next
        }

        fn range(p: i32, p0: i32, p1: i32) -> bool {
            p >= p0.max(0) && (p1 < 0 || p < p1)
        }

        fn apply(&mut self, op: KvOp) {
            match op {
                KvOp::SeqRm { seq, p0, p1 } => {
                    for c in self.cells.iter_mut().filter(|c| Kv::range(c.1, p0, p1)) {
                        c.2.remove(&seq);
                    }
                    self.cells.retain(|c| !c.2.is_empty());
                }
                KvOp::SeqCp { src, dst, p0, p1 } => {
                    for c in self.cells.iter_mut().filter(|c| Kv::range(c.1, p0, p1) && c.2.contains(&src)) {
                        c.2.insert(dst);
                    }
                }
            }
        }

        fn pos_range(&self, s: i32) -> Option<(i32, i32)> {
            let ps = self.cells.iter().filter(|c| c.2.contains(&s)).map(|c| c.1);
            ps.clone().min().zip(ps.max())
        }

        /// Decodes rows (asserting llama.cpp would accept the batch); returns
        /// per row its cell id and the cell ids its query sees.
        fn decode(&mut self, rows: &[VerifyRow]) -> Vec<(usize, BTreeSet<usize>)> {
            let all: BTreeSet<i32> = rows.iter().flat_map(|r| r.seq_ids.iter().copied()).collect();
            for &s in &all {
                let pos: BTreeSet<i32> = rows.iter().filter(|r| r.seq_ids.contains(&s)).map(|r| r.pos).collect();
                let (lo, hi) = (*pos.first().unwrap(), *pos.last().unwrap());
                if let Some((_, max)) = self.pos_range(s) {
                    assert_eq!(lo, max + 1, "seq {s}: Y = X + 1");
                }
                assert_eq!((hi - lo + 1) as usize, pos.len(), "seq {s}: positions not continuous");
                let sets = rows.iter().filter(|r| r.seq_ids.contains(&s)).map(|r| r.seq_ids.iter().copied().collect());
                let common = sets.reduce(|a: BTreeSet<i32>, b| a.intersection(&b).copied().collect()).unwrap();
                assert!(!common.is_empty(), "seq {s}: incompatible sequence sets");
                let ordered: Vec<i32> = rows.iter().filter(|r| r.seq_ids.contains(&s)).map(|r| r.pos).collect();
                assert!(ordered.windows(2).all(|w| w[0] <= w[1]), "seq {s}: decreasing positions");
            }
            for r in rows {
                for &s1 in &r.seq_ids[1..] {
                    assert_eq!(
                        self.pos_range(r.seq_ids[0]),
                        self.pos_range(s1),
                        "coupled {} {s1} diverged",
                        r.seq_ids[0]
                    );
                }
            }
            let ids: Vec<usize> = rows.iter().map(|r| self.add(r.pos, &r.seq_ids)).collect();
            rows.iter()
                .zip(ids)
                .map(|(r, id)| {
                    let seen = self.cells.iter().filter(|c| c.2.contains(&r.seq_ids[0]) && c.1 <= r.pos).map(|c| c.0);
                    (id, seen.collect())
                })
                .collect()
        }
    }

    #[test]
    fn one_batch_masks_each_node_to_its_ancestors_and_the_commit_keeps_the_accepted_path() {
        let mut rng = Rng::new(3);
        let mut shapes = 0;
        for round in 0..400 {
            let (rows, n_embd, k) = random_block(&mut rng, 9, false);
            let lat = Lattice::new(&rows, n_embd, k).unwrap();
            let tree = grow_tree(&lat, TreeLimits::tree(1 + (rng.next_u64() % 12) as usize, 8), 9);
            let (n_past, seq) = (6, 2);
            let n_leaves = tree.leaves().len();
            shapes += (n_leaves > 1) as usize;
            // fresh path ids, or the sequence's own id for the first path
            let pool: Vec<i32> =
                (0..n_leaves as i32).map(|l| if round % 2 == 0 && l == 0 { seq } else { 10 + l }).collect();
            let mut kv = Kv::default();
            let prefix: Vec<usize> = (0..n_past).map(|p| kv.add(p, &[seq])).collect();
            let other = kv.add(0, &[1]); // another sequence's cell, never touched
            for op in tree.kv_prepare(seq, &pool).unwrap() {
                kv.apply(op);
            }
            let batch = tree.verify_rows(99, n_past, seq, &pool).unwrap();
            let seen = kv.decode(&batch);
            let cell = |row: usize| seen[row].0;
            let mut want: BTreeSet<usize> = prefix.iter().copied().chain([cell(0)]).collect();
            assert_eq!(seen[0].1, want, "anchor");
            for i in 0..tree.len() {
                want = prefix
                    .iter()
                    .copied()
                    .chain([cell(0)])
                    .chain(tree.path_to(i).iter().map(|&a| cell(a + 1)))
                    .collect();
                assert_eq!(seen[i + 1].1, want, "node {i} of {:?}", tree.nodes());
            }
            // accept a random path (the greedy verdict for random argmaxes)
            let argmax: Vec<i32> = (0..=tree.len()).map(|_| (rng.next_u64() % 9) as i32).collect();
            let v = accept_greedy(&tree, &argmax).unwrap();
            for op in tree.kv_commit(&v.path, n_past, seq, &pool).unwrap() {
                kv.apply(op);
            }
            let kept: Vec<(usize, i32)> = kv.cells.iter().filter(|c| c.2.contains(&seq)).map(|c| (c.0, c.1)).collect();
            let want: Vec<(usize, i32)> = (0..n_past)
                .map(|p| (prefix[p as usize], p))
                .chain([(cell(0), n_past)])
                .chain(v.path.iter().enumerate().map(|(d, &a)| (cell(a + 1), n_past + 1 + d as i32)))
                .collect();
            assert_eq!(kept, want);
            // nothing else is left but the other sequence's cell, and no path id
            assert_eq!(kv.cells.len(), want.len() + 1);
            assert!(kv.cells.iter().any(|c| c.0 == other));
            assert!(kv.cells.iter().all(|c| c.2.iter().all(|&s| s == seq || s == 1)));
            // and the next step's anchor fits: seq ends right before it
            assert_eq!(kv.pos_range(seq), Some((0, n_past + v.path.len() as i32)));
        }
        assert!(shapes > 100, "too few branching trees: {shapes}");
    }
}
