//! Greedy verification for the host: the target's argmax at each verify row,
//! the drafted tokens kept while they match, accept() done.

use super::Engine;
use crate::error::{Error, Result};

/// Index of the first maximum (a host's greedy sampler with `>`).
pub(super) fn argmax(logits: &[f32]) -> i32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate().skip(1) {
        if l > logits[best] {
            best = i;
        }
    }
    best as i32
}

impl Engine {
    /// The target's logits at verify rows `i_batch` of its last decode: each
    /// inside the batch and decoded with logits.
    pub(super) fn verify_logits(&self, i_batch: &[i32]) -> Result<Vec<&[f32]>> {
        let n_batch = self.target.n_batch() as i32;
        if let Some(&bad) = i_batch.iter().find(|&&i| i < 0 || i >= n_batch) {
            return Err(Error::invalid(format!("row index {bad} is outside the target's batch (n_batch {n_batch})")));
        }
        i_batch
            .iter()
            .map(|&row| {
                self.target.logits(row).ok_or_else(|| {
                    Error::invalid(format!(
                        "row {row} of the target's last decode has no logits (set batch.logits for it)"
                    ))
                })
            })
            .collect()
    }

    /// What every verify helper needs before it reads anything: the draft's
    /// verify rows reached process(), and `out_len` holds what may be emitted
    /// (the draft + 1). `what` names the call in the messages.
    pub(super) fn check_verify_rows(
        &self,
        s: usize,
        seq: i32,
        what: &str,
        n_drafted: usize,
        out_len: usize,
    ) -> Result<()> {
        let n_held = self.seqs[s].held.len();
        if n_drafted > 0 && n_held < n_drafted + 1 {
            return Err(Error::invalid_state(format!(
                "{what} of sequence {seq}: process() received {n_held} of the draft's {} verify rows; \
                 pass the decoded verify batch to llama_spec_dflash2_process() first",
                n_drafted + 1
            )));
        }
        if out_len < n_drafted + 1 {
            return Err(Error::buffer_too_small(format!(
                "{what} of sequence {seq} may emit {} tokens, the output holds {out_len}",
                n_drafted + 1
            )));
        }
        Ok(())
    }

    /// Verifies the outstanding draft of `seq` greedily against the logits
    /// of the target's last decode at rows `i_batch` (the anchor's row, then
    /// one per drafted token) and accepts the matching prefix. Writes the
    /// tokens the host emits this step into `out` (the accepted drafted tokens,
    /// then the target's token at the first mismatch or after the whole draft)
    /// and returns their count, n_accepted + 1.
    pub fn verify_greedy(&mut self, seq: i32, i_batch: &[i32], out: &mut [i32]) -> Result<usize> {
        let s = self.seq_index(seq)?;
        let Some(o) = self.seqs[s].outstanding.as_ref() else {
            return Err(Error::invalid_state(format!("verify on sequence {seq}, which has no draft to verify")));
        };
        if o.tree.is_some() {
            return Err(Error::invalid_state(format!(
                "sequence {seq}'s draft is a tree: call llama_spec_dflash2_verify_tree_greedy()"
            )));
        }
        let n_drafted = o.tokens.len();
        if i_batch.len() != n_drafted + 1 {
            return Err(Error::invalid(format!(
                "verify of sequence {seq}: {} rows for a draft of {n_drafted} tokens (pass {})",
                i_batch.len(),
                n_drafted + 1
            )));
        }
        self.check_verify_rows(s, seq, "verify", n_drafted, out.len())?;
        let logits = self.verify_logits(i_batch)?;
        let mut emitted = Vec::with_capacity(n_drafted + 1);
        let mut next = argmax(logits[0]);
        while emitted.len() < n_drafted && o.tokens[emitted.len()] == next {
            emitted.push(next);
            next = argmax(logits[emitted.len()]);
        }
        let n_accepted = emitted.len();
        emitted.push(next);
        self.accept(seq, n_accepted as i32)?;
        out[..emitted.len()].copy_from_slice(&emitted);
        Ok(emitted.len())
    }
}

#[cfg(test)]
mod tests {
    use super::argmax;

    #[test]
    fn argmax_takes_the_first_maximum() {
        assert_eq!(argmax(&[0.0, 2.0, 2.0, 1.0]), 1);
        assert_eq!(argmax(&[3.0]), 0);
    }
}
