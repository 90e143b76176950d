//! NaN and inf in K and V (issue 3: "NaN in the input propagates to the affected rows only"): a
//! non-finite value under a key that a row does not attend to (causal, explicit boolean, explicit
//! additive `-inf`) leaves that row exact, even when the key sits inside a tile the row loads; one under
//! a key a row does attend to poisons exactly the elements the f64 reference poisons. Every SIMD path,
//! every kernel, f32 and bf16 (the AVX512_BF16 pair kernel included), tile and decoding shapes.

mod common;

use common::backends;
use sdpa_core::check::tolerance;
use sdpa_core::reference::reference_attention;
use sdpa_core::{
    mask_from_bool, Alibi, AttentionSpec, DType, ExplicitMask, F32Math, HostBackend, HostInputs, Kernel, Layout, Mask,
    MaskValues, RunOptions, Shape, Window,
};

const KERNELS: [Kernel; 4] = [Kernel::Unfused, Kernel::Fa2, Kernel::SplitKv, Kernel::Auto];

/// One poisoned element: operand (K or V), kv head, key, column, value.
#[derive(Debug, Clone, Copy)]
struct Poison {
    v: bool,
    kvh: usize,
    key: usize,
    col: usize,
    value: f32,
}

/// How the reference's output splits: elements that are NaN, ±inf, finite; rows with any non-finite.
#[derive(Debug, Default)]
struct Tally {
    nonfinite_rows: usize,
    finite_rows: usize,
}

/// Runs every kernel on every path with the poisons applied and compares element by element with the f64
/// reference: the same NaN / same-signed inf where the reference has one, and the finite elements within
/// the dtype's relative L2 tolerance. Returns the reference's tally so a case can show it poisons some
/// rows and spares others.
fn check_poisoned(spec: &AttentionSpec, mask: Option<Vec<f32>>, poisons: &[Poison]) -> Tally {
    let mut inputs = HostInputs::random(spec, 31).expect("valid spec");
    if mask.is_some() {
        inputs.mask = mask;
    }
    for p in poisons {
        let (buf, st) = if p.v { (&mut inputs.v, spec.v_strides) } else { (&mut inputs.k, spec.k_strides) };
        buf.set_f32(st.offset(0, p.kvh, p.key) + p.col, p.value);
    }
    let want = reference_attention(spec, &inputs).expect("reference runs");
    let s = spec.shape;
    let mut tally = Tally::default();
    for row in 0..s.b * s.hq * s.sq {
        if want.o[row * s.dv..(row + 1) * s.dv].iter().all(|x| x.is_finite()) {
            tally.finite_rows += 1;
        } else {
            tally.nonfinite_rows += 1;
        }
    }
    let tol = tolerance(spec.dtype, F32Math::Exact);
    for be in backends() {
        for kernel in KERNELS {
            let label = format!("{} {kernel} {} {} {:?} {poisons:?}", be.simd(), spec.dtype, s, spec.mask);
            let opts = RunOptions { kernel, lse: true, ..Default::default() };
            let run = be.run_host(spec, &opts, &inputs).unwrap_or_else(|e| panic!("{label}: {e}"));
            let (mut diff2, mut ref2) = (0.0f64, 0.0f64);
            for b in 0..s.b {
                for h in 0..s.hq {
                    for i in 0..s.sq {
                        let row = (b * s.hq + h) * s.sq + i;
                        let off = spec.o_strides.offset(b, h, i);
                        for c in 0..s.dv {
                            let (w, g) = (want.o[row * s.dv + c], run.output.o.get_f64(off + c));
                            if w.is_finite() {
                                assert!(g.is_finite(), "{label}: row (b {b}, h {h}, i {i}) col {c}: {g}, want {w}");
                                diff2 += (g - w) * (g - w);
                                ref2 += w * w;
                            } else {
                                let same = (w.is_nan() && g.is_nan()) || w == g;
                                assert!(same, "{label}: row (b {b}, h {h}, i {i}) col {c}: {g}, want {w}");
                            }
                        }
                        let (wl, gl) = (want.lse[row], run.output.lse.as_ref().expect("lse asked")[row] as f64);
                        if wl.is_finite() {
                            assert!(
                                (gl - wl).abs() <= 1e-3 + tol * wl.abs(),
                                "{label}: lse row {row}: {gl}, want {wl}"
                            );
                        } else {
                            assert!(
                                (wl.is_nan() && gl.is_nan()) || wl == gl,
                                "{label}: lse row {row}: {gl}, want {wl}"
                            );
                        }
                    }
                }
            }
            let rel = (diff2 / ref2.max(f64::MIN_POSITIVE)).sqrt();
            assert!(rel <= tol, "{label}: relative error {rel} > {tol}");
        }
    }
    tally
}

fn spec(shape: Shape, dtype: DType, mask: Mask) -> AttentionSpec {
    AttentionSpec::new(shape, dtype).with_layout(Layout::Bhsd).with_mask(mask)
}

fn v_at(kvh: usize, key: usize, col: usize, value: f32) -> Poison {
    Poison { v: true, kvh, key, col, value }
}

fn k_at(kvh: usize, key: usize, col: usize, value: f32) -> Poison {
    Poison { v: false, kvh, key, col, value }
}

/// Causal top-left, one tile of rows loading a key that the first rows may not see: rows before the key
/// stay exact, the rows after it are poisoned (V: in the poisoned column only; K: the whole row).
#[test]
fn causal_top_left_key_inside_a_loaded_tile() {
    let shape = Shape { b: 1, hq: 4, hkv: 2, sq: 70, sk: 70, d: 32, dv: 24 };
    for dtype in [DType::F32, DType::BF16] {
        let s = spec(shape, dtype, Mask::CausalTopLeft);
        for poison in [v_at(1, 40, 5, f32::NAN), v_at(1, 40, 5, f32::INFINITY), k_at(0, 40, 3, f32::NAN)] {
            let t = check_poisoned(&s, None, &[poison]);
            // Two query heads share the kv head; rows 40..70 of each see key 40.
            assert_eq!(t.nonfinite_rows, 2 * 30, "{poison:?}");
        }
    }
}

/// Causal bottom-right with Sq < Sk (the KV-cache alignment), keys masked for some rows and for all.
#[test]
fn causal_bottom_right_masked_and_attended_keys() {
    let shape = Shape { b: 2, hq: 2, hkv: 1, sq: 30, sk: 90, d: 16, dv: 16 };
    for dtype in [DType::F32, DType::BF16] {
        let s = spec(shape, dtype, Mask::CausalBottomRight);
        // Key 89 is seen by the last row only; key 75 by rows 15.. (limit i + 60).
        let t = check_poisoned(&s, None, &[v_at(0, 89, 0, f32::NAN), k_at(0, 75, 1, f32::NEG_INFINITY)]);
        assert!(t.finite_rows > 0 && t.nonfinite_rows > 0, "{t:?}");
        let t = check_poisoned(&s, None, &[v_at(0, 80, 7, f32::INFINITY), k_at(0, 81, 2, f32::NAN)]);
        assert!(t.finite_rows > 0 && t.nonfinite_rows > 0, "{t:?}");
    }
}

/// Explicit masks, boolean and additive: a key hidden from every even row; NaN there reaches odd rows only.
#[test]
fn explicit_masks_hide_poisoned_keys() {
    let shape = Shape { b: 1, hq: 2, hkv: 2, sq: 37, sk: 83, d: 24, dv: 20 };
    let (poisoned, n) = (50, shape.hq * shape.sq * shape.sk);
    let keep = |x: usize| {
        let (j, i) = (x % shape.sk, (x / shape.sk) % shape.sq);
        !(j == poisoned && i % 2 == 0) && (x % 7 != 3 || j == poisoned)
    };
    let boolean = mask_from_bool(&(0..n).map(keep).collect::<Vec<_>>());
    // Additive: the same -inf entries, and finite values (which keep their keys) elsewhere.
    let additive: Vec<f32> =
        (0..n).map(|x| if keep(x) { -((x % 5) as f32) * 0.25 } else { f32::NEG_INFINITY }).collect();
    for dtype in [DType::F32, DType::BF16] {
        for (values, data) in [(MaskValues::Boolean, &boolean), (MaskValues::Additive, &additive)] {
            let s = spec(shape, dtype, Mask::Explicit(ExplicitMask::full(values, &shape)));
            for poison in [
                v_at(0, poisoned, 3, f32::NAN),
                k_at(1, poisoned, 0, f32::NAN),
                v_at(1, poisoned, 0, f32::NEG_INFINITY),
            ] {
                let t = check_poisoned(&s, Some(data.clone()), &[poison]);
                // Odd rows of the one query head on that kv head: 18 of 37.
                assert_eq!(t.nonfinite_rows, 18, "{values:?} {poison:?}");
            }
        }
    }
}

/// Decoding shapes (the dot-product and split-KV paths): a few rows, many keys, the poisoned keys inside
/// the last key tile that the rows load.
#[test]
fn decoding_masked_and_attended_keys() {
    // Bottom-right with Sq = 3: row i sees keys 0..=97 + i. Head 0: NaN in V at key 99 reaches row 2 only;
    // head 1: NaN in K at key 98 reaches rows 1 and 2, inf in V at key 99 row 2 only.
    let s = spec(Shape { b: 1, hq: 2, hkv: 2, sq: 3, sk: 100, d: 64, dv: 64 }, DType::F32, Mask::CausalBottomRight);
    let t =
        check_poisoned(&s, None, &[v_at(0, 99, 9, f32::NAN), k_at(1, 98, 0, f32::NAN), v_at(1, 99, 0, f32::INFINITY)]);
    assert_eq!(t.nonfinite_rows, 3);
    // One query per head, an explicit mask hiding keys 50 and 60: NaN there reaches no row.
    let shape = Shape { b: 1, hq: 2, hkv: 2, sq: 1, sk: 1000, d: 128, dv: 128 };
    let keep: Vec<bool> = (0..2 * 1000).map(|x| x % 1000 != 50 && x % 1000 != 60).collect();
    for dtype in [DType::F32, DType::BF16] {
        let s = spec(shape, dtype, Mask::Explicit(ExplicitMask::full(MaskValues::Boolean, &shape)));
        let poisons = [v_at(0, 50, 100, f32::NAN), k_at(1, 60, 3, f32::NAN), v_at(1, 50, 0, f32::INFINITY)];
        let t = check_poisoned(&s, Some(mask_from_bool(&keep)), &poisons);
        assert_eq!(t.nonfinite_rows, 0);
    }
    // GQA decoding: a NaN in V poisons the four query heads of its kv head only.
    for dtype in [DType::F32, DType::BF16] {
        let s = spec(Shape { b: 1, hq: 8, hkv: 2, sq: 1, sk: 1000, d: 128, dv: 128 }, dtype, Mask::CausalBottomRight);
        let t = check_poisoned(&s, None, &[v_at(1, 500, 100, f32::NAN)]);
        assert_eq!(t.nonfinite_rows, 4);
    }
}

/// No mask: every key is attended, so a NaN anywhere in V poisons its column for the whole group (the
/// careful path must not hide a NaN the reference keeps).
#[test]
fn unmasked_nan_poisons_every_row_of_its_group() {
    let s = spec(Shape { b: 1, hq: 2, hkv: 1, sq: 20, sk: 40, d: 8, dv: 8 }, DType::F32, Mask::None);
    let t = check_poisoned(&s, None, &[v_at(0, 7, 2, f32::NAN)]);
    assert_eq!(t.nonfinite_rows, 40);
}

/// Windows (with softcap and ALiBi on): NaN and inf under keys outside a row's window but inside tiles the
/// row loads leave it exact; under keys inside its window they poison it as the reference does.
#[test]
fn windowed_keys_inside_a_loaded_tile() {
    let shape = Shape { b: 1, hq: 4, hkv: 2, sq: 70, sk: 70, d: 32, dv: 24 };
    for dtype in [DType::F32, DType::BF16] {
        let s = spec(shape, dtype, Mask::CausalTopLeft).with_window(Window::left(10));
        for poison in [v_at(1, 5, 5, f32::NAN), v_at(1, 5, 5, f32::INFINITY), k_at(1, 5, 3, f32::NAN)] {
            let t = check_poisoned(&s, None, &[poison]);
            // Rows 5..=15 of the two query heads on kv head 1 see key 5.
            assert_eq!(t.nonfinite_rows, 2 * 11, "{poison:?}");
        }
        let s = s.with_softcap(20.0).with_alibi(Alibi::Standard);
        let t = check_poisoned(&s, None, &[v_at(0, 40, 0, f32::NAN)]);
        assert_eq!(t.nonfinite_rows, 2 * 11);
        // The softcap keeps a NaN score NaN, and caps an infinite one at ±cap (a finite row).
        let t = check_poisoned(&s, None, &[k_at(1, 40, 2, f32::NAN)]);
        assert_eq!(t.nonfinite_rows, 2 * 11);
        let t = check_poisoned(&s, None, &[k_at(1, 40, 2, f32::INFINITY)]);
        assert_eq!(t.nonfinite_rows, 0);
    }
    // Decoding, bottom-right window of 100 keys back: key 950 is seen, key 890 is not.
    let shape = Shape { b: 1, hq: 2, hkv: 2, sq: 1, sk: 1000, d: 64, dv: 64 };
    let s = spec(shape, DType::F32, Mask::CausalBottomRight).with_window(Window::left(100));
    let t = check_poisoned(&s, None, &[v_at(0, 890, 1, f32::NAN), v_at(1, 950, 2, f32::INFINITY)]);
    assert_eq!(t.nonfinite_rows, 1);
}
