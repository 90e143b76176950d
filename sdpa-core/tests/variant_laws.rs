//! The laws of windows, softcaps and ALiBi, pinned on the f64 reference with random shapes and data:
//! a window wider than Sk is no window; a huge cap is no cap; zero slopes are no ALiBi; a window `(∞, 0)`
//! is the causal mask of the same diagonal; a row the band leaves empty is zeros with LSE −inf.

use proptest::prelude::*;
use sdpa_core::{reference_attention, Alibi, AttentionSpec, DType, Diagonal, HostInputs, Mask, Shape, Window};

fn shape() -> impl Strategy<Value = Shape> {
    (1usize..3, 1usize..4, 1usize..4, 1usize..12, 1usize..14, 1usize..6, 1usize..5)
        .prop_map(|(b, hkv, group, sq, sk, d, dv)| Shape { b, hq: hkv * group, hkv, sq, sk, d, dv })
}

fn diagonal() -> impl Strategy<Value = Diagonal> {
    prop_oneof![Just(Diagonal::TopLeft), Just(Diagonal::BottomRight)]
}

fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
    a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol || (x == y))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn a_window_wider_than_sk_is_no_window(shape in shape(), diag in diagonal(), seed in 0u64..1000) {
        let plain = AttentionSpec::new(shape, DType::F32).with_diagonal(diag);
        let wide = shape.sk + shape.sq;
        let windowed = plain.clone().with_window(Window { left: Some(wide), right: Some(wide) });
        let inp = HostInputs::random(&plain, seed).unwrap();
        let (a, b) = (reference_attention(&plain, &inp).unwrap(), reference_attention(&windowed, &inp).unwrap());
        prop_assert_eq!(a.o, b.o);
        prop_assert_eq!(a.lse, b.lse);
    }

    #[test]
    fn an_unbounded_left_window_is_the_causal_mask(shape in shape(), seed in 0u64..1000) {
        for (diag, mask) in [(Diagonal::TopLeft, Mask::CausalTopLeft), (Diagonal::BottomRight, Mask::CausalBottomRight)] {
            let causal = AttentionSpec::new(shape, DType::F32).with_mask(mask);
            let window = AttentionSpec::new(shape, DType::F32)
                .with_diagonal(diag)
                .with_window(Window { left: None, right: Some(0) });
            let inp = HostInputs::random(&causal, seed).unwrap();
            let (a, b) = (reference_attention(&causal, &inp).unwrap(), reference_attention(&window, &inp).unwrap());
            prop_assert_eq!(a.o, b.o);
            prop_assert_eq!(a.lse, b.lse);
        }
    }

    #[test]
    fn a_huge_cap_is_no_cap(shape in shape(), seed in 0u64..1000) {
        let plain = AttentionSpec::new(shape, DType::F32).with_mask(Mask::CausalBottomRight);
        let capped = plain.clone().with_softcap(1e9);
        let inp = HostInputs::random(&plain, seed).unwrap();
        let (a, b) = (reference_attention(&plain, &inp).unwrap(), reference_attention(&capped, &inp).unwrap());
        prop_assert!(close(&a.o, &b.o, 1e-12) && close(&a.lse, &b.lse, 1e-12));
    }

    /// Every capped logit lies in (−cap, cap), so even logits of 1e4 leave each weight within e^(2·cap) of
    /// the others: no key's weight underflows to zero beside another's.
    #[test]
    fn a_cap_bounds_the_logits(shape in shape(), cap in 1.0f64..100.0, seed in 0u64..1000) {
        let spec = AttentionSpec::new(shape, DType::F32).with_softcap(cap).with_scale(1e4);
        let inp = HostInputs::random(&spec, seed).unwrap();
        let r = reference_attention(&spec, &inp).unwrap();
        // LSE of n logits in (−cap, cap) lies in (−cap + ln n, cap + ln n).
        let n = shape.sk as f64;
        for &l in &r.lse {
            prop_assert!(l > -cap + n.ln() - 1e-9 && l < cap + n.ln() + 1e-9, "lse {l} cap {cap}");
        }
        prop_assert!(r.o.iter().all(|x| x.is_finite()));
    }

    #[test]
    fn zero_slopes_are_no_alibi(shape in shape(), diag in diagonal(), seed in 0u64..1000) {
        let plain = AttentionSpec::new(shape, DType::F32).with_diagonal(diag);
        let zero = plain.clone().with_alibi(Alibi::Slopes(vec![0.0; shape.hq]));
        let inp = HostInputs::random(&plain, seed).unwrap();
        let (a, b) = (reference_attention(&plain, &inp).unwrap(), reference_attention(&zero, &inp).unwrap());
        prop_assert_eq!(a.o, b.o);
        prop_assert_eq!(a.lse, b.lse);
    }

    /// Rows the band leaves without keys (on the bottom-right diagonal, rows whose diagonal lies before
    /// key 0 when Sq > Sk + right) are zeros with LSE −inf, with ALiBi and a cap on; the others are finite.
    #[test]
    fn rows_without_keys_are_zero_with_lse_minus_inf(shape in shape(), left in 0usize..4, right in 0usize..3, seed in 0u64..1000) {
        let spec = AttentionSpec::new(shape, DType::F32)
            .with_diagonal(Diagonal::BottomRight)
            .with_window(Window { left: Some(left), right: Some(right) })
            .with_softcap(5.0)
            .with_alibi(Alibi::Standard);
        let inp = HostInputs::random(&spec, seed).unwrap();
        let r = reference_attention(&spec, &inp).unwrap();
        for (row, &l) in r.lse.iter().enumerate() {
            let i = row % shape.sq;
            let empty = i + shape.sk + right < shape.sq; // diag(i) + right < 0
            prop_assert_eq!(spec.key_range(i).is_empty(), empty);
            if empty {
                prop_assert_eq!(l, f64::NEG_INFINITY);
                prop_assert!(r.o[row * shape.dv..(row + 1) * shape.dv].iter().all(|&x| x == 0.0));
            } else {
                prop_assert!(l.is_finite());
            }
        }
    }
}

#[test]
fn a_causal_window_can_empty_leading_rows() {
    // Bottom-right, Sq = 4 > Sk = 2: rows 0 and 1 see nothing under the causal mask; a window (1, 0) keeps
    // rows 2 and 3 at one and two keys.
    let shape = Shape::new(1, 1, 4, 2, 3);
    let spec = AttentionSpec::new(shape, DType::F32).with_mask(Mask::CausalBottomRight).with_window(Window::left(1));
    assert_eq!((0..4).map(|i| spec.key_range(i)).collect::<Vec<_>>(), vec![0..0, 0..0, 0..1, 0..2]);
    let r = reference_attention(&spec, &HostInputs::random(&spec, 1).unwrap()).unwrap();
    assert_eq!(&r.lse[..2], &[f64::NEG_INFINITY, f64::NEG_INFINITY]);
    assert!(r.lse[2..].iter().all(|l| l.is_finite()));
}

#[test]
fn alibi_follows_flash_attentions_documented_bias() {
    // One key per distance, equal scores (Q = 0), bottom-right: bias −slope·|i + Sk − Sq − j|.
    let shape = Shape::new(1, 1, 2, 4, 1);
    let spec =
        AttentionSpec::new(shape, DType::F32).with_diagonal(Diagonal::BottomRight).with_alibi(Alibi::Slopes(vec![0.5]));
    let mut inp = HostInputs::random(&spec, 2).unwrap();
    for i in 0..2 {
        inp.q.set_f32(i, 0.0);
    }
    let r = reference_attention(&spec, &inp).unwrap();
    // Row 0: diag = 2, biases for keys 0..4 = −1, −0.5, 0, −0.5.
    let want = [-1.0f64, -0.5, 0.0, -0.5].iter().map(|b| b.exp()).sum::<f64>().ln();
    assert!((r.lse[0] - want).abs() < 1e-12, "{} vs {want}", r.lse[0]);
}

#[test]
fn standard_slopes_match_the_alibi_paper() {
    let eight = sdpa_core::standard_alibi_slopes(8);
    assert_eq!(eight, (1..=8).map(|k| 0.5f64.powi(k)).collect::<Vec<_>>());
    // 12 heads (BLOOM-560m's count): the 8 slopes of 8, then 2^-0.5·k-th of 16 for k = 1, 3, 5, 7.
    let twelve = sdpa_core::standard_alibi_slopes(12);
    assert_eq!(&twelve[..8], &eight[..]);
    let sixteen = sdpa_core::standard_alibi_slopes(16);
    assert_eq!(&twelve[8..], &[sixteen[0], sixteen[2], sixteen[4], sixteen[6]]);
}

#[test]
fn variants_are_validated_with_clear_errors() {
    let shape = Shape::new(1, 4, 3, 5, 8);
    let base = AttentionSpec::new(shape, DType::F32);
    let msg = |s: &AttentionSpec| s.validate().unwrap_err().to_string();
    assert!(msg(&base.clone().with_window(Window::left(2))).contains("name it"));
    assert!(msg(&base.clone().with_alibi(Alibi::Standard)).contains("name it"));
    assert!(base.clone().with_mask(Mask::CausalTopLeft).with_window(Window::left(2)).validate().is_ok());
    let conflict = base.clone().with_mask(Mask::CausalTopLeft).with_diagonal(Diagonal::BottomRight);
    assert!(msg(&conflict).contains("name one alignment"));
    for cap in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert!(msg(&base.clone().with_softcap(cap)).contains("softcap"), "{cap}");
    }
    let slopes = base.clone().with_diagonal(Diagonal::TopLeft);
    assert!(msg(&slopes.clone().with_alibi(Alibi::Slopes(vec![1.0; 3]))).contains("3 ALiBi slopes"));
    assert!(msg(&slopes.with_alibi(Alibi::Slopes(vec![1.0, f32::NAN, 1.0, 1.0]))).contains("not finite"));
    assert_eq!("4096,0".parse::<Window>().unwrap(), Window::left(4096));
    assert_eq!("-1,16".parse::<Window>().unwrap(), Window { left: None, right: Some(16) });
    assert_eq!(Window { left: None, right: Some(16) }.to_string(), "-1,16");
    assert!("4096".parse::<Window>().is_err());
    assert!("a,1".parse::<Window>().is_err());
}
