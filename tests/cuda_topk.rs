//! The CUDA top-k kernel (`cuda/topk.cu`, crate feature `cuda`): NVRTC
//! compiles it to PTX (no GPU needed: CI runs this with PyPI's NVRTC, see
//! scripts/cuda-check.sh); on a CUDA device its results equal the CPU
//! reference (`dflash2::topk`) on random and adversarial rows.
#![cfg(feature = "cuda")]

use dflash2::cuda::{self, TopK};
use dflash2::topk::{self, Scored};

#[test]
fn nvrtc_compiles_the_kernel_to_ptx() {
    assert!(
        cuda::nvrtc_available(),
        "NVRTC cannot be loaded: put a CUDA toolkit's or PyPI nvidia-cuda-nvrtc-cu12's lib/ on LD_LIBRARY_PATH \
         (scripts/cuda-check.sh does)"
    );
    for arch in [None, Some("compute_80"), Some("compute_90")] {
        let ptx = cuda::compile_ptx(arch).unwrap_or_else(|e| panic!("{arch:?}: {}", e.message));
        let text = ptx.to_src();
        assert!(text.contains(".entry dflash2_topk_f32"), "{arch:?}: no entry point in the PTX");
        if let Some(a) = arch {
            assert!(text.contains(&format!(".target sm_{}", &a["compute_".len()..])), "{arch:?}: target");
        }
        eprintln!("PTX for {}: {} bytes", arch.unwrap_or("NVRTC's default arch"), text.len());
    }
}

#[test]
fn the_kernel_loads_where_a_driver_is_and_says_why_not_elsewhere() {
    match TopK::new(0) {
        Ok(_) => assert!(cuda::driver_available()),
        Err(e) if !cuda::driver_available() => assert!(e.message.contains("no CUDA driver"), "{}", e.message),
        Err(e) => panic!("a CUDA driver is here but the kernel did not load on device 0: {}", e.message),
    }
}

fn same(a: &[Scored], b: &[Scored]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.0 == y.0 && x.1.to_bits() == y.1.to_bits())
}

#[test]
#[ignore = "needs a CUDA device: scripts/cuda-check.sh --gpu runs it"]
fn the_kernel_equals_the_cpu_top_k_on_a_gpu() {
    let kernel = TopK::new(0).unwrap_or_else(|e| panic!("{}", e.message));
    let mut rows = topk::adversarial_rows();
    // wide rows of a vocabulary's size, a slice's size, and rows of many equal values
    let mut x = 12345u64;
    for n in [151_936usize, 75_968, 32_000, 257] {
        rows.push(
            (0..n)
                .map(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((x >> 40) % 4096) as f32 / 64.0 - 30.0
                })
                .collect(),
        );
    }
    let mut checked = 0;
    for row in rows.iter().filter(|r| !r.is_empty()) {
        for k in [1usize, 2, 8, 16] {
            // the same row three times: a multi-row launch
            let n = row.len();
            let batch: Vec<f32> = (0..3).flat_map(|_| row.iter().copied()).collect();
            let got = kernel.run_host(&batch, n, k).unwrap_or_else(|e| panic!("{}", e.message));
            let want = topk::top_k(row, k, 0);
            for g in &got {
                assert!(same(g, &want), "row of {n}, k {k}: kernel {g:?}, cpu {want:?}");
            }
            checked += 1;
        }
    }
    assert!(kernel.run_host(&[1.0; 10], 10, cuda::MAX_K + 1).is_err(), "k above MAX_K must be refused");
    eprintln!("{checked} row shapes x k equal to the CPU reference");
}
