//! The AMX path (`SimdPath::Amx`) on the real tile unit: bf16 against the f64 reference at the head dims
//! and GQA groups models use, every mask, both layouts, LSE, on NaN-poisoned outputs (the common helper).
//! The other suites (correctness, nonfinite, ragged_kernels, semantics, regression, backward) also run
//! every supported path, so on a CPU with AMX they cover it too.
//!
//! Where AMX cannot run (the CPU lacks it, or the OS refuses the tile permission) each test prints why
//! and passes; `SDPA_REQUIRE_AMX=1` turns that skip into a failure (for runs on a machine that has AMX).

mod common;

use common::{backend, check_all_kernels, masks, spec};
use sdpa_core::{DType, Layout, Shape};
use sdpa_cpu::SimdPath;

/// True when the AMX path runs here; otherwise prints why (or fails under `SDPA_REQUIRE_AMX=1`).
fn amx_here(test: &str) -> bool {
    match sdpa_cpu::amx_status() {
        Ok(()) => true,
        Err(why) => {
            assert!(
                std::env::var("SDPA_REQUIRE_AMX").map_or(true, |v| v.trim() != "1"),
                "{test}: SDPA_REQUIRE_AMX=1 but the AMX path cannot run: {why}"
            );
            eprintln!("{test}: skipped, the AMX path cannot run here: {why}");
            false
        }
    }
}

/// Where AMX runs it is the path chosen by default, and `supported_paths` lists it first.
#[test]
fn amx_is_detected_first_where_it_runs() {
    if !amx_here("amx_is_detected_first_where_it_runs") {
        assert_ne!(SimdPath::detect(), SimdPath::Amx);
        return;
    }
    assert_eq!(SimdPath::detect(), SimdPath::Amx);
    assert_eq!(sdpa_cpu::supported_paths().first(), Some(&SimdPath::Amx));
}

/// bf16 on the tile unit: head dims 32..256 (odd and tile-unaligned ones too), Dv != D, GQA 1/4/8, every
/// mask kind, both layouts; every kernel held to twice the unfused kernel's error.
#[test]
fn bf16_head_dims_gqa_masks_layouts() {
    if !amx_here("bf16_head_dims_gqa_masks_layouts") {
        return;
    }
    let be = backend(SimdPath::Amx);
    let shapes = [
        Shape { b: 1, hq: 2, hkv: 2, sq: 130, sk: 197, d: 128, dv: 128 },
        Shape { b: 2, hq: 4, hkv: 1, sq: 45, sk: 70, d: 64, dv: 64 },
        Shape { b: 1, hq: 8, hkv: 1, sq: 33, sk: 100, d: 80, dv: 80 },
        Shape { b: 1, hq: 2, hkv: 1, sq: 70, sk: 61, d: 192, dv: 128 },
        Shape { b: 1, hq: 1, hkv: 1, sq: 64, sk: 300, d: 256, dv: 256 },
        Shape { b: 1, hq: 2, hkv: 2, sq: 50, sk: 50, d: 33, dv: 17 },
        Shape { b: 1, hq: 2, hkv: 2, sq: 40, sk: 90, d: 32, dv: 32 },
    ];
    for shape in shapes {
        for layout in [Layout::Bhsd, Layout::Bshd] {
            for mask in masks(&shape) {
                check_all_kernels(&be, &spec(shape, DType::BF16, mask, layout));
            }
        }
    }
}

/// Long key ranges take the tall item tiles (Sk >= 2048): several key blocks and row groups per item.
#[test]
fn bf16_long_keys() {
    if !amx_here("bf16_long_keys") {
        return;
    }
    let be = backend(SimdPath::Amx);
    let shape = Shape { b: 1, hq: 2, hkv: 1, sq: 300, sk: 2500, d: 128, dv: 128 };
    for mask in masks(&shape).into_iter().take(3) {
        check_all_kernels(&be, &spec(shape, DType::BF16, mask, Layout::Bshd));
    }
}
