//! The serving entry points (`sdpa_varlen`, `sdpa_paged`, the candle-flash-attn-named varlen and paged
//! functions, `append_to_pages`) against dense per-sequence attention: each sequence of a ragged batch is
//! gathered out of the packed or paged inputs into a dense call of its own (`sdpa_core::sequence_as_dense`)
//! and computed by the f64 reference, the oracle every output row is held to. Awkward batches throughout:
//! sequences of length 0 and 1, Sq_b above and below Sk_b, page size 1 and caches ending mid-page,
//! shuffled and repeated pages, GQA, Dv != D, both dims orders, every dtype. Then bad offsets and tables,
//! refused with errors that name the problem. With the `cuda` feature the same table also runs on CUDA
//! device 0 (on the GPU machine).

// Helpers of a test panic on failure: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use candle_core::{Device, Tensor};
use common::{to_host, to_tensor};
use sdpa_candle::{
    append_to_pages, flash_attn_varlen, flash_attn_varlen_alibi, flash_attn_varlen_alibi_windowed,
    flash_attn_varlen_alibi_windowed_softcap, flash_attn_varlen_paged_windowed, flash_attn_varlen_windowed, sdpa_paged,
    sdpa_varlen, Diagonal, Layout, SdpaAlibi, SdpaMask, SdpaOptions, Window,
};
use sdpa_core::check::tolerance;
use sdpa_core::{
    reference_attention, sequence_as_dense, Alibi, AttentionSpec, DType, F32Math, HostBuffer, HostInputs, Mask,
    Operand, Paging, Ragged, Shape, Variants,
};

fn u32s(v: &[usize], dev: &Device) -> Tensor {
    let v: Vec<u32> = v.iter().map(|&x| x as u32).collect();
    Tensor::new(v.as_slice(), dev).unwrap()
}

/// Which entry point a case goes through.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Entry {
    /// `sdpa_varlen` (packed K/V) or `sdpa_paged` (paged K/V), options from the spec.
    Sdpa,
    /// The candle-flash-attn-named function that takes the case's options (BSHD, bottom-right diagonal).
    Flash,
}

#[derive(Debug, Clone)]
struct Case {
    seqlens_q: Vec<usize>,
    seqlens_k: Vec<usize>,
    /// Page size and pool size (pages); `None`: packed K/V.
    pages: Option<(usize, usize)>,
    hq: usize,
    hkv: usize,
    d: usize,
    dv: usize,
    dtype: DType,
    layout: Layout,
    mask: Mask,
    variants: Variants,
}

impl Case {
    fn new(seqlens_q: &[usize], seqlens_k: &[usize]) -> Self {
        Case {
            seqlens_q: seqlens_q.to_vec(),
            seqlens_k: seqlens_k.to_vec(),
            pages: None,
            hq: 4,
            hkv: 2,
            d: 16,
            dv: 16,
            dtype: DType::F32,
            layout: Layout::Bshd,
            mask: Mask::None,
            variants: Variants::default(),
        }
    }

    fn spec(&self) -> AttentionSpec {
        let mut r = Ragged::new(self.seqlens_q.clone(), self.seqlens_k.clone());
        if let Some((page_size, num_pages)) = self.pages {
            let widest = r.clone().paged(page_size, 0).pages.unwrap().max_pages;
            r = Ragged { pages: Some(Paging { page_size, num_pages, max_pages: widest + 1 }), ..r };
        }
        let shape = Shape {
            b: r.batch(),
            hq: self.hq,
            hkv: self.hkv,
            sq: r.max_q().max(1),
            sk: r.max_k().max(1),
            d: self.d,
            dv: self.dv,
        };
        AttentionSpec::new(shape, self.dtype)
            .with_mask(self.mask)
            .with_variants(self.variants.clone())
            .with_ragged(r, self.layout)
    }
}

/// The options `sdpa_varlen`/`sdpa_paged` take for a spec.
fn options_of(spec: &AttentionSpec, layout: Layout) -> SdpaOptions {
    let mut o = SdpaOptions { layout, ..Default::default() };
    o.mask = match spec.mask {
        Mask::None => SdpaMask::None,
        Mask::CausalTopLeft => SdpaMask::CausalTopLeft,
        Mask::CausalBottomRight => SdpaMask::CausalBottomRight,
        Mask::Explicit(_) => unreachable!("ragged batches take no explicit mask"),
    };
    o.window = spec.variants.window;
    o.softcap = spec.variants.softcap;
    o.diagonal = spec.variants.diagonal;
    o.alibi = spec.alibi_slopes().unwrap().map(SdpaAlibi::Slopes);
    o
}

/// The inputs of a case as candle tensors: Q, K, V, cu_seqlens_q, the K offsets (cumulative) or cache
/// lengths, and the block table.
struct Tensors {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_q: Tensor,
    cu_k: Tensor,
    lens_k: Tensor,
    table: Option<Tensor>,
}

fn tensors(spec: &AttentionSpec, inputs: &HostInputs, dev: &Device) -> Tensors {
    let r = spec.ragged.as_ref().unwrap();
    let s = spec.shape;
    let layout = spec.layout().unwrap();
    let packed = |rows: usize, h: usize, d: usize| match layout {
        Layout::Bshd => vec![rows, h, d],
        Layout::Bhsd => vec![h, rows, d],
    };
    let (kd, vd) = match r.pages {
        None => (packed(r.total_k(), s.hkv, s.d), packed(r.total_k(), s.hkv, s.dv)),
        Some(p) => match layout {
            Layout::Bshd => (vec![p.num_pages, p.page_size, s.hkv, s.d], vec![p.num_pages, p.page_size, s.hkv, s.dv]),
            Layout::Bhsd => (vec![p.num_pages, s.hkv, p.page_size, s.d], vec![p.num_pages, s.hkv, p.page_size, s.dv]),
        },
    };
    Tensors {
        q: to_tensor(&inputs.q, &packed(r.total_q(), s.hq, s.d), dev),
        k: to_tensor(&inputs.k, &kd, dev),
        v: to_tensor(&inputs.v, &vd, dev),
        cu_q: u32s(&r.offsets_q(), dev),
        cu_k: u32s(&r.offsets_k(), dev),
        lens_k: u32s(&r.seqlens_k, dev),
        table: inputs.block_table.as_ref().map(|t| {
            let p = r.pages.unwrap();
            Tensor::from_vec(t.clone(), (r.batch(), p.max_pages), &Device::Cpu).unwrap().to_device(dev).unwrap()
        }),
    }
}

/// Relative L2 error of `out` (laid out by the spec) against each sequence computed densely in f64; rows of
/// a sequence without keys must be zeros. NaN anywhere fails.
fn error_against_dense(spec: &AttentionSpec, inputs: &HostInputs, out: &HostBuffer) -> f64 {
    assert_eq!(out.len(), spec.numel(Operand::O).unwrap(), "output elements");
    let s = spec.shape;
    let (mut d2, mut r2) = (0.0, 0.0);
    for b in 0..s.b {
        let seq = spec.seq(b);
        let dense = sequence_as_dense(spec, inputs, b).unwrap();
        let want = dense.map(|(ds, di)| reference_attention(&ds, &di).unwrap().o);
        for h in 0..s.hq {
            for i in 0..seq.sq {
                let at = spec.o_offset(&seq, b, h, i);
                for c in 0..s.dv {
                    let got = out.get_f64(at + c);
                    assert!(!got.is_nan(), "NaN at sequence {b}, head {h}, row {i}");
                    let w = want.as_ref().map_or(0.0, |o| o[(h * seq.sq + i) * s.dv + c]);
                    d2 += (got - w) * (got - w);
                    r2 += w * w;
                }
            }
        }
    }
    (d2 / r2.max(f64::MIN_POSITIVE)).sqrt()
}

/// Runs a case through one entry point on `dev` and holds it to the dense per-sequence oracle.
fn check(case: &Case, entry: Entry, dev: &Device, seed: u64) {
    let spec = case.spec();
    spec.validate().unwrap();
    let inputs = HostInputs::random(&spec, seed).unwrap();
    let mut t = tensors(&spec, &inputs, dev);
    if seed % 2 == 1 {
        // The integer tables may live on the host whatever the device of Q, K and V.
        let host = |x: &Tensor| x.to_device(&Device::Cpu).unwrap();
        (t.cu_q, t.cu_k, t.lens_k, t.table) =
            (host(&t.cu_q), host(&t.cu_k), host(&t.lens_k), t.table.as_ref().map(host));
    }
    let paged = t.table.is_some();
    let o = match entry {
        Entry::Sdpa => {
            let opts = options_of(&spec, case.layout);
            match &t.table {
                None => sdpa_varlen(&t.q, &t.k, &t.v, &t.cu_q, &t.cu_k, &opts),
                Some(table) => sdpa_paged(&t.q, &t.k, &t.v, &t.cu_q, table, &t.lens_k, &opts),
            }
        }
        Entry::Flash => flash(&spec, &t),
    }
    .unwrap_or_else(|e| panic!("{entry:?} on {case:?}: {e}"));
    let out = to_host(&o, case.dtype);
    let err = error_against_dense(&spec, &inputs, &out);
    let tol = tolerance(case.dtype, F32Math::Exact);
    assert!(err <= tol, "{entry:?} (paged {paged}) on {case:?}: relative error {err:.3e} > {tol:.1e}");
}

/// The candle-flash-attn-named function for a spec built from FlashAttention's arguments (BSHD, the
/// bottom-right diagonal, causal as a right window of 0); picks the narrowest function that takes them,
/// so each is called.
fn flash(spec: &AttentionSpec, t: &Tensors) -> candle_core::Result<Tensor> {
    let r = spec.ragged.as_ref().unwrap();
    let (mq, mk) = (spec.shape.sq, spec.shape.sk);
    let scale = spec.scale() as f32;
    let causal = spec.mask == Mask::CausalBottomRight;
    let w = spec.variants.window;
    let (left, right) = match (causal, w) {
        (true, w) => (w.and_then(|w| w.left), Some(0)),
        (false, Some(w)) => (w.left, w.right),
        (false, None) => (None, None),
    };
    let slopes = spec.alibi_slopes().unwrap().map(|s| Tensor::new(s.as_slice(), t.q.device()).unwrap());
    let cap = spec.variants.softcap.map(|c| c as f32);
    let (q, k, v, cq, ck) = (&t.q, &t.k, &t.v, &t.cu_q, &t.cu_k);
    if let Some(table) = &t.table {
        assert!(slopes.is_none(), "the paged function takes no ALiBi");
        let ps = r.pages.unwrap().page_size;
        return flash_attn_varlen_paged_windowed(q, k, v, cq, ck, table, None, mq, mk, scale, left, right, ps, cap);
    }
    match (&slopes, cap, w.is_some()) {
        (_, Some(c), _) => {
            flash_attn_varlen_alibi_windowed_softcap(q, k, v, slopes.as_ref(), cq, ck, mq, mk, scale, left, right, c)
        }
        (Some(s), None, false) => flash_attn_varlen_alibi(q, k, v, s, cq, ck, mq, mk, scale, causal),
        (Some(s), None, true) => flash_attn_varlen_alibi_windowed(q, k, v, s, cq, ck, mq, mk, scale, left, right),
        (None, None, false) => flash_attn_varlen(q, k, v, cq, ck, mq, mk, scale, causal),
        (None, None, true) => flash_attn_varlen_windowed(q, k, v, cq, ck, mq, mk, scale, left, right),
    }
}

/// Lengths that exercise the edges: an empty query, a sequence without keys, Sq_b > Sk_b and Sq_b < Sk_b,
/// single tokens.
const MIXED_Q: [usize; 5] = [5, 0, 1, 7, 3];
const MIXED_K: [usize; 5] = [9, 3, 0, 4, 3];

fn sdpa_cases(dev_is_cpu: bool) -> Vec<Case> {
    let mut cases = Vec::new();
    let masks = [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight];
    for (i, mask) in masks.into_iter().enumerate() {
        for layout in [Layout::Bshd, Layout::Bhsd] {
            for pages in [None, Some((1, 19)), Some((4, 9)), Some((3, 4))] {
                let mut c = Case::new(&MIXED_Q, &MIXED_K);
                // Pools of 9 or 19 pages hold every page once (shuffled, some spare); a pool of 4 pages of 3
                // for 8 used pages repeats pages across sequences (a shared prefix).
                c.pages = pages;
                c.mask = mask;
                c.layout = layout;
                c.dtype = [DType::F32, DType::F16, DType::BF16][i];
                c.dv = if layout == Layout::Bhsd { 8 } else { 16 };
                cases.push(c);
            }
        }
    }
    // The variants per sequence: a window on each diagonal, softcap, ALiBi (standard slopes), MQA.
    let mut windowed = Case::new(&MIXED_Q, &MIXED_K);
    windowed.mask = Mask::CausalBottomRight;
    windowed.variants.window = Some(Window::left(2));
    let mut two_sided = Case::new(&[4, 6], &[6, 2]);
    two_sided.variants = Variants {
        window: Some(Window { left: Some(1), right: Some(2) }),
        diagonal: Some(Diagonal::TopLeft),
        ..Default::default()
    };
    two_sided.pages = Some((2, 8));
    let mut capped = Case::new(&MIXED_Q, &MIXED_K);
    capped.variants.softcap = Some(0.5);
    capped.mask = Mask::CausalTopLeft;
    capped.pages = Some((4, 9));
    let mut alibi = Case::new(&MIXED_Q, &MIXED_K);
    alibi.variants =
        Variants { alibi: Some(Alibi::Standard), diagonal: Some(Diagonal::BottomRight), ..Default::default() };
    alibi.hq = 8;
    alibi.hkv = 1;
    alibi.dtype = DType::BF16;
    cases.extend([windowed, two_sided, capped, alibi]);
    if !dev_is_cpu {
        // A longer batch where the GPU kernels tile: lengths across tile edges.
        let mut long = Case::new(&[1, 130, 67, 1], &[300, 130, 200, 1]);
        long.mask = Mask::CausalBottomRight;
        long.d = 64;
        long.dv = 64;
        long.dtype = DType::F16;
        cases.push(long.clone());
        long.pages = Some((16, 60));
        cases.push(long);
    }
    cases
}

/// FlashAttention's argument sets (BSHD, bottom-right diagonal), packed and paged.
fn flash_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let br = Some(Diagonal::BottomRight);
    let variants = [
        (Mask::None, Variants::default()),
        (Mask::CausalBottomRight, Variants::default()),
        (Mask::CausalBottomRight, Variants { window: Some(Window::left(2)), ..Default::default() }),
        (
            Mask::None,
            Variants { window: Some(Window { left: Some(1), right: Some(3) }), diagonal: br, ..Default::default() },
        ),
        (Mask::CausalBottomRight, Variants { alibi: Some(Alibi::Standard), ..Default::default() }),
        (
            Mask::None,
            Variants { alibi: Some(Alibi::Slopes(vec![0.5, 0.25, 0.125, 1.0])), diagonal: br, ..Default::default() },
        ),
        (
            Mask::CausalBottomRight,
            Variants { window: Some(Window::left(3)), alibi: Some(Alibi::Standard), ..Default::default() },
        ),
        (Mask::CausalBottomRight, Variants { window: Some(Window::left(3)), softcap: Some(0.5), ..Default::default() }),
        (Mask::None, Variants { softcap: Some(0.5), alibi: Some(Alibi::Standard), diagonal: br, ..Default::default() }),
    ];
    for (i, (mask, v)) in variants.into_iter().enumerate() {
        let mut c = Case::new(&MIXED_Q, &MIXED_K);
        c.mask = mask;
        c.variants = v;
        c.dtype = [DType::F16, DType::BF16, DType::F32][i % 3];
        let alibi = c.variants.alibi.is_some();
        cases.push(c.clone());
        if !alibi {
            c.pages = Some((3, 10));
            cases.push(c);
        }
    }
    cases
}

#[test]
fn sdpa_varlen_and_sdpa_paged_match_dense_attention_per_sequence() {
    for (i, c) in sdpa_cases(true).iter().enumerate() {
        check(c, Entry::Sdpa, &Device::Cpu, 10 + i as u64);
    }
}

#[test]
fn the_flash_attn_varlen_functions_match_dense_attention_per_sequence() {
    for (i, c) in flash_cases().iter().enumerate() {
        check(c, Entry::Flash, &Device::Cpu, 100 + i as u64);
    }
}

#[cfg(feature = "cuda")]
#[test]
fn every_serving_case_matches_dense_attention_on_cuda() {
    let gpu = Device::new_cuda(0).expect("tests/serving.rs needs CUDA device 0 with the cuda feature");
    for (i, c) in sdpa_cases(false).iter().enumerate() {
        check(c, Entry::Sdpa, &gpu, 200 + i as u64);
    }
    for (i, c) in flash_cases().iter().enumerate() {
        check(c, Entry::Flash, &gpu, 300 + i as u64);
    }
    // The append on the GPU writes what it writes on the CPU.
    let (k_new, v_new) =
        (Tensor::randn(0f32, 1.0, (5, 2, 4), &gpu).unwrap(), Tensor::randn(0f32, 1.0, (5, 2, 3), &gpu).unwrap());
    let k_pages = Tensor::randn(0f32, 1.0, (6, 3, 2, 4), &gpu).unwrap();
    let v_pages = Tensor::randn(0f32, 1.0, (6, 3, 2, 3), &gpu).unwrap();
    let cpu = |t: &Tensor| t.to_device(&Device::Cpu).unwrap();
    let (ck, cv) = (cpu(&k_pages), cpu(&v_pages));
    let table = Tensor::new(&[[5u32, 1, 3], [0, 2, u32::MAX]], &gpu).unwrap();
    let (lens, cu_new) = (u32s(&[4, 2], &gpu), u32s(&[0, 3, 5], &gpu));
    append_to_pages(&k_new, &v_new, &k_pages, &v_pages, &table, &lens, &cu_new).unwrap();
    append_to_pages(&cpu(&k_new), &cpu(&v_new), &ck, &cv, &cpu(&table), &cpu(&lens), &cpu(&cu_new)).unwrap();
    let same =
        |a: &Tensor, b: &Tensor| (cpu(a) - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    assert_eq!((same(&k_pages, &ck), same(&v_pages, &cv)), (0.0, 0.0));
}

/// The output of the paged call equals the packed call on the same keys (the pages gathered back into
/// rows): paging changes where keys live, never the result.
#[test]
fn paged_and_packed_give_the_same_rows() {
    let mut c = Case::new(&MIXED_Q, &MIXED_K);
    c.mask = Mask::CausalBottomRight;
    c.pages = Some((2, 12));
    let spec = c.spec();
    let inputs = HostInputs::random(&spec, 7).unwrap();
    let t = tensors(&spec, &inputs, &Device::Cpu);
    let opts = options_of(&spec, Layout::Bshd);
    let paged = sdpa_paged(&t.q, &t.k, &t.v, &t.cu_q, t.table.as_ref().unwrap(), &t.lens_k, &opts).unwrap();
    // Gather each sequence's keys out of its pages, in order.
    let table = inputs.block_table.as_ref().unwrap();
    let p = spec.ragged.as_ref().unwrap().pages.unwrap();
    let rows: Vec<Tensor> = (0..c.seqlens_k.len())
        .flat_map(|b| (0..c.seqlens_k[b]).map(move |j| (b, j)))
        .map(|(b, j)| {
            let (page, slot) = p.locate(table, b, j);
            (t.k.get(page).unwrap().get(slot).unwrap(), t.v.get(page).unwrap().get(slot).unwrap())
        })
        .map(|(k, v)| Tensor::stack(&[k, v], 0).unwrap())
        .collect();
    let kv = Tensor::stack(&rows, 0).unwrap(); // [total_k, 2, Hkv, D]
    let (k, v) = (kv.narrow(1, 0, 1).unwrap().squeeze(1).unwrap(), kv.narrow(1, 1, 1).unwrap().squeeze(1).unwrap());
    let packed = sdpa_varlen(&t.q, &k, &v, &t.cu_q, &t.cu_k, &opts).unwrap();
    let diff = (paged - packed).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    assert!(diff < 1e-6, "paged and packed differ by {diff}");
}

/// The error text of a call that must fail.
fn err(r: candle_core::Result<Tensor>) -> String {
    match r {
        Ok(t) => panic!("expected an error, got a tensor of shape {:?}", t.dims()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_offsets_are_refused_with_their_problem_named() {
    let dev = Device::Cpu;
    let q = Tensor::zeros((6, 4, 8), candle_core::DType::F32, &dev).unwrap();
    let kv = Tensor::zeros((9, 2, 8), candle_core::DType::F32, &dev).unwrap();
    let o = SdpaOptions::bshd();
    let cu = |v: &[i64]| Tensor::new(v, &dev).unwrap();
    let good_k = cu(&[0, 4, 9]);
    let cases = [
        (err(sdpa_varlen(&q, &kv, &kv, &cu(&[0, 4, 2]), &good_k, &o)), "goes down at sequence 1 (4 then 2)"),
        (err(sdpa_varlen(&q, &kv, &kv, &cu(&[1, 6]), &cu(&[0, 9]), &o)), "starts at 1"),
        (err(sdpa_varlen(&q, &kv, &kv, &cu(&[0]), &cu(&[0]), &o)), "B + 1 >= 2"),
        (
            err(sdpa_varlen(&q, &kv, &kv, &cu(&[0, 2, 6]), &cu(&[0, 9]), &o)),
            "names 2 sequences but cu_seqlens_k names 1",
        ),
        (
            err(sdpa_varlen(&q, &kv, &kv, &cu(&[0, 2, 5]), &good_k, &o)),
            "q holds 6 token rows but the query offsets end at 5",
        ),
        (
            err(sdpa_varlen(&q, &kv, &kv, &cu(&[0, 2, 6]), &cu(&[0, 4, 8]), &o)),
            "hold 9 token rows but the key offsets end at 8",
        ),
        (err(sdpa_varlen(&q, &kv, &kv, &cu(&[0, -2, 6]), &good_k, &o)), "cu_seqlens_q[1] is -2"),
        (
            err(sdpa_varlen(
                &q,
                &kv,
                &kv,
                &cu(&[0, 2, 6]),
                &good_k,
                &o.clone().with_mask(SdpaMask::Additive(q.clone())),
            )),
            "explicit mask does not combine with a ragged batch",
        ),
        (err(sdpa_varlen(&q.unsqueeze(0).unwrap(), &kv, &kv, &cu(&[0, 6]), &cu(&[0, 9]), &o)), "must have rank 3"),
        // candle-flash-attn's bounds are checked, not trusted.
        (
            err(flash_attn_varlen(&q, &kv, &kv, &cu(&[0, 2, 6]), &good_k, 3, 5, 1.0, true)),
            "sequence 1 has 4 query tokens, more than the shape's bound 3",
        ),
    ];
    for (got, want) in cases {
        assert!(got.contains(want), "expected `{want}` in: {got}");
        assert!(got.starts_with("sdpa:"), "{got}");
    }
}

#[test]
fn bad_block_tables_are_refused_before_anything_runs() {
    let dev = Device::Cpu;
    let f = candle_core::DType::F32;
    let q = Tensor::zeros((3, 4, 8), f, &dev).unwrap();
    // 5 pages of 4 slots; sequence 0 has 6 cached keys (2 pages), sequence 1 has 3 (1 page).
    let pages = Tensor::zeros((5, 4, 2, 8), f, &dev).unwrap();
    let cu_q = Tensor::new(&[0u32, 2, 3], &dev).unwrap();
    let lens = Tensor::new(&[6u32, 3], &dev).unwrap();
    let o = SdpaOptions::bshd().with_mask(SdpaMask::CausalBottomRight);
    let table = |t: &[[i64; 2]; 2]| Tensor::new(t, &dev).unwrap();
    let run = |t: &Tensor, lens: &Tensor| sdpa_paged(&q, &pages, &pages, &cu_q, t, lens, &o);
    let big = Tensor::zeros((5, 300, 2, 8), f, &dev).unwrap();
    // The unused column of sequence 1 may hold anything non-negative.
    assert!(run(&table(&[[4, 0], [2, 4_000_000_000]]), &lens).is_ok());
    let cases = [
        (err(run(&table(&[[4, 5], [2, 0]]), &lens)), "row 0, column 1 names page 5, but the cache has 5 pages"),
        (err(run(&table(&[[4, 0], [-1, 0]]), &lens)), "block_table[2] is -1"),
        (err(run(&table(&[[4, 0], [2, 0]]), &Tensor::new(&[9u32, 3], &dev).unwrap())), "beyond its 2 pages of 4 slots"),
        (err(run(&Tensor::new(&[[4u32, 0]], &dev).unwrap(), &lens)), "1 rows but the batch has B = 2"),
        (
            err(run(&table(&[[4, 0], [2, 0]]), &Tensor::new(&[6u32], &dev).unwrap())),
            "seqlens_k must have shape [B] = [2]",
        ),
        (
            err(run(&table(&[[4, 0], [2, 0]]).to_dtype(candle_core::DType::F32).unwrap(), &lens)),
            "block_table must be a u32, i32 or i64 tensor",
        ),
        (
            err(sdpa_paged(&q, &big, &big, &cu_q, &table(&[[4, 0], [2, 0]]), &lens, &o)),
            "page size 300 is outside 1..=256",
        ),
    ];
    for (got, want) in cases {
        assert!(got.contains(want), "expected `{want}` in: {got}");
    }
    let cu_k = Tensor::new(&[0u32, 6, 9], &dev).unwrap();
    let t = table(&[[4, 0], [2, 0]]);
    let paged = |mm: Option<&Tensor>, ps: usize| {
        flash_attn_varlen_paged_windowed(&q, &pages, &pages, &cu_q, &cu_k, &t, mm, 2, 6, 1.0, None, Some(0), ps, None)
    };
    assert!(paged(None, 4).is_ok());
    assert!(err(paged(None, 32)).contains("page_block_size 32 does not match"));
    assert!(err(paged(Some(&t), 4)).contains("mm_prefix_ranges"));
}

/// Appending into pages lands where sdpa-core's definition puts each row, in K and in V; a bad append
/// changes nothing in either.
#[test]
fn append_to_pages_writes_after_the_cached_tokens_and_refuses_without_writing() {
    let dev = Device::Cpu;
    let (hkv, d, dv, ps, np) = (2, 4, 3, 3, 6);
    let paging = Paging { page_size: ps, num_pages: np, max_pages: 3 };
    let table_host = vec![5u32, 1, 3, 0, 2, u32::MAX];
    let table = Tensor::from_vec(table_host.clone(), (2, 3), &dev).unwrap();
    let cache = vec![4usize, 2];
    let new_lens = vec![3usize, 2];
    let k_pages = Tensor::randn(0f32, 1.0, (np, ps, hkv, d), &dev).unwrap();
    let v_pages = Tensor::randn(0f32, 1.0, (np, ps, hkv, dv), &dev).unwrap();
    let k_new = Tensor::randn(0f32, 1.0, (5, hkv, d), &dev).unwrap();
    let v_new = Tensor::randn(0f32, 1.0, (5, hkv, dv), &dev).unwrap();
    let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let (mut want_k, mut want_v) = (flat(&k_pages), flat(&v_pages));
    let spec = sdpa_core::AppendSpec::new(paging, hkv, d, cache.clone(), new_lens.clone());
    sdpa_core::append_to_pages(&spec, &table_host, &flat(&k_new), &mut want_k).unwrap();
    sdpa_core::append_to_pages(&spec.for_dim(dv), &table_host, &flat(&v_new), &mut want_v).unwrap();

    let cu_new = u32s(&[0, 3, 5], &dev);
    let cache_t = u32s(&cache, &dev);
    append_to_pages(&k_new, &v_new, &k_pages, &v_pages, &table, &cache_t, &cu_new).unwrap();
    assert_eq!(flat(&k_pages), want_k);
    assert_eq!(flat(&v_pages), want_v);

    // Sequence 1 now has 4 tokens in a 2-page row; 3 more would need a third page (u32::MAX): refused,
    // and nothing written to K or V.
    let before = (flat(&k_pages), flat(&v_pages));
    let e = append_to_pages(&k_new, &v_new, &k_pages, &v_pages, &table, &u32s(&[7, 4], &dev), &u32s(&[0, 2, 5], &dev));
    let e = e.unwrap_err().to_string();
    assert!(e.contains("names page 4294967295"), "{e}");
    let e = append_to_pages(&k_new, &v_new, &k_pages, &v_pages, &table, &cache_t, &u32s(&[0, 3, 4], &dev));
    assert!(e.unwrap_err().to_string().contains("holds 5 new rows but cu_seqlens_new ends at 4"));
    assert_eq!((flat(&k_pages), flat(&v_pages)), before);
}

/// candle-flash-attn's `max_seqlen_q/k` are bounds: looser ones change nothing.
#[test]
fn looser_max_seqlens_give_the_same_rows() {
    let mut c = Case::new(&MIXED_Q, &MIXED_K);
    c.mask = Mask::CausalBottomRight;
    let spec = c.spec();
    let inputs = HostInputs::random(&spec, 3).unwrap();
    let t = tensors(&spec, &inputs, &Device::Cpu);
    let run = |mq, mk| flash_attn_varlen(&t.q, &t.k, &t.v, &t.cu_q, &t.cu_k, mq, mk, 0.25, true).unwrap();
    let (tight, loose) = (run(7, 9), run(4096, 4096));
    let diff = (tight - loose).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    assert_eq!(diff, 0.0);
}
