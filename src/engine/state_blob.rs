//! The per-sequence state blob: the position map, the queued rows, the
//! sequence's text (what n-gram branches match) and its draft KV bytes
//! (libllama's own sequence state), behind a header that ties it to the
//! drafter it came from. Sizes follow the sequence, not the context.
//!
//! Layout (little endian): magic "DF2S", u32 version, u32 draft graph (0: the
//! library's own, 1: libllama's: their KV bytes differ), u64 drafter
//! fingerprint, u32 n_feat, u32 n_in_kv, n_in_kv x (i32 target, i32 draft), u32 n_queued,
//! n_queued x i32 target, n_queued x n_feat f32, u32 n_text, n_text x (i32
//! target, i32 token), u64 kv length, kv bytes.

use super::row_queue::RowQueue;
use crate::config::DraftGraph;
use crate::error::{Error, Result};
use crate::ngram::TokenHistory;
use crate::positions::{Entry, MAX_TARGET_POS, SeqMap};

const MAGIC: &[u8; 4] = b"DF2S";
/// 2: the drafter fingerprint is computed from explicit checkpoint fields.
/// 3: the sequence's text (its committed tokens by position).
/// 4: the draft graph that wrote the KV bytes.
const VERSION: u32 = 4;

/// A decoded blob; `kv` borrows from the input.
#[derive(Debug)]
pub struct Decoded<'a> {
    pub map: SeqMap,
    pub queued: RowQueue,
    pub history: TokenHistory,
    pub kv: &'a [u8],
}

/// Bytes of the header and map for a sequence (without the KV bytes).
pub fn header_len(map: &SeqMap, queued: &RowQueue, history: &TokenHistory) -> usize {
    4 + 4
        + 4
        + 8
        + 4
        + 4
        + map.in_kv().len() * 8
        + 4
        + queued.len() * (4 + 4 * queued.n_feat())
        + 4
        + history.len() * 8
        + 8
}

/// Writes everything before the KV bytes; the caller appends `kv_len` bytes.
fn graph_code(graph: DraftGraph) -> u32 {
    match graph {
        DraftGraph::Own => 0,
        DraftGraph::Libllama => 1,
    }
}

pub fn encode_header(
    graph: DraftGraph,
    fingerprint: u64,
    map: &SeqMap,
    queued: &RowQueue,
    history: &TokenHistory,
    kv_len: usize,
) -> Vec<u8> {
    let n_feat = queued.n_feat();
    let mut b = Vec::with_capacity(header_len(map, queued, history));
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&graph_code(graph).to_le_bytes());
    b.extend_from_slice(&fingerprint.to_le_bytes());
    b.extend_from_slice(&(n_feat as u32).to_le_bytes());
    b.extend_from_slice(&(map.in_kv().len() as u32).to_le_bytes());
    for e in map.in_kv() {
        b.extend_from_slice(&e.target.to_le_bytes());
        b.extend_from_slice(&e.draft.to_le_bytes());
    }
    b.extend_from_slice(&(queued.len() as u32).to_le_bytes());
    for t in queued.targets() {
        b.extend_from_slice(&t.to_le_bytes());
    }
    for f in queued.features() {
        b.extend_from_slice(&f.to_le_bytes());
    }
    b.extend_from_slice(&(history.len() as u32).to_le_bytes());
    for (pos, token) in history.rows() {
        b.extend_from_slice(&pos.to_le_bytes());
        b.extend_from_slice(&token.to_le_bytes());
    }
    b.extend_from_slice(&(kv_len as u64).to_le_bytes());
    b
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.b.len() {
            return Err(Error::invalid("state blob is truncated"));
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }

    fn i32(&mut self) -> Result<i32> {
        Ok(self.u32()? as i32)
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }

    /// A count whose entries of `size` bytes must fit in what remains.
    fn count(&mut self, size: usize) -> Result<usize> {
        let n = self.u32()? as usize;
        if n.checked_mul(size).is_none_or(|b| b > self.b.len()) {
            return Err(Error::invalid("state blob is truncated or corrupt"));
        }
        Ok(n)
    }
}

/// Parses and checks a blob made by `encode_header` + KV bytes: everything a
/// live sequence holds must hold here too (see `SeqMap::from_parts`; queued
/// rows in range, after the map's rows, never going back), so a forged blob
/// cannot plant positions process() would refuse. `dense`: the engine's draft
/// cache shifts, so its draft positions run 0, 1, 2, ... without gaps.
pub fn decode(bytes: &[u8], graph: DraftGraph, fingerprint: u64, n_feat: usize, dense: bool) -> Result<Decoded<'_>> {
    let mut r = Reader { b: bytes };
    if r.take(4)? != MAGIC {
        return Err(Error::invalid("not a dflash2 sequence state (bad magic)"));
    }
    let version = r.u32()?;
    if version != VERSION {
        return Err(Error::invalid(format!(
            "state blob version {version}, this library reads {VERSION} (blobs of older versions hold no draft \
             graph: save the sequence again)"
        )));
    }
    let blob_graph = r.u32()?;
    if blob_graph != graph_code(graph) {
        let other = if blob_graph == graph_code(DraftGraph::Own) { "the library's own" } else { "libllama's" };
        return Err(Error::incompatible(format!(
            "state blob was saved by an engine on {other} draft graph (its draft KV bytes are that cache's); this \
             engine runs the {} graph",
            graph.name()
        )));
    }
    if r.u64()? != fingerprint {
        return Err(Error::incompatible("state blob was saved with a different drafter"));
    }
    let blob_feat = r.u32()? as usize;
    if blob_feat != n_feat {
        return Err(Error::incompatible(format!(
            "state blob holds {blob_feat}-float features, this engine uses {n_feat}"
        )));
    }
    let n_in_kv = r.count(8)?;
    let mut in_kv = Vec::with_capacity(n_in_kv);
    for _ in 0..n_in_kv {
        in_kv.push(Entry { target: r.i32()?, draft: r.i32()? });
    }
    let n_queued = r.count(4 + 4 * n_feat)?;
    let mut targets = Vec::with_capacity(n_queued);
    for _ in 0..n_queued {
        targets.push(r.i32()?);
    }
    let features: Vec<f32> =
        r.take(n_queued * n_feat * 4)?.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    let n_text = r.count(8)?;
    let mut text = Vec::with_capacity(n_text);
    for _ in 0..n_text {
        text.push((r.i32()?, r.i32()?));
    }
    let history = TokenHistory::from_rows(text).ok_or_else(|| Error::invalid("state blob holds a corrupt text"))?;
    let kv_len = r.u64()?;
    if kv_len != r.b.len() as u64 {
        return Err(Error::invalid("state blob is truncated or has trailing bytes"));
    }
    let map =
        SeqMap::from_parts(in_kv, dense).ok_or_else(|| Error::invalid("state blob holds a corrupt position map"))?;
    let mut last = map.in_kv().last().map_or(0, |e| e.target);
    for &t in &targets {
        if !(last..MAX_TARGET_POS).contains(&t) {
            return Err(Error::invalid(format!("state blob holds a queued row at target position {t}")));
        }
        last = t;
    }
    let queued = RowQueue::from_parts(n_feat, targets, features).expect("lengths read from the same counts");
    Ok(Decoded { map, queued, history, kv: r.b })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (SeqMap, RowQueue, TokenHistory) {
        let mut m = SeqMap::default();
        m.inject(&[0, 5]);
        let mut q = RowQueue::new(2);
        q.push(6, &[1.0, 2.0]);
        let h = TokenHistory::from_rows(vec![(0, 11), (5, 12), (6, -1)]).unwrap();
        (m, q, h)
    }

    fn blob(kv: &[u8]) -> Vec<u8> {
        let (m, q, h) = sample();
        let mut b = encode_header(DraftGraph::Own, 42, &m, &q, &h, kv.len());
        assert_eq!(b.len(), header_len(&m, &q, &h));
        b.extend_from_slice(kv);
        b
    }

    #[test]
    fn round_trips() {
        let b = blob(&[9, 9, 9]);
        let d = decode(&b, DraftGraph::Own, 42, 2, true).unwrap();
        assert_eq!(d.map, sample().0);
        assert_eq!(d.queued, sample().1);
        assert_eq!(d.history, sample().2);
        assert_eq!(d.kv, &[9, 9, 9]);
    }

    #[test]
    fn a_text_out_of_position_order_is_refused() {
        let (m, q, _) = sample();
        let h = TokenHistory::from_rows(vec![(0, 11), (5, 12)]).unwrap();
        let mut b = encode_header(DraftGraph::Own, 42, &m, &q, &h, 0);
        // the second text row's position, just before the kv length
        let at = b.len() - 8 - 8;
        b[at..at + 4].copy_from_slice(&0i32.to_le_bytes());
        assert!(decode(&b, DraftGraph::Own, 42, 2, true).unwrap_err().message.contains("text"));
    }

    #[test]
    fn another_drafter_or_a_cut_blob_is_refused() {
        let b = blob(&[9, 9, 9]);
        assert!(decode(&b, DraftGraph::Own, 43, 2, true).unwrap_err().message.contains("different drafter"));
        assert!(decode(&b, DraftGraph::Own, 42, 3, true).is_err());
        for cut in 0..b.len() {
            assert!(decode(&b[..cut], DraftGraph::Own, 42, 2, true).is_err(), "cut {cut}");
        }
        let mut long = b.clone();
        long.push(0);
        assert!(decode(&long, DraftGraph::Own, 42, 2, true).is_err());
    }

    #[test]
    fn a_blob_of_the_other_draft_graph_or_version_is_refused() {
        let b = blob(&[9, 9, 9]);
        let err = decode(&b, DraftGraph::Libllama, 42, 2, true).unwrap_err();
        assert!(err.message.contains("the library's own draft graph"), "{}", err.message);
        let mut old = b.clone();
        old[4..8].copy_from_slice(&3u32.to_le_bytes());
        let err = decode(&old, DraftGraph::Own, 42, 2, true).unwrap_err();
        assert!(err.message.contains("version 3"), "{}", err.message);
    }

    #[test]
    fn huge_counts_are_refused_before_allocating() {
        let mut b = blob(&[]);
        // n_in_kv sits after magic, version, graph, fingerprint, n_feat
        b[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&b, DraftGraph::Own, 42, 2, true).is_err());
    }

    #[test]
    fn positions_a_live_sequence_cannot_hold_are_refused() {
        let forge = |in_kv: &[(i32, i32)], queued: &[i32]| {
            let mut m = SeqMap::default();
            let targets: Vec<i32> = in_kv.iter().map(|e| e.0).collect();
            m.inject(&targets);
            let mut b = encode_header(DraftGraph::Own, 42, &m, &RowQueue::new(2), &TokenHistory::default(), 0);
            // rewrite the entries as forged, then append the queued rows
            for (i, &(t, d)) in in_kv.iter().enumerate() {
                b[28 + i * 8..32 + i * 8].copy_from_slice(&t.to_le_bytes());
                b[32 + i * 8..36 + i * 8].copy_from_slice(&d.to_le_bytes());
            }
            let at = 28 + in_kv.len() * 8;
            b.truncate(at);
            b.extend_from_slice(&(queued.len() as u32).to_le_bytes());
            for t in queued {
                b.extend_from_slice(&t.to_le_bytes());
            }
            b.extend(std::iter::repeat_n(0u8, queued.len() * 8));
            b.extend_from_slice(&0u32.to_le_bytes()); // no text
            b.extend_from_slice(&0u64.to_le_bytes());
            b
        };
        assert!(decode(&forge(&[(0, 0), (1, 1)], &[2]), DraftGraph::Own, 42, 2, true).is_ok());
        for (in_kv, queued) in [
            (vec![(-1, 0)], vec![]),
            (vec![(i32::MAX, 0)], vec![]),
            (vec![(i32::MIN, 0)], vec![]),
            (vec![(5, 0), (3, 1)], vec![]),
            (vec![(0, 1)], vec![]),
            (vec![(0, 0), (1, 2)], vec![]),
            (vec![(4, 0)], vec![3]),
            (vec![(0, 0)], vec![-1]),
            (vec![(0, 0)], vec![MAX_TARGET_POS]),
        ] {
            assert!(decode(&forge(&in_kv, &queued), DraftGraph::Own, 42, 2, true).is_err(), "{in_kv:?} {queued:?}");
        }
        // a cache that cannot shift keeps gaps
        assert!(decode(&forge(&[(0, 0), (1, 2)], &[]), DraftGraph::Own, 42, 2, false).is_ok());
    }
}
