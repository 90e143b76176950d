//! The CPU half of sdpa-candle against the f64 reference and against candle's own attention
//! (matmul + softmax_last_dim + matmul), on every mask kind, GQA, both dims orders, three kinds of
//! candle views (contiguous, transposed, narrowed with a start offset) and each dtype.

// Helpers of a test panic on failure: that is how a test fails.
#![allow(clippy::unwrap_used)]

use candle_core::{DType as CDType, Device, IndexOp, Tensor};
use sdpa_candle::{sdpa, Layout, SdpaMask, SdpaOptions};
use sdpa_core::check::{check_output, tolerance};
use sdpa_core::{
    AttentionSpec, DType, ExplicitMask, F32Math, HostBuffer, HostInputs, HostOutput, Mask, MaskValues, Shape,
};

/// How the candle tensors handed to `sdpa` sit in memory.
#[derive(Debug, Clone, Copy, PartialEq)]
enum View {
    /// Contiguous in the dims order given to `sdpa`.
    Contiguous,
    /// Stored in the other order and transposed (candle models' `transpose(1, 2)` before attention).
    Transposed,
    /// Cut out of a larger tensor along the heads dim (a fused QKV projection): start offset and gaps.
    Narrowed,
}

/// The mask of a case; explicit masks give their dims over `[B, Hq, Sq, Sk]` and the rank handed to candle.
#[derive(Debug, Clone, Copy, PartialEq)]
enum MaskCase {
    None,
    CausalTopLeft,
    CausalBottomRight,
    Keep([usize; 4], usize),
    Exclude([usize; 4], usize),
    Additive([usize; 4], usize),
}

#[derive(Debug, Clone, Copy)]
struct Case {
    shape: Shape,
    dtype: DType,
    mask: MaskCase,
    layout: Layout,
    view: View,
}

fn to_tensor(buf: &HostBuffer, dims: &[usize]) -> Tensor {
    let dev = Device::Cpu;
    match buf {
        HostBuffer::F32(v) => Tensor::from_vec(v.clone(), dims, &dev),
        HostBuffer::F16(v) => Tensor::from_vec(v.clone(), dims, &dev),
        HostBuffer::BF16(v) => Tensor::from_vec(v.clone(), dims, &dev),
    }
    .unwrap()
}

fn to_host(t: &Tensor, dtype: DType) -> HostBuffer {
    let flat = t.flatten_all().unwrap();
    match dtype {
        DType::F32 => HostBuffer::F32(flat.to_vec1().unwrap()),
        DType::F16 => HostBuffer::F16(flat.to_vec1().unwrap()),
        DType::BF16 => HostBuffer::BF16(flat.to_vec1().unwrap()),
    }
}

fn candle_dtype(dtype: DType) -> CDType {
    match dtype {
        DType::F32 => CDType::F32,
        DType::F16 => CDType::F16,
        DType::BF16 => CDType::BF16,
    }
}

/// Dims of an operand with `heads` heads and `seq` positions in the case's order.
fn dims(layout: Layout, b: usize, heads: usize, seq: usize, d: usize) -> [usize; 4] {
    match layout {
        Layout::Bhsd => [b, heads, seq, d],
        Layout::Bshd => [b, seq, heads, d],
    }
}

/// Presents contiguous values `t` (in the case's order) as the case's kind of view, same values.
fn present(t: &Tensor, layout: Layout, view: View, seed: u64) -> Tensor {
    match view {
        View::Contiguous => t.clone(),
        View::Transposed => {
            let stored = t.transpose(1, 2).unwrap().contiguous().unwrap();
            let v = stored.transpose(1, 2).unwrap();
            assert!(!v.is_contiguous() || t.dim(1).unwrap() == 1 || t.dim(2).unwrap() == 1);
            v
        }
        View::Narrowed => {
            let heads_dim = match layout {
                Layout::Bhsd => 1,
                Layout::Bshd => 2,
            };
            let mut pad_dims = t.dims().to_vec();
            pad_dims[heads_dim] = 3;
            let pad = Tensor::randn(0f32, 1.0, pad_dims, &Device::Cpu).unwrap().to_dtype(t.dtype()).unwrap();
            let _ = seed;
            let fused = Tensor::cat(&[&pad, t, &pad], heads_dim).unwrap();
            let v = fused.narrow(heads_dim, 3, t.dim(heads_dim).unwrap()).unwrap();
            assert!(v.layout().start_offset() > 0);
            v
        }
    }
}

/// Candle's own attention, the way candle-transformers' models write it: BHSD, K/V heads repeated for
/// GQA, `q·kᵀ·scale + mask`, `softmax_last_dim`, `·v`, in the tensors' dtype.
fn candle_attention(q: &Tensor, k: &Tensor, v: &Tensor, layout: Layout, additive: Option<&Tensor>) -> Tensor {
    let bhsd = |t: &Tensor| match layout {
        Layout::Bhsd => t.contiguous().unwrap(),
        Layout::Bshd => t.transpose(1, 2).unwrap().contiguous().unwrap(),
    };
    let (q, k, v) = (bhsd(q), bhsd(k), bhsd(v));
    let (b, hq, _, d) = q.dims4().unwrap();
    let (_, hkv, sk, dv) = v.dims4().unwrap();
    let repeat = |t: &Tensor, dd: usize| {
        let g = hq / hkv;
        t.unsqueeze(2).unwrap().expand((b, hkv, g, sk, dd)).unwrap().reshape((b, hq, sk, dd)).unwrap()
    };
    let (k, v) = (repeat(&k, d), repeat(&v, dv));
    let scale = 1.0 / (d as f64).sqrt();
    let mut att = (q.matmul(&k.t().unwrap()).unwrap() * scale).unwrap();
    if let Some(m) = additive {
        att = att.broadcast_add(&m.to_dtype(att.dtype()).unwrap()).unwrap();
    }
    let att = candle_nn::ops::softmax_last_dim(&att).unwrap();
    let o = att.matmul(&v).unwrap();
    match layout {
        Layout::Bhsd => o,
        Layout::Bshd => o.transpose(1, 2).unwrap().contiguous().unwrap(),
    }
}

/// Relative L2 distance over the elements where `b` is finite.
fn rel_dist(a: &HostBuffer, b: &HostBuffer) -> f64 {
    let (mut d2, mut r2) = (0.0, 0.0);
    for i in 0..a.len() {
        let (x, y) = (a.get_f64(i), b.get_f64(i));
        if y.is_finite() {
            d2 += (x - y) * (x - y);
            r2 += y * y;
        }
    }
    (d2 / r2.max(f64::MIN_POSITIVE)).sqrt()
}

/// Runs one case through `sdpa` and checks it against the reference and against candle's own attention.
fn check(case: Case, seed: u64) {
    let Case { shape: s, dtype, mask, layout, view } = case;
    let explicit = |values, dims| Mask::Explicit(ExplicitMask { values, dims });
    let spec_mask = match mask {
        MaskCase::None => Mask::None,
        MaskCase::CausalTopLeft => Mask::CausalTopLeft,
        MaskCase::CausalBottomRight => Mask::CausalBottomRight,
        MaskCase::Keep(d, _) | MaskCase::Exclude(d, _) => explicit(MaskValues::Boolean, d),
        MaskCase::Additive(d, _) => explicit(MaskValues::Additive, d),
    };
    let spec = AttentionSpec::new(s, dtype).with_layout(layout).with_mask(spec_mask);
    let mut inputs = HostInputs::random(&spec, seed).unwrap();

    let q = present(&to_tensor(&inputs.q, &dims(layout, s.b, s.hq, s.sq, s.d)), layout, view, seed);
    let k = present(&to_tensor(&inputs.k, &dims(layout, s.b, s.hkv, s.sk, s.d)), layout, view, seed + 1);
    let v = present(&to_tensor(&inputs.v, &dims(layout, s.b, s.hkv, s.sk, s.dv)), layout, view, seed + 2);

    // The mask tensor as a candle model would hold it, and the additive values the reference reads.
    let mask_tensor = |d: [usize; 4], rank: usize, t: Tensor| {
        assert!(d[..4 - rank].iter().all(|&x| x == 1), "rank {rank} cannot hold dims {d:?}");
        t.reshape(&d[4 - rank..]).unwrap()
    };
    let (sdpa_mask, additive_for_candle) = match mask {
        MaskCase::None => (SdpaMask::None, None),
        MaskCase::CausalTopLeft | MaskCase::CausalBottomRight => {
            let tl = mask == MaskCase::CausalTopLeft;
            let add: Vec<f32> = (0..s.sq * s.sk)
                .map(|x| {
                    let (i, j) = (x / s.sk, x % s.sk);
                    let lim = if tl { i + 1 } else { (i + 1 + s.sk).saturating_sub(s.sq) };
                    if j < lim {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
                .collect();
            let m = Tensor::from_vec(add, (s.sq, s.sk), &Device::Cpu).unwrap();
            (if tl { SdpaMask::CausalTopLeft } else { SdpaMask::CausalBottomRight }, Some(m))
        }
        MaskCase::Keep(d, rank) | MaskCase::Exclude(d, rank) => {
            let add = inputs.mask.clone().unwrap();
            let keep = matches!(mask, MaskCase::Keep(..));
            let bits: Vec<u8> = add.iter().map(|&x| u8::from((x == 0.0) == keep)).collect();
            let t = mask_tensor(d, rank, Tensor::from_vec(bits, d.to_vec(), &Device::Cpu).unwrap());
            let additive = Tensor::from_vec(add, d.to_vec(), &Device::Cpu).unwrap();
            (if keep { SdpaMask::Keep(t) } else { SdpaMask::Exclude(t) }, Some(additive))
        }
        MaskCase::Additive(d, rank) => {
            // In the model's dtype, as candle models keep it; the reference reads the rounded values.
            let raw = Tensor::from_vec(inputs.mask.clone().unwrap(), d.to_vec(), &Device::Cpu).unwrap();
            let t = raw.to_dtype(candle_dtype(dtype)).unwrap();
            inputs.mask = Some(t.to_dtype(CDType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap());
            let additive = t.to_dtype(CDType::F32).unwrap();
            (SdpaMask::Additive(mask_tensor(d, rank, t)), Some(additive))
        }
    };
    let opts = SdpaOptions { layout, mask: sdpa_mask, ..Default::default() };

    let o = sdpa(&q, &k, &v, &opts).unwrap_or_else(|e| panic!("{case:?}: {e}"));
    let want = dims(layout, s.b, s.hq, s.sq, s.dv);
    assert_eq!(o.dims(), &want, "{case:?}");
    assert_eq!(o.dtype(), candle_dtype(dtype));
    assert!(o.is_contiguous());
    let got = HostOutput { o: to_host(&o, dtype), lse: None };
    let report = check_output(&spec, &inputs, &got, F32Math::Exact, None).unwrap();
    assert!(report.pass, "{case:?} against the reference: {report:?}");

    // Candle's own attention on the same tensors; rows it cannot compute (all keys masked: NaN from its
    // softmax, zeros from sdpa) are left out of the distance.
    let theirs = to_host(&candle_attention(&q, &k, &v, layout, additive_for_candle.as_ref()), dtype);
    let own_err = check_output(&spec, &inputs, &HostOutput { o: theirs.clone(), lse: None }, F32Math::Exact, None)
        .unwrap()
        .rel_err;
    let dist = rel_dist(&got.o, &theirs);
    let tol = tolerance(dtype, F32Math::Exact);
    assert!(
        dist <= 2.0 * tol.max(own_err),
        "{case:?}: sdpa and candle's attention differ by {dist:.3e} (tolerance {tol:.1e}, candle's own error \
         {own_err:.3e}, sdpa's {:.3e})",
        report.rel_err
    );
}

fn all_masks(s: Shape) -> Vec<MaskCase> {
    vec![
        MaskCase::None,
        MaskCase::CausalTopLeft,
        MaskCase::CausalBottomRight,
        MaskCase::Keep([s.b, s.hq, s.sq, s.sk], 4),
        MaskCase::Exclude([1, 1, s.sq, s.sk], 2),
        MaskCase::Additive([s.b, 1, s.sq, s.sk], 4),
        MaskCase::Additive([1, 1, 1, s.sk], 1),
    ]
}

#[test]
fn every_mask_layout_view_and_dtype_matches_the_reference_and_candle() {
    // GQA (4 query heads per kv head), Sq != Sk, lengths that are no multiple of any tile, odd head dims.
    let s = Shape { b: 2, hq: 8, hkv: 2, sq: 37, sk: 53, d: 24, dv: 24 };
    let mut n = 0;
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for layout in [Layout::Bhsd, Layout::Bshd] {
            for view in [View::Contiguous, View::Transposed, View::Narrowed] {
                for mask in all_masks(s) {
                    check(Case { shape: s, dtype, mask, layout, view }, n);
                    n += 1;
                }
            }
        }
    }
}

#[test]
fn awkward_shapes_match_the_reference() {
    let shapes = [
        // More queries than keys, bottom-right causal leaves the first rows with no key (zeros).
        Shape { b: 1, hq: 4, hkv: 4, sq: 29, sk: 11, d: 17, dv: 9 },
        // Decoding one token against a cache, MQA.
        Shape { b: 3, hq: 8, hkv: 1, sq: 1, sk: 130, d: 64, dv: 64 },
        // Head dim 128, Dv != D, B·H = 1.
        Shape { b: 1, hq: 1, hkv: 1, sq: 70, sk: 70, d: 128, dv: 80 },
        // D = 1.
        Shape { b: 1, hq: 2, hkv: 1, sq: 5, sk: 9, d: 1, dv: 3 },
    ];
    let mut n = 1000;
    for s in shapes {
        for dtype in [DType::F32, DType::BF16] {
            for mask in [MaskCase::None, MaskCase::CausalTopLeft, MaskCase::CausalBottomRight] {
                for (layout, view) in [(Layout::Bshd, View::Contiguous), (Layout::Bhsd, View::Transposed)] {
                    let case = Case { shape: s, dtype, mask, layout, view };
                    if mask == MaskCase::CausalBottomRight && s.sq > s.sk {
                        // candle's own attention yields NaN on the empty rows; the reference check covers them.
                        check_reference_only(case, n);
                    } else {
                        check(case, n);
                    }
                    n += 1;
                }
            }
        }
    }
}

/// Fully masked rows: sdpa gives zeros, never NaN.
fn check_reference_only(case: Case, seed: u64) {
    let s = case.shape;
    let spec = AttentionSpec::new(s, case.dtype).with_layout(case.layout).with_mask(Mask::CausalBottomRight);
    let inputs = HostInputs::random(&spec, seed).unwrap();
    let q = present(&to_tensor(&inputs.q, &dims(case.layout, s.b, s.hq, s.sq, s.d)), case.layout, case.view, seed);
    let k = present(&to_tensor(&inputs.k, &dims(case.layout, s.b, s.hkv, s.sk, s.d)), case.layout, case.view, seed);
    let v = present(&to_tensor(&inputs.v, &dims(case.layout, s.b, s.hkv, s.sk, s.dv)), case.layout, case.view, seed);
    let opts = SdpaOptions { layout: case.layout, mask: SdpaMask::CausalBottomRight, ..Default::default() };
    let o = sdpa(&q, &k, &v, &opts).unwrap();
    let got = HostOutput { o: to_host(&o, case.dtype), lse: None };
    let report = check_output(&spec, &inputs, &got, F32Math::Exact, None).unwrap();
    assert!(report.pass, "{case:?}: {report:?}");
    // Row 0 sees no key: exactly zeros.
    let row0 = match case.layout {
        Layout::Bhsd => o.i((0, 0, 0)).unwrap(),
        Layout::Bshd => o.i((0, 0, 0)).unwrap(),
    };
    let row0: Vec<f32> = row0.to_dtype(CDType::F32).unwrap().to_vec1().unwrap();
    assert!(row0.iter().all(|&x| x == 0.0), "{row0:?}");
}

#[test]
fn an_explicit_scale_is_used() {
    let dev = Device::Cpu;
    let q = Tensor::randn(0f32, 1.0, (1, 2, 9, 16), &dev).unwrap();
    let k = Tensor::randn(0f32, 1.0, (1, 2, 11, 16), &dev).unwrap();
    let v = Tensor::randn(0f32, 1.0, (1, 2, 11, 16), &dev).unwrap();
    let a = sdpa(&q, &k, &v, &SdpaOptions::bhsd().with_scale(0.5)).unwrap();
    // scale 0.5 on q equals scale 1/sqrt(16) = 0.25 on 2·q.
    let b = sdpa(&(&q * 2.0).unwrap(), &k, &v, &SdpaOptions::bhsd()).unwrap();
    let diff: f32 = (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar().unwrap();
    assert!(diff < 1e-5, "{diff}");
}
