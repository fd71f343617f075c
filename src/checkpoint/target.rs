//! Whether a drafter fits a target model.

use crate::error::{Error, Result};

use super::Checkpoint;

/// What the check needs to know about the target model: read through
/// libllama, so defined where libllama is read (`sys`), plain data.
pub use crate::sys::TargetFacts;

/// Target architectures whose graph in the pinned llama.cpp registers layer
/// inputs (`t_layer_inp`), with whether it also registers the output of the last
/// block (`lid == n_layer`). Capturing a layer the graph does not register makes
/// libllama abort, so a drafter may only tap what is listed here.
const CAPTURING_ARCHITECTURES: &[(&str, bool)] = &[
    ("llama", false),
    ("llama-embed", false),
    ("qwen3", false),
    ("qwen3moe", false),
    ("qwen3next", false),
    ("qwen35", false),
    ("qwen35moe", false),
    ("qwen4exp", false),
    ("gemma4", false),
    ("gpt-oss", false),
    ("hunyuan_vl", false),
    ("lfm2", false),
    ("minimax-01", false),
    ("minimax-m2", false),
    ("muse-glimmer", false),
    ("nanbeige", false),
    ("bailingmoe3", false),
    ("deepseek4", true),
    ("nemotron_h", true),
    ("mimo2", true),
];

/// `Some(captures_last_block_output)` when the architecture exposes layer inputs.
pub fn architecture_captures_layer_inputs(arch: &str) -> Option<bool> {
    CAPTURING_ARCHITECTURES.iter().find(|(a, _)| *a == arch).map(|&(_, last)| last)
}

/// Checks that the drafter was made for this target: same hidden size and
/// vocabulary, tap layers the target's graph can capture.
pub fn check_target(ckpt: &Checkpoint, target: &TargetFacts) -> Result<()> {
    let hp = &ckpt.hparams;
    let Some(captures_last) = architecture_captures_layer_inputs(&target.architecture) else {
        let names: Vec<&str> = CAPTURING_ARCHITECTURES.iter().map(|(a, _)| *a).collect();
        return Err(Error::unsupported(format!(
            "target architecture '{}' does not expose layer inputs in this llama.cpp, so it cannot \
             feed a DFlash2 drafter (supported: {})",
            target.architecture,
            names.join(", ")
        )));
    };
    if hp.n_embd != target.n_embd {
        return Err(Error::incompatible(format!(
            "drafter n_embd {} differs from the target's {}: drafter made for another target",
            hp.n_embd, target.n_embd
        )));
    }
    if hp.n_vocab != target.n_vocab {
        return Err(Error::incompatible(format!(
            "drafter vocabulary ({} tokens) differs from the target's ({}): drafter made for another target",
            hp.n_vocab, target.n_vocab
        )));
    }
    let max_tap = if captures_last { target.n_layer } else { target.n_layer.saturating_sub(1) };
    if let Some(&bad) = hp.target_layers.iter().find(|&&l| l as u32 > max_tap) {
        return Err(Error::incompatible(format!(
            "drafter taps target layer {bad}, but '{}' with {} layers exposes layer inputs 0..={max_tap}",
            target.architecture, target.n_layer
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::Hparams;

    fn ckpt(taps: Vec<i32>) -> Checkpoint {
        Checkpoint {
            hparams: Hparams {
                n_embd: 64,
                n_layer: 1,
                n_head: 4,
                n_head_kv: 2,
                head_dim: 16,
                n_ff: vec![128],
                n_vocab: 100,
                target_layers: taps,
                selector_rank: 8,
                selector_top_k: 4,
                conv_kernel: 2,
                conv_group: 16,
            },
            block_size: 4,
            n_vocab_draft: 100,
            mask_token: 3,
            n_ctx_train: 256,
            n_swa: 0,
            swa_layers: Vec::new(),
            causal: false,
            mrope: false,
            own_embd: false,
            own_head: false,
            weight_bytes: 0,
            selector: true,
            forward: Default::default(),
        }
    }

    fn llama(n_layer: u32) -> TargetFacts {
        TargetFacts { architecture: "llama".into(), n_embd: 64, n_layer, n_vocab: 100 }
    }

    #[test]
    fn matching_target_passes() {
        check_target(&ckpt(vec![0, 3]), &llama(4)).unwrap();
    }

    #[test]
    fn tap_past_the_last_registered_layer_input_is_incompatible() {
        let err = check_target(&ckpt(vec![1, 4]), &llama(4)).unwrap_err();
        assert_eq!(err.status, crate::error::Status::LLAMA_SPEC_DFLASH2_ERR_INCOMPATIBLE);
        assert!(err.message.contains("layer 4"), "{}", err.message);
    }

    #[test]
    fn architectures_that_register_the_last_block_output_allow_tap_n_layer() {
        let t = TargetFacts { architecture: "deepseek4".into(), ..llama(4) };
        check_target(&ckpt(vec![4]), &t).unwrap();
    }

    #[test]
    fn architecture_without_capture_is_unsupported() {
        let t = TargetFacts { architecture: "gpt2".into(), ..llama(4) };
        let err = check_target(&ckpt(vec![1]), &t).unwrap_err();
        assert_eq!(err.status, crate::error::Status::LLAMA_SPEC_DFLASH2_ERR_UNSUPPORTED);
        assert!(err.message.contains("gpt2"));
    }

    #[test]
    fn other_hidden_size_or_vocabulary_is_incompatible() {
        let t = TargetFacts { n_embd: 96, ..llama(4) };
        assert!(check_target(&ckpt(vec![1]), &t).unwrap_err().message.contains("n_embd"));
        let t = TargetFacts { n_vocab: 101, ..llama(4) };
        assert!(check_target(&ckpt(vec![1]), &t).unwrap_err().message.contains("vocabulary"));
    }
}
