//! The edge semantics every backend shares (DESIGN.md, "Semantics"): fully masked rows give zeros and
//! LSE = -inf, NaN in Q reaches only its own rows, masked keys take no part; and the slice-level entry.

mod common;

use common::check_all_kernels;
use common::{backends, check_inputs, spec, THREADS};
use half::bf16;
use sdpa_core::check::check_output;
use sdpa_core::{
    mask_from_bool, Alibi, AttentionSpec, DType, Diagonal, ExplicitMask, F32Math, HostBackend, HostBuffer, HostInputs,
    HostOutput, Kernel, Layout, Mask, MaskValues, RunOptions, Shape, Variant, Window,
};
use sdpa_cpu::attention;

const KERNELS: [Kernel; 4] = [Kernel::Unfused, Kernel::Fa2, Kernel::SplitKv, Kernel::Auto];

#[test]
fn fully_masked_rows_are_zero_with_lse_minus_inf() {
    // Bottom-right with Sq > Sk: the first Sq - Sk rows see no key.
    let shape = Shape { b: 1, hq: 2, hkv: 1, sq: 40, sk: 9, d: 16, dv: 8 };
    // An explicit mask that removes every key of some rows (every third query position).
    let full = ExplicitMask::full(MaskValues::Boolean, &Shape { sk: 70, ..shape });
    let eshape = Shape { sk: 70, ..shape };
    let keep: Vec<bool> = (0..2 * 40 * 70).map(|x| (x / 70) % 3 != 0 && x % 5 != 0).collect();
    for be in backends() {
        for kernel in KERNELS {
            let s = spec(shape, DType::F32, Mask::CausalBottomRight, Layout::Bhsd);
            let inp = HostInputs::random(&s, 1).unwrap();
            check_inputs(&be, &s, kernel, &inp);
            let run = be.run_host(&s, &RunOptions { kernel, lse: true, ..Default::default() }, &inp).unwrap();
            let lse = run.output.lse.unwrap();
            for i in 0..31 {
                assert_eq!(lse[i], f32::NEG_INFINITY, "{} {kernel} row {i}", be.simd());
                assert!((0..8).all(|c| run.output.o.get_f32(i * 8 + c) == 0.0), "{} {kernel} row {i}", be.simd());
            }

            let s = spec(eshape, DType::BF16, Mask::Explicit(full), Layout::Bshd);
            let mut inp = HostInputs::random(&s, 2).unwrap();
            inp.mask = Some(mask_from_bool(&keep));
            let rep = check_inputs(&be, &s, kernel, &inp);
            assert_eq!(rep.nan_mismatches, 0);
        }
    }
}

/// The decoding path (`splitkv` with a few rows per kv head): a head whose keys are all masked out, and
/// rows that see no key under bottom-right alignment with Sq > Sk.
#[test]
fn fully_masked_rows_when_decoding() {
    let shape = Shape { b: 2, hq: 4, hkv: 2, sq: 1, sk: 300, d: 16, dv: 8 };
    // Query head 3 of batch 1 sees no key; every other row sees all but every seventh.
    let keep: Vec<bool> = (0..2 * 4 * 300).map(|x| x / 300 != 7 && x % 7 != 0).collect();
    let short = Shape { b: 1, hq: 2, hkv: 2, sq: 3, sk: 2, d: 16, dv: 8 };
    for be in backends() {
        for kernel in KERNELS {
            let s =
                spec(shape, DType::F32, Mask::Explicit(ExplicitMask::full(MaskValues::Boolean, &shape)), Layout::Bshd);
            let mut inp = HostInputs::random(&s, 7).unwrap();
            inp.mask = Some(mask_from_bool(&keep));
            check_inputs(&be, &s, kernel, &inp);
            let run = be.run_host(&s, &RunOptions { kernel, lse: true, ..Default::default() }, &inp).unwrap();
            let row = s.o_strides.offset(1, 3, 0);
            assert!((0..8).all(|c| run.output.o.get_f32(row + c) == 0.0), "{} {kernel}", be.simd());
            assert_eq!(run.output.lse.unwrap()[7], f32::NEG_INFINITY, "{} {kernel}", be.simd());
            // Row 0 of each head sees no key (limit 0 + 2 - 3 < 0).
            let s = spec(short, DType::BF16, Mask::CausalBottomRight, Layout::Bhsd);
            check_inputs(&be, &s, kernel, &HostInputs::random(&s, 8).unwrap());
        }
    }
}

#[test]
fn nan_in_q_reaches_only_its_rows() {
    let shape = Shape { b: 1, hq: 4, hkv: 2, sq: 70, sk: 90, d: 32, dv: 32 };
    for be in backends() {
        for kernel in KERNELS {
            for mask in [Mask::None, Mask::CausalTopLeft] {
                let s = spec(shape, DType::F32, mask, Layout::Bhsd);
                let mut inp = HostInputs::random(&s, 3).unwrap();
                let (h, i) = (3, 41);
                inp.q.set_f32(s.q_strides.offset(0, h, i) + 5, f32::NAN);
                // The reference gives NaN for that row only; check_output counts NaN on one side only as a
                // mismatch, so passing means no other row was touched and that row is NaN.
                let rep = check_inputs(&be, &s, kernel, &inp);
                assert_eq!(rep.nan_mismatches, 0);
                let run = be.run_host(&s, &RunOptions { kernel, ..Default::default() }, &inp).unwrap();
                let nan_rows = (0..4 * 70).filter(|r| run.output.o.get_f32(r * 32).is_nan()).count();
                assert_eq!(nan_rows, 1, "{} {kernel} {mask:?}", be.simd());
            }
        }
    }
}

#[test]
fn nan_in_q_of_a_fully_masked_row_stays_zero() {
    // Row 0 sees no key (bottom-right, Sq > Sk): its NaN query takes part in nothing.
    let shape = Shape { b: 1, hq: 1, hkv: 1, sq: 6, sk: 3, d: 8, dv: 8 };
    for be in backends() {
        for kernel in KERNELS {
            let s = spec(shape, DType::F32, Mask::CausalBottomRight, Layout::Bhsd);
            let mut inp = HostInputs::random(&s, 4).unwrap();
            inp.q.set_f32(0, f32::NAN);
            check_inputs(&be, &s, kernel, &inp);
        }
    }
}

#[test]
fn scale_and_large_logits() {
    // Scores around ±60 overflow a naive exp; an explicit scale must be honoured.
    let shape = Shape { b: 1, hq: 2, hkv: 2, sq: 33, sk: 47, d: 16, dv: 16 };
    for be in backends() {
        for kernel in KERNELS {
            let s = spec(shape, DType::F32, Mask::None, Layout::Bhsd).with_scale(4.0);
            check_inputs(&be, &s, kernel, &HostInputs::random(&s, 5).unwrap());
        }
    }
}

/// The slice entry candle uses: no copies, poisoned output, every dtype, LSE optional.
#[test]
fn slice_entry_point() {
    let shape = Shape { b: 2, hq: 4, hkv: 1, sq: 29, sk: 31, d: 64, dv: 48 };
    for dtype in DType::ALL {
        let s = spec(shape, dtype, Mask::CausalTopLeft, Layout::Bshd);
        let inp = HostInputs::random(&s, 6).unwrap();
        let o_len = s.required_len(sdpa_core::Operand::O).unwrap();
        let mut o = HostBuffer::poisoned(dtype, o_len);
        let mut lse = vec![f32::NAN; s.lse_len().unwrap()];
        let opts = RunOptions { threads: Some(THREADS), ..Default::default() };
        let kernel = match (&inp.q, &inp.k, &inp.v, &mut o) {
            (HostBuffer::F32(q), HostBuffer::F32(k), HostBuffer::F32(v), HostBuffer::F32(o)) => {
                attention(&s, &opts, q, k, v, None, o, Some(&mut lse))
            }
            (HostBuffer::F16(q), HostBuffer::F16(k), HostBuffer::F16(v), HostBuffer::F16(o)) => {
                attention(&s, &opts, q, k, v, None, o, None)
            }
            (HostBuffer::BF16(q), HostBuffer::BF16(k), HostBuffer::BF16(v), HostBuffer::BF16(o)) => {
                attention(&s, &opts, q, k, v, None, o, Some(&mut lse))
            }
            _ => unreachable!("HostInputs::random uses the spec's dtype"),
        }
        .unwrap();
        assert_eq!(kernel, Kernel::Fa2);
        let lse = if dtype == DType::F16 { None } else { Some(lse) };
        let rep = check_output(&s, &inp, &HostOutput { o, lse }, F32Math::Exact, None).unwrap();
        assert!(rep.pass, "{dtype}: {rep:?}");
    }
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let s = AttentionSpec::new(Shape::new(1, 2, 8, 8, 16), DType::BF16);
    let n = 2 * 8 * 16;
    let x = vec![bf16::from_f32(0.5); n];
    let mut o = vec![bf16::ZERO; n];
    let opts = RunOptions::default();
    // Short buffers.
    let e = attention(&s, &opts, &x[..n - 1], &x, &x, None, &mut o, None).unwrap_err();
    assert!(e.to_string().contains("buffer q"), "{e}");
    let mut short = vec![bf16::ZERO; 3];
    assert!(attention(&s, &opts, &x, &x, &x, None, &mut short, None).is_err());
    let mut lse = vec![0.0f32; 3];
    let e = attention(&s, &opts, &x, &x, &x, None, &mut o, Some(&mut lse)).unwrap_err();
    assert!(e.to_string().contains("lse"), "{e}");
    // Element type differs from the spec.
    let xf = vec![0.5f32; n];
    let mut of = vec![0.0f32; n];
    assert!(attention(&s, &opts, &xf, &xf, &xf, None, &mut of, None).is_err());
    // Explicit mask without data, and data without an explicit mask.
    let sm = s.clone().with_mask(Mask::Explicit(ExplicitMask::full(MaskValues::Additive, &s.shape)));
    assert!(attention(&sm, &opts, &x, &x, &x, None, &mut o, None).is_err());
    assert!(attention(&s, &opts, &x, &x, &x, Some(&[0.0; 128]), &mut o, None).is_err());
    // Unsupported requests.
    let fa1 = RunOptions { kernel: Kernel::Fa1, ..Default::default() };
    assert!(attention(&s, &fa1, &x, &x, &x, None, &mut o, None).is_err());
    let tf32 = RunOptions { f32_math: F32Math::Tf32, ..Default::default() };
    assert!(attention(&s, &tf32, &x, &x, &x, None, &mut o, None).is_ok(), "f32 math only matters for f32");
    let sf = AttentionSpec::new(Shape::new(1, 2, 8, 8, 16), DType::F32);
    assert!(attention(&sf, &tf32, &xf, &xf, &xf, None, &mut of, None).is_err());
    let zero_threads = RunOptions { threads: Some(0), ..Default::default() };
    assert!(attention(&s, &zero_threads, &x, &x, &x, None, &mut o, None).is_err());
    let big = AttentionSpec::new(Shape { b: 1, hq: 1, hkv: 1, sq: 1, sk: 1, d: 8193, dv: 8 }, DType::BF16);
    let xb = vec![bf16::from_f32(0.5); 8193];
    let e = attention(&big, &opts, &xb, &xb, &x[..8], None, &mut o[..8], None).unwrap_err();
    assert!(e.to_string().contains("unsupported"), "{e}");
    // Invalid shape.
    let bad = AttentionSpec::new(Shape { b: 1, hq: 3, hkv: 2, sq: 1, sk: 1, d: 4, dv: 4 }, DType::BF16);
    assert!(attention(&bad, &opts, &x, &x, &x, None, &mut o, None).is_err());
}

#[test]
fn paths_are_reported_and_forced() {
    let names = sdpa_cpu::simd_paths();
    assert_eq!(names.last(), Some(&"scalar"));
    for be in backends() {
        assert!(be.device_name().contains(be.simd().name()), "{}", be.device_name());
    }
    #[cfg(target_arch = "x86_64")]
    {
        assert_eq!(names.contains(&"avx2"), is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"));
        assert_eq!(
            names.contains(&"avx512"),
            is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
        );
    }
}

/// Rows a window leaves without keys (its band lies past either end of the keys): zeros and LSE = -inf
/// from every kernel, on tile and decoding shapes, and the other rows exact.
#[test]
fn rows_left_empty_by_a_window() {
    let cases = [
        // Top-left, Sq > Sk, window (0, 0): rows i >= Sk see no key.
        (Shape { b: 1, hq: 2, hkv: 1, sq: 90, sk: 40, d: 16, dv: 8 }, Mask::None, Diagonal::TopLeft, (0, 0)),
        // Bottom-right, Sq > Sk, window (2, 3): rows whose diagonal lies before key -3 see none.
        (Shape { b: 1, hq: 2, hkv: 2, sq: 70, sk: 20, d: 16, dv: 8 }, Mask::None, Diagonal::BottomRight, (2, 3)),
        // Causal bottom-right with a left window, Sq > Sk.
        (
            Shape { b: 2, hq: 2, hkv: 1, sq: 50, sk: 9, d: 8, dv: 8 },
            Mask::CausalBottomRight,
            Diagonal::BottomRight,
            (4, 0),
        ),
        // Decoding rows: Sq = 3 > Sk = 1, bottom-right: rows 0 and 1 lie before the keys.
        (Shape { b: 1, hq: 4, hkv: 2, sq: 3, sk: 1, d: 32, dv: 32 }, Mask::None, Diagonal::BottomRight, (0, 0)),
    ];
    for be in backends() {
        for kernel in KERNELS {
            for (shape, mask, diag, (left, right)) in cases {
                let mut s = spec(shape, DType::F32, mask, Layout::Bhsd)
                    .with_window(Window { left: Some(left), right: Some(right) });
                if !mask.is_causal() {
                    s = s.with_diagonal(diag);
                }
                let inp = HostInputs::random(&s, 9).unwrap();
                check_inputs(&be, &s, kernel, &inp);
                let run = be.run_host(&s, &RunOptions { kernel, lse: true, ..Default::default() }, &inp).unwrap();
                let lse = run.output.lse.unwrap();
                let mut empty = 0;
                for b in 0..shape.b {
                    for h in 0..shape.hq {
                        for i in 0..shape.sq {
                            if !s.key_range(i).is_empty() {
                                continue;
                            }
                            empty += 1;
                            let label = format!("{} {kernel} {shape} row ({b}, {h}, {i})", be.simd());
                            assert_eq!(lse[(b * shape.hq + h) * shape.sq + i], f32::NEG_INFINITY, "{label}");
                            let off = s.o_strides.offset(b, h, i);
                            assert!((0..shape.dv).all(|c| run.output.o.get_f32(off + c) == 0.0), "{label}");
                        }
                    }
                }
                assert!(empty > 0, "{shape}: the case must leave rows empty");
            }
        }
    }
}

/// Softcaps from 1 to 100 on logits up to about ±1e4 (a huge scale): nearly every score saturates at ±cap
/// and only the tanh's tail orders them; every kernel and dtype, tile and decoding shapes, with a window.
#[test]
fn softcap_on_huge_logits() {
    let shapes = [
        Shape { b: 1, hq: 4, hkv: 2, sq: 45, sk: 70, d: 64, dv: 32 },
        Shape { b: 1, hq: 4, hkv: 1, sq: 1, sk: 300, d: 64, dv: 64 },
    ];
    for cap in [1.0, 7.5, 30.0, 50.0, 100.0] {
        for be in backends() {
            for shape in shapes {
                for dtype in DType::ALL {
                    // Unit-variance inputs: q·k has a standard deviation of 8 at D = 64, so the logits reach ±1e4.
                    let s =
                        spec(shape, dtype, Mask::CausalBottomRight, Layout::Bshd).with_scale(300.0).with_softcap(cap);
                    check_all_kernels(&be, &s);
                    let s = s.with_window(Window::left(20));
                    check_all_kernels(&be, &s);
                }
            }
        }
    }
}

/// The capabilities name every variant, and the laws of sdpa-core's semantics hold on the kernels: a
/// window wider than Sk equals no window, zero slopes equal no ALiBi, a huge cap equals no cap (checked
/// against the plain call's output, not only the reference).
#[test]
fn variants_are_listed_and_their_laws_hold() {
    let be = backends().remove(0);
    assert_eq!(be.capabilities().variants, Variant::ALL.to_vec());
    let shape = Shape { b: 1, hq: 2, hkv: 1, sq: 33, sk: 75, d: 32, dv: 32 };
    let plain = spec(shape, DType::F32, Mask::CausalTopLeft, Layout::Bhsd);
    let inp = HostInputs::random(&plain, 10).unwrap();
    for kernel in KERNELS {
        let opts = RunOptions { kernel, lse: true, ..Default::default() };
        let want = be.run_host(&plain, &opts, &inp).unwrap().output;
        for s in [
            plain.clone().with_window(Window { left: Some(75), right: Some(75) }),
            plain.clone().with_alibi(Alibi::Slopes(vec![0.0, 0.0])),
            plain.clone().with_softcap(1e9),
        ] {
            let got = be.run_host(&s, &opts, &inp).unwrap().output;
            let (o, w) = (got.o.to_f32_vec(), want.o.to_f32_vec());
            let (lo, lw) = (got.lse.unwrap(), want.lse.clone().unwrap());
            let worst = o.iter().zip(&w).chain(lo.iter().zip(&lw)).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(worst <= 1e-5, "{kernel} {:?}: differs from the plain call by {worst}", s.variants);
        }
    }
}

/// Scores of any magnitude: with the scale at 1e4 .. 1e9 the softmax is (nearly) one-hot and each tile's
/// maximum is far from the last tile's; every kernel and path, f16 and bf16 (whose probabilities use the
/// short exponential) and f32, must still match the reference. The short exponential once formed its exponent
/// as one FMA, `x·log2 e - rnd(m·log2 e)`, whose rounding grows with |m|: from 1e8 whole tiles came out
/// empty (rows of zeros with LSE -inf) or overflowed.
#[test]
fn huge_scores_match_the_reference() {
    // 300 keys: several key tiles on every path, Sq != Sk, GQA.
    let shape = Shape { b: 1, hq: 4, hkv: 2, sq: 37, sk: 300, d: 40, dv: 24 };
    for be in backends() {
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            for scale in [1e4, 1e6, 1e8, 1e9] {
                for mask in [Mask::None, Mask::CausalBottomRight] {
                    let s = spec(shape, dtype, mask, Layout::Bhsd).with_scale(scale);
                    for kernel in KERNELS {
                        common::check(&be, &s, kernel);
                    }
                }
            }
        }
    }
}
