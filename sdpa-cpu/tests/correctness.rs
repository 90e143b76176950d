//! Every kernel against the f64 reference: every SIMD path this CPU has, every mask, both layouts, each
//! dtype, awkward shapes (lengths no tile divides, Sq != Sk, odd and tiny and huge head dims, GQA 8:1,
//! a single head, decoding).

mod common;

use common::{backends, check, check_all_kernels, masks, spec};
use sdpa_core::{Alibi, AttentionSpec, DType, Diagonal, ExplicitMask, Kernel, Layout, Mask, MaskValues, Shape, Window};

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
        // AVX2's tiles (48-row items, 6-row P·V tiles, 6-key score tiles with a 4-key edge): a group of
        // 159 rows (three items and a 15-row rest: 6 + 6 + 3), MLA's 192/128, key tiles of 64 = 10 x 6 + 4
        // and 6; then D = 256 with Dv = 41 (two 2-vector chunks, a whole and a partial last vector) and
        // 58 keys (9 x 6 + 4).
        Shape { b: 1, hq: 3, hkv: 1, sq: 53, sk: 70, d: 192, dv: 128 },
        Shape { b: 1, hq: 1, hkv: 1, sq: 50, sk: 58, d: 256, dv: 41 },
        // AVX-512's 8 x 3 P·V tile for the last 33..48 columns, whole (Dv = 48) and partial (Dv = 40), and
        // K tiles widened at stride D (D = 40, no multiple of any vector width).
        Shape { b: 1, hq: 2, hkv: 1, sq: 45, sk: 77, d: 40, dv: 48 },
        Shape { b: 1, hq: 2, hkv: 1, sq: 45, sk: 77, d: 48, dv: 40 },
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

/// Windows, softcap and ALiBi (sdpa-core's `variants`) with masks: windows narrower than a tile, wider than
/// Sk, one-sided either way, with no mask (each diagonal named), with either causal alignment and with an
/// explicit mask on top; softcap and ALiBi alone and all three together.
fn variant_cases(shape: &Shape) -> Vec<AttentionSpec> {
    let base = |mask: Mask| AttentionSpec::new(*shape, DType::F32).with_mask(mask);
    let additive = Mask::Explicit(ExplicitMask { values: MaskValues::Additive, dims: [1, shape.hq, 1, shape.sk] });
    let boolean = Mask::Explicit(ExplicitMask::full(MaskValues::Boolean, shape));
    let w = |left: Option<usize>, right: Option<usize>| Window { left, right };
    vec![
        base(Mask::CausalTopLeft).with_window(Window::left(5)),
        base(Mask::CausalBottomRight).with_window(Window::left(17)),
        base(Mask::None).with_window(w(Some(3), Some(2))).with_diagonal(Diagonal::TopLeft),
        base(Mask::None).with_window(w(Some(500), Some(500))).with_diagonal(Diagonal::BottomRight),
        base(Mask::None).with_window(w(Some(9), None)).with_diagonal(Diagonal::BottomRight),
        base(Mask::None).with_window(w(None, Some(4))).with_diagonal(Diagonal::TopLeft),
        base(additive).with_window(w(Some(20), Some(0))).with_diagonal(Diagonal::BottomRight),
        base(boolean).with_window(w(Some(6), Some(6))).with_diagonal(Diagonal::TopLeft),
        base(Mask::CausalBottomRight).with_softcap(5.0),
        base(Mask::None).with_softcap(30.0).with_scale(8.0),
        base(Mask::None).with_alibi(Alibi::Standard).with_diagonal(Diagonal::TopLeft),
        base(Mask::CausalTopLeft)
            .with_window(w(Some(11), Some(0)))
            .with_softcap(2.5)
            .with_alibi(Alibi::Slopes((0..shape.hq).map(|h| 0.05 + 0.3 * h as f32).collect())),
        base(Mask::None)
            .with_window(w(Some(7), Some(30)))
            .with_softcap(10.0)
            .with_alibi(Alibi::Standard)
            .with_diagonal(Diagonal::BottomRight),
    ]
}

/// Every variant case on every path, kernel, dtype and layout, on an awkward GQA shape (Sq < Sk) and its
/// transpose (Sq > Sk: bottom-right windows leave the first rows empty).
#[test]
fn variants_every_path_kernel_layout_and_dtype() {
    for shape in [
        Shape { b: 2, hq: 4, hkv: 2, sq: 37, sk: 83, d: 40, dv: 24 },
        Shape { b: 1, hq: 4, hkv: 1, sq: 83, sk: 37, d: 16, dv: 16 },
    ] {
        for case in variant_cases(&shape) {
            for be in backends() {
                for dtype in DType::ALL {
                    for layout in [Layout::Bhsd, Layout::Bshd] {
                        let mut s = case.clone().with_layout(layout);
                        s.dtype = dtype;
                        check_all_kernels(&be, &s);
                    }
                }
            }
        }
    }
}

/// Windows over longer sequences, where whole key tiles fall outside the band on both sides (the kernels
/// skip them) and the window edges cut tiles at every offset; decoding shapes (the split-KV streaming
/// path) with windows much shorter than Sk.
#[test]
fn windows_skip_tiles_and_decode() {
    let cases = [
        (Shape { b: 1, hq: 2, hkv: 1, sq: 300, sk: 300, d: 64, dv: 64 }, Window::left(40), Mask::CausalTopLeft),
        (Shape { b: 1, hq: 2, hkv: 2, sq: 200, sk: 2100, d: 8, dv: 8 }, Window::left(100), Mask::CausalBottomRight),
        (
            Shape { b: 1, hq: 1, hkv: 1, sq: 130, sk: 130, d: 32, dv: 32 },
            Window { left: Some(70), right: Some(65) },
            Mask::None,
        ),
        (Shape { b: 2, hq: 8, hkv: 2, sq: 1, sk: 1000, d: 128, dv: 128 }, Window::left(100), Mask::CausalBottomRight),
        (Shape { b: 1, hq: 4, hkv: 4, sq: 3, sk: 517, d: 80, dv: 80 }, Window::left(63), Mask::CausalBottomRight),
    ];
    for be in backends() {
        for (shape, window, mask) in cases {
            for dtype in [DType::F32, DType::BF16] {
                for layout in [Layout::Bhsd, Layout::Bshd] {
                    let mut s = spec(shape, dtype, mask, layout).with_window(window);
                    if !mask.is_causal() {
                        s = s.with_diagonal(Diagonal::BottomRight);
                    }
                    check_all_kernels(&be, &s);
                }
            }
        }
    }
}

/// ALiBi with thousands of keys (biases in the hundreds far from the diagonal), standard slopes and given
/// ones (zero and negative included), both diagonals, with and without a causal mask or window; decoding
/// too.
#[test]
fn alibi_with_long_keys() {
    let shapes = [
        Shape { b: 1, hq: 4, hkv: 2, sq: 40, sk: 3000, d: 16, dv: 16 },
        Shape { b: 1, hq: 8, hkv: 2, sq: 1, sk: 4000, d: 64, dv: 64 },
    ];
    for be in backends() {
        for shape in shapes {
            let given = Alibi::Slopes((0..shape.hq).map(|h| [0.0, 0.5, -0.01, 0.003][h % 4]).collect());
            for dtype in [DType::F32, DType::BF16] {
                for (mask, alibi, diag, window) in [
                    (Mask::None, Alibi::Standard, Some(Diagonal::BottomRight), None),
                    (Mask::None, given.clone(), Some(Diagonal::TopLeft), None),
                    (Mask::CausalBottomRight, Alibi::Standard, None, Some(Window::left(700))),
                    (Mask::CausalTopLeft, given.clone(), None, None),
                ] {
                    let mut s = spec(shape, dtype, mask, Layout::Bshd).with_alibi(alibi);
                    s.variants.diagonal = diag;
                    s.variants.window = window;
                    check_all_kernels(&be, &s);
                }
            }
        }
    }
}
