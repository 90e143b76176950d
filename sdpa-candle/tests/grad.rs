//! Gradients through `sdpa` on CPU `Var`s: against candle's own autograd of the eager formula (matmul +
//! softmax + matmul, K/V repeated for GQA) in f64, and, for f16/bf16, held to twice the error of that same
//! eager backward in the inputs' dtype (FlashAttention's bar); every mask kind, GQA 1/4/8, both dims orders,
//! three kinds of views (contiguous, transposed, narrowed with an offset), Sq != Sk both ways, Dv != D. Then
//! what has no gradient (the mask, inputs that are constants), the paged refusal and the deterministic option.
//! `tests/grad_reference.rs` holds the checks against sdpa-core's f64 reference backward.

// Helpers of a test panic on failure: that is how a test fails.
#![allow(clippy::unwrap_used)]

#[allow(dead_code)] // `to_host` is for the files that compare outputs
mod common;

use candle_core::backprop::GradStore;
use candle_core::{DType as CDType, Device, Tensor, Var, D};
use common::to_tensor;
use sdpa_candle::{sdpa, Layout, SdpaMask, SdpaOptions};
use sdpa_core::{AttentionSpec, DType, ExplicitMask, HostBuffer, HostInputs, Mask, MaskValues, Operand, Shape};

const CPU: Device = Device::Cpu;

fn candle_dtype(dtype: DType) -> CDType {
    match dtype {
        DType::F32 => CDType::F32,
        DType::F16 => CDType::F16,
        DType::BF16 => CDType::BF16,
        DType::F8E4M3 => CDType::F8E4M3,
    }
}

/// Dims of an operand with `heads` heads and `seq` positions in `layout`'s order.
fn dims(layout: Layout, b: usize, heads: usize, seq: usize, d: usize) -> [usize; 4] {
    match layout {
        Layout::Bhsd => [b, heads, seq, d],
        Layout::Bshd => [b, seq, heads, d],
    }
}

fn heads_axis(layout: Layout) -> usize {
    match layout {
        Layout::Bhsd => 1,
        Layout::Bshd => 2,
    }
}

/// How the tensor handed to `sdpa` sits in the `Var` that is trained.
#[derive(Debug, Clone, Copy, PartialEq)]
enum View {
    /// The `Var` itself.
    Contiguous,
    /// A `Var` stored in the other dims order, transposed (a projection's `[B, S, H, D]` seen as BHSD).
    Transposed,
    /// Heads cut out of a larger `Var` (a fused QKV projection): a start offset and gaps.
    Narrowed,
}

/// A trained `Var` and the view of it that `sdpa` reads.
struct Input {
    var: Var,
    view: Tensor,
    kind: View,
    layout: Layout,
    heads: usize,
}

/// Heads of padding on each side of a narrowed input.
const PAD: usize = 2;

impl Input {
    /// `values` (contiguous in `layout`'s order) as a `Var` presented as `kind`.
    fn new(values: &Tensor, layout: Layout, kind: View) -> Self {
        let ax = heads_axis(layout);
        let heads = values.dim(ax).unwrap();
        let (var, view) = match kind {
            View::Contiguous => {
                let var = Var::from_tensor(values).unwrap();
                let view = var.as_tensor().clone();
                (var, view)
            }
            View::Transposed => {
                let var = Var::from_tensor(&values.transpose(1, 2).unwrap().contiguous().unwrap()).unwrap();
                let view = var.transpose(1, 2).unwrap();
                assert!(!view.is_contiguous() || values.dim(1).unwrap() == 1 || values.dim(2).unwrap() == 1);
                (var, view)
            }
            View::Narrowed => {
                let mut pad_dims = values.dims().to_vec();
                pad_dims[ax] = PAD;
                let pad = Tensor::ones(pad_dims, values.dtype(), &CPU).unwrap();
                let var = Var::from_tensor(&Tensor::cat(&[&pad, values, &pad], ax).unwrap()).unwrap();
                let view = var.narrow(ax, PAD, heads).unwrap();
                assert!(view.layout().start_offset() > 0);
                (var, view)
            }
        };
        Input { var, view, kind, layout, heads }
    }

    /// The gradient of the view, from the `Var`'s; a narrowed input's padding must have none.
    fn grad(&self, store: &GradStore) -> Tensor {
        let g = store.get(self.var.as_tensor()).expect("a gradient for every trained input");
        match self.kind {
            View::Contiguous => g.clone(),
            View::Transposed => g.transpose(1, 2).unwrap(),
            View::Narrowed => {
                let ax = heads_axis(self.layout);
                for start in [0, PAD + self.heads] {
                    let pad = g.narrow(ax, start, PAD).unwrap().to_dtype(CDType::F64).unwrap();
                    assert_eq!(pad.abs().unwrap().sum_all().unwrap().to_scalar::<f64>().unwrap(), 0.0);
                }
                g.narrow(ax, PAD, self.heads).unwrap()
            }
        }
    }
}

/// The mask of a case; explicit masks give their dims over `[B, Hq, Sq, Sk]`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum MaskCase {
    None,
    CausalTopLeft,
    CausalBottomRight,
    Keep([usize; 4]),
    Additive([usize; 4]),
}

/// The spec's mask, the `SdpaMask` handed to `sdpa` and the additive f64 mask the eager formula adds.
fn masks(case: MaskCase, s: Shape, inputs: &HostInputs, dtype: DType) -> (Mask, SdpaMask, Option<Tensor>) {
    let causal = |top_left: bool| {
        let add: Vec<f64> = (0..s.sq * s.sk)
            .map(|x| {
                let (i, j) = (x / s.sk, x % s.sk);
                let lim = if top_left { i + 1 } else { (i + 1 + s.sk).saturating_sub(s.sq) };
                if j < lim {
                    0.0
                } else {
                    f64::NEG_INFINITY
                }
            })
            .collect();
        Tensor::from_vec(add, (1, 1, s.sq, s.sk), &CPU).unwrap()
    };
    let explicit = |values, dims| Mask::Explicit(ExplicitMask { values, dims });
    match case {
        MaskCase::None => (Mask::None, SdpaMask::None, None),
        MaskCase::CausalTopLeft => (Mask::CausalTopLeft, SdpaMask::CausalTopLeft, Some(causal(true))),
        MaskCase::CausalBottomRight => (Mask::CausalBottomRight, SdpaMask::CausalBottomRight, Some(causal(false))),
        MaskCase::Keep(d) => {
            let add = inputs.mask.clone().unwrap();
            let bits: Vec<u8> = add.iter().map(|&x| u8::from(x == 0.0)).collect();
            let keep = Tensor::from_vec(bits, d.to_vec(), &CPU).unwrap();
            let eager = Tensor::from_vec(add, d.to_vec(), &CPU).unwrap().to_dtype(CDType::F64).unwrap();
            (explicit(MaskValues::Boolean, d), SdpaMask::Keep(keep), Some(eager))
        }
        MaskCase::Additive(d) => {
            // In the model's dtype, as candle models keep it; both sides read the rounded values.
            let t = Tensor::from_vec(inputs.mask.clone().unwrap(), d.to_vec(), &CPU)
                .unwrap()
                .to_dtype(candle_dtype(dtype))
                .unwrap();
            let eager = t.to_dtype(CDType::F64).unwrap();
            (explicit(MaskValues::Additive, d), SdpaMask::Additive(t), Some(eager))
        }
    }
}

/// candle's eager attention on BHSD tensors, in their dtype: K/V heads repeated for GQA, `q·kᵀ·scale`,
/// `+ mask`, `candle_nn::ops::softmax` (the composed one, which has a backward), `·v`.
fn eager(q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>) -> Tensor {
    let (b, hq, _, d) = q.dims4().unwrap();
    let hkv = k.dim(1).unwrap();
    let repeat = |t: &Tensor| {
        let (_, _, sk, dd) = t.dims4().unwrap();
        t.unsqueeze(2).unwrap().expand((b, hkv, hq / hkv, sk, dd)).unwrap().reshape((b, hq, sk, dd)).unwrap()
    };
    let mut att = (q.matmul(&repeat(k).t().unwrap()).unwrap() * (1.0 / (d as f64).sqrt())).unwrap();
    if let Some(m) = mask {
        att = att.broadcast_add(&m.to_dtype(att.dtype()).unwrap()).unwrap();
    }
    candle_nn::ops::softmax(&att, D::Minus1).unwrap().matmul(&repeat(v)).unwrap()
}

/// dQ, dK, dV of `sum(eager(q, k, v) ∘ dO)` by candle's autograd, computed in `dt`, as BHSD f64.
fn eager_grads(qkv: [&Tensor; 3], d_o: &Tensor, mask: Option<&Tensor>, layout: Layout, dt: CDType) -> [Tensor; 3] {
    let bhsd = |t: &Tensor| match layout {
        Layout::Bhsd => t.to_dtype(dt).unwrap().contiguous().unwrap(),
        Layout::Bshd => t.to_dtype(dt).unwrap().transpose(1, 2).unwrap().contiguous().unwrap(),
    };
    let vars = qkv.map(|t| Var::from_tensor(&bhsd(t)).unwrap());
    let o = eager(&vars[0], &vars[1], &vars[2], mask);
    let loss = (o * bhsd(d_o)).unwrap().sum_all().unwrap();
    let store = loss.backward().unwrap();
    vars.map(|v| store.get(v.as_tensor()).unwrap().to_dtype(CDType::F64).unwrap())
}

/// As BHSD f64.
fn bhsd_f64(t: &Tensor, layout: Layout) -> Tensor {
    let t = t.to_dtype(CDType::F64).unwrap();
    match layout {
        Layout::Bhsd => t,
        Layout::Bshd => t.transpose(1, 2).unwrap().contiguous().unwrap(),
    }
}

/// `‖a − b‖ / ‖b‖` in f64.
fn rel_l2(a: &Tensor, b: &Tensor) -> f64 {
    let d = (a - b).unwrap().sqr().unwrap().sum_all().unwrap().to_scalar::<f64>().unwrap();
    let r = b.sqr().unwrap().sum_all().unwrap().to_scalar::<f64>().unwrap();
    (d / r.max(f64::MIN_POSITIVE)).sqrt()
}

#[derive(Debug, Clone, Copy)]
struct Case {
    shape: Shape,
    dtype: DType,
    mask: MaskCase,
    layout: Layout,
    view: View,
}

/// Seeded random Q, K, V (and explicit mask) of a case, contiguous in its dims order, and a random dO.
struct Data {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    d_o: Tensor,
    sdpa_mask: SdpaMask,
    eager_mask: Option<Tensor>,
}

fn data(case: Case, seed: u64) -> Data {
    let Case { shape: s, dtype, layout, .. } = case;
    let provisional = AttentionSpec::new(s, dtype).with_layout(layout);
    let spec_mask = match case.mask {
        MaskCase::Keep(d) => Mask::Explicit(ExplicitMask { values: MaskValues::Boolean, dims: d }),
        MaskCase::Additive(d) => Mask::Explicit(ExplicitMask { values: MaskValues::Additive, dims: d }),
        _ => Mask::None,
    };
    let inputs = HostInputs::random(&provisional.clone().with_mask(spec_mask), seed).unwrap();
    let (_, sdpa_mask, eager_mask) = masks(case.mask, s, &inputs, dtype);
    let n_o = provisional.numel(Operand::O).unwrap();
    Data {
        q: to_tensor(&inputs.q, &dims(layout, s.b, s.hq, s.sq, s.d), &CPU),
        k: to_tensor(&inputs.k, &dims(layout, s.b, s.hkv, s.sk, s.d), &CPU),
        v: to_tensor(&inputs.v, &dims(layout, s.b, s.hkv, s.sk, s.dv), &CPU),
        d_o: to_tensor(&HostBuffer::random(dtype, n_o, seed ^ 0xd0), &dims(layout, s.b, s.hq, s.sq, s.dv), &CPU),
        sdpa_mask,
        eager_mask,
    }
}

/// dQ, dK, dV through `sdpa` on `Var`s presented as `view`, as BHSD f64.
fn sdpa_grads(d: &Data, layout: Layout, view: View, opts: &SdpaOptions) -> [Tensor; 3] {
    let inputs = [&d.q, &d.k, &d.v].map(|t| Input::new(t, layout, view));
    let o = sdpa(&inputs[0].view, &inputs[1].view, &inputs[2].view, opts).unwrap();
    assert!(o.track_op());
    let loss = (o * &d.d_o).unwrap().sum_all().unwrap();
    let store = loss.backward().unwrap();
    inputs.map(|i| {
        let g = i.grad(&store);
        assert_eq!(g.dims(), i.view.dims());
        assert_eq!(g.dtype(), i.view.dtype());
        bhsd_f64(&g, layout)
    })
}

/// One case: sdpa's gradients against candle's eager autograd in f64 (f32: the f32 backward tolerance;
/// f16/bf16: at most twice the error of the same eager backward run in the inputs' dtype, plus 1e-4).
fn check(case: Case, seed: u64) {
    let d = data(case, seed);
    let opts = SdpaOptions { layout: case.layout, mask: d.sdpa_mask.clone(), ..Default::default() };
    let ours = sdpa_grads(&d, case.layout, case.view, &opts);
    let qkv = [&d.q, &d.k, &d.v];
    let exact = eager_grads(qkv, &d.d_o, d.eager_mask.as_ref(), case.layout, CDType::F64);
    let unfused = match case.dtype {
        DType::F32 => None,
        dt => Some(eager_grads(qkv, &d.d_o, d.eager_mask.as_ref(), case.layout, candle_dtype(dt))),
    };
    for (i, name) in ["dq", "dk", "dv"].iter().enumerate() {
        let err = rel_l2(&ours[i], &exact[i]);
        match &unfused {
            None => assert!(err <= 1e-5, "{case:?} {name}: relative L2 {err:.3e} against candle's f64 autograd"),
            Some(u) => {
                let theirs = rel_l2(&u[i], &exact[i]);
                // Plus 1e-4 where candle's own error is near zero, as sdpa-core's `within_unfused` allows.
                assert!(
                    err <= 2.0 * theirs + 1e-4,
                    "{case:?} {name}: relative L2 {err:.3e}, more than twice the {theirs:.3e} of candle's eager \
                     backward in {:?}",
                    case.dtype
                );
            }
        }
    }
}

fn all_masks(s: Shape) -> Vec<MaskCase> {
    vec![
        MaskCase::None,
        MaskCase::CausalTopLeft,
        MaskCase::CausalBottomRight,
        MaskCase::Keep([s.b, s.hq, s.sq, s.sk]),
        MaskCase::Additive([1, 1, s.sq, s.sk]),
    ]
}

#[test]
fn gradients_match_candles_autograd_for_every_mask_layout_and_view_in_f32() {
    // GQA 4, Sq < Sk, lengths and head dims that are no multiple of any tile, Dv != D.
    let s = Shape { b: 2, hq: 8, hkv: 2, sq: 19, sk: 27, d: 20, dv: 12 };
    let mut n = 0;
    for layout in [Layout::Bhsd, Layout::Bshd] {
        for view in [View::Contiguous, View::Transposed, View::Narrowed] {
            for mask in all_masks(s) {
                check(Case { shape: s, dtype: DType::F32, mask, layout, view }, n);
                n += 1;
            }
        }
    }
}

#[test]
fn gradients_in_f16_and_bf16_are_within_twice_candles_own_error() {
    let s = Shape { b: 1, hq: 4, hkv: 1, sq: 23, sk: 23, d: 32, dv: 32 };
    let mut n = 100;
    for dtype in [DType::F16, DType::BF16] {
        for (layout, view) in [(Layout::Bshd, View::Contiguous), (Layout::Bhsd, View::Transposed)] {
            for mask in [MaskCase::None, MaskCase::CausalTopLeft, MaskCase::Additive([1, 1, s.sq, s.sk])] {
                check(Case { shape: s, dtype, mask, layout, view }, n);
                n += 1;
            }
        }
    }
}

#[test]
fn awkward_shapes_and_gqa_groups_match_candles_autograd() {
    let shapes = [
        // More queries than keys (top-left causal keeps every row seeing a key), MHA, D = 1.
        Shape { b: 1, hq: 2, hkv: 2, sq: 13, sk: 5, d: 1, dv: 3 },
        // One query against many keys, MQA with 8 query heads.
        Shape { b: 3, hq: 8, hkv: 1, sq: 1, sk: 70, d: 16, dv: 16 },
        // Head dim 128, Dv != D, GQA 8.
        Shape { b: 1, hq: 8, hkv: 1, sq: 33, sk: 40, d: 128, dv: 64 },
    ];
    let mut n = 200;
    for s in shapes {
        for mask in [MaskCase::None, MaskCase::CausalTopLeft] {
            for layout in [Layout::Bhsd, Layout::Bshd] {
                check(Case { shape: s, dtype: DType::F32, mask, layout, view: View::Contiguous }, n);
                n += 1;
            }
        }
    }
}

#[test]
fn constants_and_the_mask_get_no_gradient() {
    let s = Shape { b: 1, hq: 4, hkv: 2, sq: 9, sk: 11, d: 8, dv: 8 };
    let case = Case { shape: s, dtype: DType::F32, mask: MaskCase::None, layout: Layout::Bshd, view: View::Contiguous };
    let d = data(case, 7);
    // Only Q trains; K and V are constants; the additive mask is a Var, which sdpa never differentiates.
    let q = Var::from_tensor(&d.q).unwrap();
    let mask = Var::from_tensor(&Tensor::zeros((1, 1, s.sq, s.sk), CDType::F32, &CPU).unwrap()).unwrap();
    let opts = SdpaOptions::bshd().with_mask(SdpaMask::Additive(mask.as_tensor().clone()));
    let o = sdpa(q.as_tensor(), &d.k, &d.v, &opts).unwrap();
    let store = (o * &d.d_o).unwrap().sum_all().unwrap().backward().unwrap();
    assert!(store.get(mask.as_tensor()).is_none(), "the mask got a gradient");
    let dq = bhsd_f64(store.get(q.as_tensor()).unwrap(), Layout::Bshd);
    let exact = eager_grads([&d.q, &d.k, &d.v], &d.d_o, None, Layout::Bshd, CDType::F64);
    assert!(rel_l2(&dq, &exact[0]) <= 1e-5);

    // Inputs that track nothing: plain inference, nothing for autograd to hold.
    let o = sdpa(&d.q, &d.k, &d.v, &SdpaOptions::bshd()).unwrap();
    assert!(!o.track_op());
}

#[test]
fn the_deterministic_backward_gives_bitwise_equal_gradients() {
    let s = Shape { b: 2, hq: 4, hkv: 1, sq: 40, sk: 40, d: 16, dv: 16 };
    let case = Case {
        shape: s,
        dtype: DType::F32,
        mask: MaskCase::CausalTopLeft,
        layout: Layout::Bshd,
        view: View::Contiguous,
    };
    let d = data(case, 11);
    let opts = SdpaOptions::bshd().with_mask(SdpaMask::CausalTopLeft).with_deterministic_backward(true);
    let a = sdpa_grads(&d, Layout::Bshd, View::Contiguous, &opts);
    let b = sdpa_grads(&d, Layout::Bshd, View::Contiguous, &opts);
    for (x, y) in a.iter().zip(&b) {
        let (x, y) =
            (x.flatten_all().unwrap().to_vec1::<f64>().unwrap(), y.flatten_all().unwrap().to_vec1::<f64>().unwrap());
        assert!(x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()));
    }
}

#[test]
fn a_second_backward_over_the_same_graph_gives_the_same_gradients() {
    // The op keeps the forward's LSE for as long as the graph lives, not for one backward.
    let s = Shape { b: 1, hq: 2, hkv: 2, sq: 6, sk: 6, d: 8, dv: 8 };
    let case = Case { shape: s, dtype: DType::F32, mask: MaskCase::None, layout: Layout::Bhsd, view: View::Contiguous };
    let d = data(case, 3);
    let q = Var::from_tensor(&d.q).unwrap();
    let o = sdpa(q.as_tensor(), &d.k, &d.v, &SdpaOptions::bhsd()).unwrap();
    let loss = (o * &d.d_o).unwrap().sum_all().unwrap();
    let first = loss.backward().unwrap().get(q.as_tensor()).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let second = loss.backward().unwrap().get(q.as_tensor()).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(first, second);
}

/// A causal bottom-right additive mask `[1, 1, sq, sk]` in f64.
fn causal_bottom_right(sq: usize, sk: usize) -> Tensor {
    let add: Vec<f64> = (0..sq * sk)
        .map(|x| if x % sk < (x / sk + 1 + sk).saturating_sub(sq) { 0.0 } else { f64::NEG_INFINITY })
        .collect();
    Tensor::from_vec(add, (1, 1, sq, sk), &CPU).unwrap()
}

#[test]
fn varlen_gradients_match_candles_autograd_per_sequence() {
    // Packed [total, H, D] (BSHD); sequences of lengths 0 and 1 among them, and one whose queries see no
    // key (its rows are zeros, so its dQ is zero); GQA 2; Dv != D; bottom-right causal per sequence.
    let (hq, hkv, d, dv) = (4, 2, 12, 8);
    let lens_q = [3usize, 0, 1, 7, 2];
    let lens_k = [5usize, 0, 1, 9, 0];
    let (tq, tk): (usize, usize) = (lens_q.iter().sum(), lens_k.iter().sum());
    let offsets = |lens: &[usize]| -> Vec<u32> {
        std::iter::once(0)
            .chain(lens.iter().scan(0u32, |acc, &l| {
                *acc += l as u32;
                Some(*acc)
            }))
            .collect()
    };
    let (cu_q, cu_k) = (offsets(&lens_q), offsets(&lens_k));
    let rand = |n: usize, seed: u64, dims: &[usize]| to_tensor(&HostBuffer::random(DType::F32, n, seed), dims, &CPU);
    let q = rand(tq * hq * d, 1, &[tq, hq, d]);
    let k = rand(tk * hkv * d, 2, &[tk, hkv, d]);
    let v = rand(tk * hkv * dv, 3, &[tk, hkv, dv]);
    let d_o = rand(tq * hq * dv, 4, &[tq, hq, dv]);

    let vars = [&q, &k, &v].map(|t| Var::from_tensor(t).unwrap());
    let opts = SdpaOptions::bshd().with_mask(SdpaMask::CausalBottomRight);
    let cu = |o: &[u32]| Tensor::new(o, &CPU).unwrap();
    let o = sdpa_candle::sdpa_varlen(&vars[0], &vars[1], &vars[2], &cu(&cu_q), &cu(&cu_k), &opts).unwrap();
    let store = (o * &d_o).unwrap().sum_all().unwrap().backward().unwrap();
    let ours = vars.map(|x| store.get(x.as_tensor()).unwrap().to_dtype(CDType::F64).unwrap());

    // candle's eager attention per sequence on f64 views of the same packed Vars.
    let exact = [&q, &k, &v].map(|t| Var::from_tensor(&t.to_dtype(CDType::F64).unwrap()).unwrap());
    let mut outs = Vec::new();
    for b in 0..lens_q.len() {
        let (sq, sk) = (lens_q[b], lens_k[b]);
        if sq == 0 {
            continue;
        }
        if sk == 0 {
            outs.push(Tensor::zeros((sq, hq, dv), CDType::F64, &CPU).unwrap());
            continue;
        }
        let seq = |t: &Var, start: u32, len: usize| {
            t.narrow(0, start as usize, len).unwrap().unsqueeze(0).unwrap().transpose(1, 2).unwrap()
        };
        let o = eager(
            &seq(&exact[0], cu_q[b], sq),
            &seq(&exact[1], cu_k[b], sk),
            &seq(&exact[2], cu_k[b], sk),
            Some(&causal_bottom_right(sq, sk)),
        );
        outs.push(o.transpose(1, 2).unwrap().squeeze(0).unwrap());
    }
    let o = Tensor::cat(&outs, 0).unwrap();
    let store = (o * d_o.to_dtype(CDType::F64).unwrap()).unwrap().sum_all().unwrap().backward().unwrap();
    for (i, name) in ["dq", "dk", "dv"].iter().enumerate() {
        let want = store.get(exact[i].as_tensor()).unwrap();
        let err = rel_l2(&ours[i], want);
        assert!(err <= 1e-5, "varlen {name}: relative L2 {err:.3e} against candle's f64 autograd");
    }
    // The queries of the sequence with no keys (the last two rows) get zero gradient, not NaN.
    let tail = ours[0].narrow(0, tq - 2, 2).unwrap().abs().unwrap().sum_all().unwrap().to_scalar::<f64>().unwrap();
    assert_eq!(tail, 0.0);
}

#[test]
fn the_backward_of_a_paged_cache_is_refused_with_a_clear_error() {
    let (hq, hkv, d) = (2, 1, 8);
    let q = Var::from_tensor(&Tensor::ones((3, hq, d), CDType::F32, &CPU).unwrap()).unwrap();
    let pages = Tensor::ones((2, 4, hkv, d), CDType::F32, &CPU).unwrap();
    let cu = Tensor::new(&[0u32, 3], &CPU).unwrap();
    let table = Tensor::new(&[[1u32]], &CPU).unwrap();
    let lens = Tensor::new(&[3u32], &CPU).unwrap();
    let o = sdpa_candle::sdpa_paged(q.as_tensor(), &pages, &pages, &cu, &table, &lens, &SdpaOptions::bshd()).unwrap();
    let err = o.sum_all().unwrap().backward().unwrap_err().to_string();
    assert!(err.contains("backward of a paged KV cache"), "{err}");
}
