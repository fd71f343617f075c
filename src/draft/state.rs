//! A stream's cells in a state blob, and back.
//!
//! Layout (little-endian): magic `DF2K`, format 1, then n_layer, n_embd_kv,
//! type_k, type_v, the number of cells n (all u32), the cells' positions
//! (n x u32, strictly increasing), then per layer the n K rows and the n V
//! rows. Loading checks every field against the cache before it writes
//! anything: a blob of another drafter, cache type or a forged one changes
//! nothing.

use super::kv::KvCache;
use crate::error::{Error, Result};

const MAGIC: &[u8; 4] = b"DF2K";
const FORMAT: u32 = 1;
const HEADER_WORDS: usize = 7;

pub fn size(kv: &KvCache, stream: usize) -> usize {
    let n = kv.used_cells(stream).len();
    let (rk, rv) = kv.row_bytes();
    4 * HEADER_WORDS + 4 * n + kv.n_layer() * n * (rk + rv)
}

fn header(kv: &KvCache, n: usize) -> [u32; HEADER_WORDS] {
    [u32::from_le_bytes(*MAGIC), FORMAT, kv.n_layer() as u32, kv.n_embd_kv as u32, kv.k(0).ty(), kv.v(0).ty(), n as u32]
}

/// Runs of consecutive cells: (first, count).
fn runs(cells: &[usize]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for &c in cells {
        match out.last_mut() {
            Some((first, n)) if *first + *n == c => *n += 1,
            _ => out.push((c, 1)),
        }
    }
    out
}

pub fn encode(kv: &KvCache, stream: usize, dst: &mut [u8]) -> Result<usize> {
    let cells = kv.used_cells(stream);
    let total = size(kv, stream);
    if dst.len() < total {
        return Err(Error::buffer_too_small("draft KV state"));
    }
    let mut at = 0;
    let mut put = |bytes: &[u8], at: &mut usize| {
        dst[*at..*at + bytes.len()].copy_from_slice(bytes);
        *at += bytes.len();
    };
    for w in header(kv, cells.len()) {
        put(&w.to_le_bytes(), &mut at);
    }
    for &c in &cells {
        put(&(c as u32).to_le_bytes(), &mut at);
    }
    let (rk, rv) = kv.row_bytes();
    for il in 0..kv.n_layer() {
        for (t, row) in [(kv.k(il), rk), (kv.v(il), rv)] {
            for (first, n) in runs(&cells) {
                t.read(kv.offset(row, stream, first), &mut dst[at..at + n * row])?;
                at += n * row;
            }
        }
    }
    Ok(at)
}

pub fn decode(kv: &mut KvCache, stream: usize, src: &[u8]) -> Result<usize> {
    let bad = |what: &str| Error::invalid(format!("draft KV state: {what}"));
    if stream >= kv.n_stream || src.len() < 4 * HEADER_WORDS {
        return Err(bad("too short"));
    }
    let word = |i: usize| u32::from_le_bytes(src[4 * i..4 * i + 4].try_into().expect("4 bytes"));
    let n = word(6) as usize;
    let mut expected = header(kv, n);
    expected[6] = word(6);
    if (0..HEADER_WORDS).any(|i| word(i) != expected[i]) {
        return Err(bad("another drafter, cache type or format"));
    }
    if n > kv.n_cells {
        return Err(bad("more cells than the cache holds"));
    }
    let (rk, rv) = kv.row_bytes();
    let total = 4 * HEADER_WORDS + 4 * n + kv.n_layer() * n * (rk + rv);
    if src.len() < total {
        return Err(bad("truncated"));
    }
    let cells: Vec<usize> = (0..n).map(|i| word(HEADER_WORDS + i) as usize).collect();
    if cells.iter().any(|&c| c >= kv.n_cells) || cells.windows(2).any(|w| w[0] >= w[1]) {
        return Err(bad("cell positions out of range or out of order"));
    }
    let mut at = 4 * HEADER_WORDS + 4 * n;
    for il in 0..kv.n_layer() {
        for (t, row) in [(kv.k(il), rk), (kv.v(il), rv)] {
            for (first, count) in runs(&cells) {
                t.write(kv.offset(row, stream, first), &src[at..at + count * row])?;
                at += count * row;
            }
        }
    }
    kv.set_used(stream, &cells);
    Ok(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_group_into_runs() {
        assert_eq!(runs(&[0, 1, 2, 5, 6, 9]), vec![(0, 3), (5, 2), (9, 1)]);
        assert!(runs(&[]).is_empty());
    }
}
