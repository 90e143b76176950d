//! Every kernel against the f64 reference: every SIMD path this CPU has, every mask, both layouts, each
//! dtype, awkward shapes (lengths no tile divides, Sq != Sk, odd and tiny and huge head dims, GQA 8:1,
//! a single head, decoding).

mod common;

use common::{backends, check, check_all_kernels, masks, spec};
use sdpa_core::{DType, Kernel, Layout, Mask, Shape};

/// The full matrix on one awkward GQA shape with Dv != D.
#[test]
fn every_path_kernel_mask_layout_and_dtype() {
    let shape = Shape { b: 2, hq: 4, hkv: 2, sq: 37, sk: 83, d: 40, dv: 24 };
    for be in backends() {
        for dtype in DType::ALL {
            for layout in [Layout::Bhsd, Layout::Bshd] {
                for mask in masks(&shape) {
                    check_all_kernels(&be, &spec(shape, dtype, mask, layout));
                }
            }
        }
    }
}

/// Shapes that stress tile edges, head-dim paths and work splitting; each runs on every path, every
/// kernel, f32 and bf16, causal (both alignments) and unmasked.
#[test]
fn awkward_shapes() {
    let shapes = [
        // D = 1 and a single key.
        Shape { b: 1, hq: 1, hkv: 1, sq: 1, sk: 1, d: 1, dv: 1 },
        Shape { b: 1, hq: 2, hkv: 1, sq: 9, sk: 5, d: 1, dv: 3 },
        // The fast head dims with ragged tiles, Sq != Sk both ways.
        Shape { b: 1, hq: 2, hkv: 2, sq: 130, sk: 67, d: 64, dv: 64 },
        Shape { b: 1, hq: 1, hkv: 1, sq: 65, sk: 200, d: 128, dv: 128 },
        // Odd head dims, Dv != D.
        Shape { b: 2, hq: 3, hkv: 3, sq: 21, sk: 70, d: 33, dv: 17 },
        // GQA 8:1 and a single (batch, head).
        Shape { b: 1, hq: 16, hkv: 2, sq: 19, sk: 45, d: 24, dv: 24 },
        Shape { b: 1, hq: 1, hkv: 1, sq: 100, sk: 100, d: 96, dv: 96 },
        // Long keys (taller query tiles on AVX-512) with a group spanning tiles.
        Shape { b: 1, hq: 2, hkv: 1, sq: 70, sk: 2050, d: 8, dv: 8 },
        // Decoding: one query against many keys, with GQA (the split-KV and dot-product paths).
        Shape { b: 1, hq: 8, hkv: 2, sq: 1, sk: 1000, d: 128, dv: 128 },
        Shape { b: 2, hq: 4, hkv: 4, sq: 3, sk: 517, d: 80, dv: 80 },
    ];
    for be in backends() {
        for shape in shapes {
            for dtype in [DType::F32, DType::BF16] {
                for mask in [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight] {
                    check_all_kernels(&be, &spec(shape, dtype, mask, Layout::Bhsd));
                }
            }
        }
    }
}

/// The largest head dim the backend accepts, with small sequence lengths (and Dv far from D).
#[test]
fn head_dim_8192() {
    for be in backends() {
        for (d, dv) in [(8192, 8192), (8192, 5), (3, 8192)] {
            let shape = Shape { b: 1, hq: 2, hkv: 1, sq: 3, sk: 7, d, dv };
            for kernel in [Kernel::Fa2, Kernel::Unfused, Kernel::SplitKv] {
                check(&be, &spec(shape, DType::F32, Mask::CausalBottomRight, Layout::Bshd), kernel);
            }
        }
    }
}

/// A longer sequence where causal tile skipping and several key tiles per row tile matter.
#[test]
fn longer_sequences() {
    let shape = Shape { b: 1, hq: 2, hkv: 1, sq: 300, sk: 300, d: 64, dv: 64 };
    for be in backends() {
        for mask in [Mask::None, Mask::CausalTopLeft] {
            for dtype in [DType::F32, DType::F16] {
                check_all_kernels(&be, &spec(shape, dtype, mask, Layout::Bshd));
            }
        }
    }
}

/// Decoding shapes (a few query rows per kv head: `splitkv` streams K and V in memory order) on both
/// layouts, every mask, every dtype, B > 1, GQA, key counts no block divides.
#[test]
fn decoding_every_layout_and_mask() {
    let shapes = [
        Shape { b: 2, hq: 4, hkv: 2, sq: 2, sk: 77, d: 40, dv: 24 },
        Shape { b: 1, hq: 3, hkv: 3, sq: 1, sk: 1000, d: 64, dv: 64 },
        Shape { b: 3, hq: 2, hkv: 1, sq: 1, sk: 33, d: 128, dv: 128 },
        // Two rows per kv head (the decoding path on AVX2 too), head dims with partial vectors.
        Shape { b: 1, hq: 2, hkv: 2, sq: 2, sk: 70, d: 20, dv: 13 },
    ];
    for be in backends() {
        for shape in shapes {
            for dtype in DType::ALL {
                for layout in [Layout::Bhsd, Layout::Bshd] {
                    for mask in masks(&shape) {
                        check_all_kernels(&be, &spec(shape, dtype, mask, layout));
                    }
                }
            }
        }
    }
}
