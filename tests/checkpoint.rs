//! The checkpoint check through the C API, on real files.

mod common;

use std::ptr;

use common::{Model, cstr, fixtures, last_error, smollm2, status_code};
use dflash2::ffi::{
    llama_spec_dflash2_checkpoint_check, llama_spec_dflash2_checkpoint_info, llama_spec_dflash2_is_dflash2,
};

fn check(path: &std::path::Path, target: Option<&Model>) -> (i32, Option<llama_spec_dflash2_checkpoint_info>) {
    let mut info = std::mem::MaybeUninit::<llama_spec_dflash2_checkpoint_info>::zeroed();
    let tgt = target.map_or(ptr::null(), |m| m.0 as *const _);
    let rc = unsafe { llama_spec_dflash2_checkpoint_check(cstr(path).as_ptr(), tgt, info.as_mut_ptr()) };
    (rc, (rc == 0).then(|| unsafe { info.assume_init() }))
}

#[test]
fn fixture_drafter_is_accepted_with_its_declared_layout() {
    let fx = fixtures();
    let target = Model::load(&fx.target);
    let (rc, info) = check(&fx.drafter, Some(&target));
    assert_eq!(rc, 0, "{}", last_error());
    let info = info.unwrap();
    assert_eq!((info.n_embd, info.n_layer, info.n_head, info.n_head_kv, info.head_dim), (64, 1, 4, 2, 16));
    assert_eq!((info.block_size, info.selector_top_k, info.selector_rank), (4, 4, 8));
    assert_eq!((info.conv_kernel_size, info.conv_group_size), (2, 16));
    assert_eq!(&info.target_layers[..info.n_target_layers as usize], &[1, 3]);
    assert_eq!((info.mask_token, info.n_swa), (3, 0));
    assert!(!info.own_embd && !info.own_head && !info.causal && !info.mrope);
    assert_eq!(info.n_vocab, info.n_vocab_draft);
}

#[test]
fn swa_and_own_head_variants_report_themselves() {
    let fx = fixtures();
    let (rc, info) = check(&fx.drafter_swa, None);
    assert_eq!(rc, 0, "{}", last_error());
    assert_eq!(info.unwrap().n_swa, 8);
    let (rc, info) = check(&fx.drafter_own_head, None);
    assert_eq!(rc, 0, "{}", last_error());
    let info = info.unwrap();
    assert!(info.own_embd && info.own_head);
}

#[test]
fn every_broken_fixture_is_refused_with_its_reason() {
    let fx = fixtures();
    let target = Model::load(&fx.target);
    assert!(fx.broken.len() >= 15);
    for b in &fx.broken {
        let (rc, info) = check(&b.path, b.with_target.then_some(&target));
        let msg = last_error();
        assert_eq!(rc, status_code(b.status), "{}: {msg}", b.path.display());
        assert!(info.is_none());
        assert!(msg.contains(b.needle), "{}: '{msg}' lacks '{}'", b.path.display(), b.needle);
        if b.with_target {
            // the same file alone is a valid checkpoint: the target is what it does not fit
            assert_eq!(check(&b.path, None).0, 0, "{}: {}", b.path.display(), last_error());
        }
    }
}

#[test]
fn truncation_at_any_cut_point_is_an_error_not_a_crash() {
    let fx = fixtures();
    let bytes = std::fs::read(&fx.drafter).unwrap();
    let dir = tempdir("cuts");
    // every byte of the header, then a spread of cuts through the tensor data
    let header_end = 24 + 8 * 1024;
    let mut cuts: Vec<usize> = (0..header_end.min(bytes.len())).step_by(7).collect();
    cuts.extend((header_end..bytes.len()).step_by(bytes.len() / 97));
    cuts.push(bytes.len() - 1);
    for cut in cuts {
        let p = dir.join("cut.gguf");
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let (rc, _) = check(&p, None);
        assert_eq!(rc, status_code("BAD_CHECKPOINT"), "cut at {cut}: {}", last_error());
    }
}

#[test]
fn missing_files_null_paths_and_folders_are_errors() {
    let (rc, _) = check(std::path::Path::new("/nonexistent/drafter.gguf"), None);
    assert_eq!(rc, status_code("IO"));
    assert!(last_error().contains("/nonexistent/drafter.gguf"));
    let rc = unsafe { llama_spec_dflash2_checkpoint_check(ptr::null(), ptr::null(), ptr::null_mut()) };
    assert_eq!(rc, status_code("NULL_ARGUMENT"));
    assert!(last_error().contains("path_draft"));
    let (rc, _) = check(&tempdir("folder"), None);
    assert_eq!(rc, status_code("IO"));
}

#[test]
fn is_dflash2_sniffs_without_validating() {
    let fx = fixtures();
    let yes = |p: &std::path::Path| unsafe { llama_spec_dflash2_is_dflash2(cstr(p).as_ptr()) };
    assert!(yes(&fx.drafter));
    assert!(!yes(&fx.target));
    assert!(!yes(std::path::Path::new("/nonexistent")));
    assert!(!unsafe { llama_spec_dflash2_is_dflash2(ptr::null()) });
}

#[test]
fn generated_drafter_for_smollm2_passes_against_smollm2() {
    let target_path = smollm2();
    let out = tempdir("smol").join("smollm2-dflash2-generated.gguf");
    let spec = dflash2_fixtures::drafter_for_target(&target_path, &out, &Default::default()).unwrap();
    let target = Model::load(&target_path);
    let (rc, info) = check(&out, Some(&target));
    assert_eq!(rc, 0, "{}", last_error());
    let info = info.unwrap();
    assert_eq!((info.n_embd, info.n_vocab, info.block_size), (576, 49152, 8));
    assert_eq!(&info.target_layers[..info.n_target_layers as usize], spec.target_layers.as_slice());
    // a drafter for the fixture target is refused by SmolLM2
    let (rc, _) = check(&fixtures().drafter, Some(&target));
    assert_eq!(rc, status_code("INCOMPATIBLE"), "{}", last_error());
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let d = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
