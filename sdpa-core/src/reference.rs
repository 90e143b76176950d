//! The f64 reference implementation: the oracle every backend is tested against.
//!
//! Straightforward two-pass softmax per query row with f64 accumulation, reading inputs through the spec's
//! strides (so both layouts are exercised), every mask kind, GQA by index and `Dv != D`. Masked keys take
//! no part at all; a row that sees no key is zeros with LSE `-inf`; NaN propagates to the rows it reaches.

use crate::backend::{Backend, BackwardArgs, Capabilities, F32Math, ForwardArgs, Kernel, MaskKind, RunOptions};
use crate::backward::{BackwardOptions, BackwardRun};
use crate::dtype::DType;
use crate::error::{Result, SdpaError};
use crate::ragged::Seq;
use crate::spec::{AttentionSpec, Mask, Operand};
use crate::tensor::{HostBuffer, HostInputs};

/// Reference output in logical order: `o` is `[B, Hq, Sq, Dv]` contiguous, `lse` is `[B, Hq, Sq]`.
#[derive(Debug, Clone)]
pub struct ReferenceOutput {
    /// Output values, contiguous BHSD regardless of the spec's strides.
    pub o: Vec<f64>,
    /// Log-sum-exp per query row.
    pub lse: Vec<f64>,
}

/// Index of row `(b, h, i)` in the LSE's order: `[B, Hq, Sq]` for a dense batch, `[Hq, total_q]` for a
/// ragged one ([`AttentionSpec::row_index`]).
pub fn row_index(spec: &AttentionSpec, b: usize, h: usize, i: usize) -> usize {
    spec.row_index(&spec.seq(b), b, h, i)
}

/// Computes one query row in f64: writes `Dv` values into `out` and returns the LSE.
/// `spec` must be valid and `inputs` checked against it.
pub fn reference_row(spec: &AttentionSpec, inputs: &HostInputs, b: usize, h: usize, i: usize, out: &mut [f64]) -> f64 {
    reference_row_in(spec, inputs, &spec.seq(b), b, h, i, out)
}

/// One visible key of a query row: its final score and the derivative of that score with respect to the
/// scaled dot product (`1 − tanh²` under a softcap, else 1), which the backward's chain rule needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ScoredKey {
    /// Key index within the sequence.
    pub j: usize,
    /// `softcap(scale·q·k) − ALiBi + mask`.
    pub s: f64,
    /// `∂s / ∂(scale·q·k)`.
    pub ds_dx: f64,
}

/// The query row `(b, h, i)` in f64 and the scores of the keys it sees (masked keys left out). `round` is
/// applied where an eager same-dtype implementation rounds (the score product, the capped score, the biased
/// score); the reference passes the identity.
pub(crate) fn row_scores(
    spec: &AttentionSpec,
    inputs: &HostInputs,
    seq: &Seq,
    (b, h, i): (usize, usize, usize),
    round: &dyn Fn(f64) -> f64,
) -> (Vec<f64>, Vec<ScoredKey>) {
    let scorer = RowScorer::new(spec, inputs, seq, (b, h, i));
    let scored = spec.key_range_in(seq, i).filter_map(|j| scorer.score(j, round)).collect();
    (scorer.q, scored)
}

/// Scores keys for one query row: the row's query and mask row read once, then any key on demand (the
/// sampled gradient check scores single keys of many rows).
pub(crate) struct RowScorer<'a> {
    spec: &'a AttentionSpec,
    inputs: &'a HostInputs,
    seq: &'a Seq,
    b: usize,
    kvh: usize,
    /// The query row in f64.
    pub q: Vec<f64>,
    explicit: Option<(&'a [f32], usize, usize)>,
    alibi: Option<(f64, f64)>,
}

impl<'a> RowScorer<'a> {
    pub(crate) fn new(
        spec: &'a AttentionSpec,
        inputs: &'a HostInputs,
        seq: &'a Seq,
        (b, h, i): (usize, usize, usize),
    ) -> Self {
        let q_off = spec.q_offset(seq, b, h, i);
        let explicit = match (&spec.mask, &inputs.mask) {
            (Mask::Explicit(m), Some(data)) => {
                let st = m.strides();
                let base =
                    if m.dims[0] == 1 { 0 } else { b * st[0] } + if m.dims[1] == 1 { 0 } else { h * st[1] } + i * st[2];
                Some((data.as_slice(), base, st[3]))
            }
            _ => None,
        };
        // ALiBi: −slope · |j − diag(i)| (crate::variants); the slope as the kernels read it (f32).
        let alibi = match spec.alibi_slopes() {
            Ok(Some(slopes)) => {
                let diag = i as f64 + spec.diagonal().map_or(0, |d| d.offset(seq.sq, seq.sk)) as f64;
                Some((slopes[h] as f64, diag))
            }
            _ => None,
        };
        // FP8 inputs stand for stored × descale (crate::fp8); 1 for every other dtype.
        let (qd, kd) = (f64::from(spec.descales().q), f64::from(spec.descales().k));
        let q = (0..spec.shape.d).map(|c| inputs.q.get_f64(q_off + c) * qd * kd).collect();
        RowScorer { spec, inputs, seq, b, kvh: spec.shape.kv_head(h), q, explicit, alibi }
    }

    /// Key `j`'s score, or `None` when the explicit mask drops it (the caller keeps `j` inside the row's band).
    pub(crate) fn score(&self, j: usize, round: &dyn Fn(f64) -> f64) -> Option<ScoredKey> {
        let add = match self.explicit {
            Some((data, base, sk_stride)) => data[base + j * sk_stride] as f64,
            None => 0.0,
        };
        if add == f64::NEG_INFINITY {
            return None;
        }
        let spec = self.spec;
        let table = self.inputs.block_table.as_deref();
        let k_off = spec.kv_offset(Operand::K, table, self.seq, self.b, self.kvh, j);
        let dot: f64 = self.q.iter().enumerate().map(|(c, q)| q * self.inputs.k.get_f64(k_off + c)).sum();
        let mut x = round(dot * spec.scale());
        let mut ds_dx = 1.0;
        if let Some(cap) = spec.softcap() {
            let t = (x / cap).tanh();
            x = round(cap * t);
            ds_dx = 1.0 - t * t;
        }
        if let Some((slope, diag)) = self.alibi {
            x -= slope * (j as f64 - diag).abs();
        }
        let s = if self.alibi.is_some() || add != 0.0 { round(x + add) } else { x };
        Some(ScoredKey { j, s, ds_dx })
    }
}

/// [`reference_row`] for a row of sequence `seq` (= `spec.seq(b)`, which a caller looping over rows takes once).
pub fn reference_row_in(
    spec: &AttentionSpec,
    inputs: &HostInputs,
    seq: &Seq,
    b: usize,
    h: usize,
    i: usize,
    out: &mut [f64],
) -> f64 {
    let (_, scored) = row_scores(spec, inputs, seq, (b, h, i), &|x| x);
    if scored.iter().any(|k| k.s.is_nan()) {
        out.iter_mut().for_each(|o| *o = f64::NAN);
        return f64::NAN;
    }
    let m = scored.iter().map(|k| k.s).fold(f64::NEG_INFINITY, f64::max);
    out.iter_mut().for_each(|o| *o = 0.0);
    if m == f64::NEG_INFINITY {
        return f64::NEG_INFINITY;
    }
    let table = inputs.block_table.as_deref();
    let kvh = spec.shape.kv_head(h);
    let mut l = 0.0;
    let vd = f64::from(spec.descales().v);
    for key in &scored {
        let p = (key.s - m).exp();
        l += p;
        let v_off = spec.kv_offset(Operand::V, table, seq, b, kvh, key.j);
        for (c, o) in out.iter_mut().enumerate() {
            *o += p * (inputs.v.get_f64(v_off + c) * vd);
        }
    }
    out.iter_mut().for_each(|o| *o /= l);
    m + l.ln()
}

/// Computes the whole output in f64. Splits rows over the machine's cores (std threads: core depends on no
/// thread pool).
pub fn reference_attention(spec: &AttentionSpec, inputs: &HostInputs) -> Result<ReferenceOutput> {
    spec.validate()?;
    inputs.check(spec)?;
    let rows = spec.lse_len()?;
    let dv = spec.shape.dv;
    let seqs = spec.seqs();
    let seqs = seqs.as_slice();
    let mut o = vec![0.0f64; rows.checked_mul(dv).ok_or_else(|| SdpaError::overflow("reference output"))?];
    let mut lse = vec![0.0f64; rows];
    let workers = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(rows).max(1);
    let per = rows.div_ceil(workers);
    std::thread::scope(|scope| {
        for (w, (o_chunk, lse_chunk)) in o.chunks_mut(per * dv).zip(lse.chunks_mut(per)).enumerate() {
            scope.spawn(move || {
                for (r, lse_out) in lse_chunk.iter_mut().enumerate() {
                    let (b, h, i) = spec.row_coords(w * per + r);
                    let out = &mut o_chunk[r * dv..(r + 1) * dv];
                    *lse_out = reference_row_in(spec, inputs, &seqs[b], b, h, i, out);
                }
            });
        }
    });
    Ok(ReferenceOutput { o, lse })
}

/// The reference as a backend (`sdpa run --backend reference`): f64 inside, rounded to the spec's dtype.
#[derive(Debug, Default, Clone, Copy)]
pub struct ReferenceBackend;

impl Backend for ReferenceBackend {
    type Buffer = HostBuffer;
    type Index = Vec<u32>;

    fn name(&self) -> &'static str {
        "reference"
    }

    fn device_name(&self) -> String {
        "host (f64 reference)".to_string()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            dtypes: [DType::ALL.as_slice(), &[DType::F8E4M3]].concat(),
            kernels: vec![Kernel::Unfused],
            max_head_dim: usize::MAX,
            fast_head_dims: vec![],
            masks: MaskKind::ALL.to_vec(),
            f32_math: vec![F32Math::Exact],
            variants: crate::variants::Variant::ALL.to_vec(),
            serving: crate::ragged::Serving::ALL.to_vec(),
            backward: vec![Kernel::Unfused],
        }
    }

    fn host_bytes_per_call(&self, spec: &AttentionSpec, opts: &RunOptions) -> Result<Option<u64>> {
        // Besides the uploads: `forward` clones the inputs and computes O and LSE in f64.
        let b = crate::memory::OperandBytes::of(spec)?;
        let f64_rows = (spec.numel(Operand::O)? as u64).saturating_add(spec.lse_len()? as u64).saturating_mul(8);
        Ok(Some(crate::memory::host_call_bytes(spec, opts.lse)?.saturating_add(b.inputs()).saturating_add(f64_rows)))
    }

    fn upload(&self, host: &HostBuffer) -> Result<HostBuffer> {
        Ok(host.clone())
    }

    fn download(&self, buf: &HostBuffer) -> Result<HostBuffer> {
        Ok(buf.clone())
    }

    fn upload_index(&self, host: &[u32]) -> Result<Vec<u32>> {
        Ok(host.to_vec())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn forward(&self, spec: &AttentionSpec, opts: &RunOptions, args: ForwardArgs<'_, HostBuffer>) -> Result<Kernel> {
        let mask = match args.mask {
            Some(HostBuffer::F32(m)) => Some(m.clone()),
            Some(other) => {
                return Err(SdpaError::DTypeMismatch { name: "mask", expected: DType::F32, found: other.dtype() })
            }
            None => None,
        };
        let block_table = args.block_table.cloned();
        let inputs = HostInputs { q: args.q.clone(), k: args.k.clone(), v: args.v.clone(), mask, block_table };
        let r = reference_attention(spec, &inputs)?;
        let dv = spec.shape.dv;
        let o_len = spec.required_len(Operand::O)?;
        if args.o.len() < o_len || args.o.dtype() != spec.out_dtype() {
            return Err(SdpaError::BufferTooShort { name: "o", len: args.o.len(), needed: o_len });
        }
        let seqs = spec.seqs();
        for row in 0..r.lse.len() {
            let (b, h, i) = spec.row_coords(row);
            let dst = spec.o_offset(&seqs[b], b, h, i);
            for c in 0..dv {
                args.o.set_f32(dst + c, r.o[row * dv + c] as f32);
            }
        }
        if let Some(lse) = args.lse {
            if lse.len() < r.lse.len() {
                return Err(SdpaError::BufferTooShort { name: "lse", len: lse.len(), needed: r.lse.len() });
            }
            for (i, &x) in r.lse.iter().enumerate() {
                lse.set_f32(i, x as f32);
            }
        }
        let _ = opts;
        Ok(Kernel::Unfused)
    }

    /// The exact f64 gradients ([`crate::backward::reference_backward`]: O and the LSE recomputed, the
    /// given ones unused), rounded once to the spec's dtype; deterministic.
    fn backward(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        bwd: &BackwardOptions,
        args: BackwardArgs<'_, HostBuffer>,
    ) -> Result<BackwardRun> {
        let _ = (opts, args.o, args.lse);
        let mask = match args.mask {
            Some(HostBuffer::F32(m)) => Some(m.clone()),
            Some(other) => {
                return Err(SdpaError::DTypeMismatch { name: "mask", expected: DType::F32, found: other.dtype() })
            }
            None => None,
        };
        let inputs = HostInputs { q: args.q.clone(), k: args.k.clone(), v: args.v.clone(), mask, block_table: None };
        let g = crate::backward::reference_backward(spec, &inputs, args.d_o)?;
        let (d, dv) = (spec.shape.d, spec.shape.dv);
        for (name, buf, op) in
            [("dq", &*args.dq, Operand::Q), ("dk", &*args.dk, Operand::K), ("dv", &*args.dv, Operand::V)]
        {
            let needed = spec.required_len(op)?;
            if buf.len() < needed || buf.dtype() != spec.dtype {
                return Err(SdpaError::BufferTooShort { name, len: buf.len(), needed });
            }
        }
        let mut dq_accum = match (bwd.dq_accum, args.dq_accum) {
            (true, Some(b)) => Some(b),
            (true, None) => return Err(SdpaError::invalid("dq_accum was asked for but no buffer was given")),
            (false, _) => None,
        };
        for (b, seq) in spec.seqs().iter().enumerate() {
            for h in 0..spec.shape.hq {
                for i in 0..seq.sq {
                    let row = spec.row_index(seq, b, h, i);
                    let dst = spec.q_offset(seq, b, h, i);
                    for c in 0..d {
                        let x = g.dq[row * d + c] as f32;
                        args.dq.set_f32(dst + c, x);
                        if let Some(acc) = dq_accum.as_deref_mut() {
                            acc.set_f32(dst + c, x);
                        }
                    }
                }
            }
            for kvh in 0..spec.shape.hkv {
                for j in 0..seq.sk {
                    let krow = crate::backward::kv_row_index(spec, seq, b, kvh, j);
                    let k_off = spec.kv_offset(Operand::K, None, seq, b, kvh, j);
                    let v_off = spec.kv_offset(Operand::V, None, seq, b, kvh, j);
                    for c in 0..d {
                        args.dk.set_f32(k_off + c, g.dk[krow * d + c] as f32);
                    }
                    for c in 0..dv {
                        args.dv.set_f32(v_off + c, g.dv[krow * dv + c] as f32);
                    }
                }
            }
        }
        Ok(BackwardRun { kernel: Kernel::Unfused, deterministic: true })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ExplicitMask, Layout, MaskValues, Shape};
    use crate::tensor::mask_from_bool;

    /// FP8 inputs mean stored × descale: the reference of an FP8 call equals the reference of f32 inputs
    /// holding those products (exact in f32: the descales are powers of two), for distinct factors per tensor,
    /// and the descales really enter (other factors give other outputs).
    #[test]
    fn fp8_inputs_are_their_decoded_values_times_the_descales() {
        let shape = Shape { b: 1, hq: 4, hkv: 2, sq: 9, sk: 13, d: 16, dv: 8 };
        let ds = crate::fp8::Descale { q: 0.25, k: 0.0625, v: 2.0 };
        let spec = AttentionSpec::new(shape, DType::F8E4M3).with_descale(ds).with_mask(Mask::CausalBottomRight);
        let fp8 = HostInputs::random(&spec, 5).unwrap();
        let widen = |b: &HostBuffer, f: f32| HostBuffer::F32(b.to_f32_vec().iter().map(|x| x * f).collect());
        let f32_in =
            HostInputs { q: widen(&fp8.q, ds.q), k: widen(&fp8.k, ds.k), v: widen(&fp8.v, ds.v), ..fp8.clone() };
        let f32_spec = AttentionSpec::new(shape, DType::F32).with_mask(Mask::CausalBottomRight);
        let a = reference_attention(&spec, &fp8).unwrap();
        let b = reference_attention(&f32_spec, &f32_in).unwrap();
        assert!(a.o.iter().zip(&b.o).all(|(x, y)| (x - y).abs() <= 1e-12 * y.abs().max(1.0)));
        assert!(a.lse.iter().zip(&b.lse).all(|(x, y)| (x - y).abs() <= 1e-12 * y.abs().max(1.0)));
        // The stored codes spread over the E4M3 range (the descales are not 1), and none is NaN.
        let codes = match &fp8.q {
            HostBuffer::F8E4M3(c) => c.clone(),
            other => panic!("q is {:?}", other.dtype()),
        };
        assert!(codes.iter().all(|&c| c & 0x7f != 0x7f));
        let other = reference_attention(&spec.clone().with_descale(crate::fp8::Descale::uniform(1.0)), &fp8).unwrap();
        assert!(other.o.iter().zip(&a.o).any(|(x, y)| (x - y).abs() > 1e-3));
        // Descales belong to FP8 inputs only; the backward refuses FP8.
        assert!(f32_spec.clone().with_descale(ds).validate().is_err());
        assert!(crate::backward::validate_backward(&spec).is_err());
        assert_eq!(spec.out_dtype(), DType::BF16);
    }

    fn inputs(q: Vec<f32>, k: Vec<f32>, v: Vec<f32>) -> HostInputs {
        HostInputs {
            q: HostBuffer::F32(q),
            k: HostBuffer::F32(k),
            v: HostBuffer::F32(v),
            mask: None,
            block_table: None,
        }
    }

    /// One query, two keys, hand-computed: scores [1, 0] (scale 1), softmax [e/(e+1), 1/(e+1)].
    #[test]
    fn hand_computed_two_keys() {
        let spec = AttentionSpec::new(Shape::new(1, 1, 1, 2, 1), DType::F32).with_scale(1.0);
        let inp = inputs(vec![1.0], vec![1.0, 0.0], vec![10.0, 20.0]);
        let r = reference_attention(&spec, &inp).unwrap();
        let e = std::f64::consts::E;
        let want = 10.0 * e / (e + 1.0) + 20.0 / (e + 1.0);
        assert!((r.o[0] - want).abs() < 1e-12, "{} vs {want}", r.o[0]);
        assert!((r.lse[0] - (e + 1.0).ln()).abs() < 1e-12);
    }

    /// Causal alignments on Sq = 2, Sk = 3 with equal scores: each row averages the values it sees.
    #[test]
    fn hand_computed_causal_alignments() {
        let shape = Shape::new(1, 1, 2, 3, 1);
        let inp = inputs(vec![0.0, 0.0], vec![1.0, 1.0, 1.0], vec![3.0, 6.0, 9.0]);
        let tl =
            reference_attention(&AttentionSpec::new(shape, DType::F32).with_mask(Mask::CausalTopLeft), &inp).unwrap();
        assert_eq!(tl.o, vec![3.0, 4.5]); // row 0 sees key 0; row 1 sees keys 0..=1
        let br = reference_attention(&AttentionSpec::new(shape, DType::F32).with_mask(Mask::CausalBottomRight), &inp)
            .unwrap();
        assert_eq!(br.o, vec![4.5, 6.0]); // row 0 sees keys 0..=1; row 1 sees all three
        assert!((br.lse[1] - 3f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn fully_masked_rows_are_zero_with_lse_minus_inf() {
        // Bottom-right with Sq > Sk: row 0 sees nothing.
        let shape = Shape::new(1, 1, 3, 2, 2);
        let spec = AttentionSpec::new(shape, DType::F32).with_mask(Mask::CausalBottomRight);
        let inp = HostInputs::random(&spec, 3).unwrap();
        let r = reference_attention(&spec, &inp).unwrap();
        assert_eq!(&r.o[0..2], &[0.0, 0.0]);
        assert_eq!(r.lse[0], f64::NEG_INFINITY);
        assert!(r.lse[1].is_finite());

        // An explicit boolean mask that drops every key of row 1.
        let spec = AttentionSpec::new(Shape::new(1, 1, 2, 2, 1), DType::F32)
            .with_mask(Mask::Explicit(ExplicitMask { values: MaskValues::Boolean, dims: [1, 1, 2, 2] }));
        let mut inp = inputs(vec![1.0, 1.0], vec![1.0, 2.0], vec![5.0, f32::NAN]);
        inp.mask = Some(mask_from_bool(&[true, false, false, false]));
        let r = reference_attention(&spec, &inp).unwrap();
        assert_eq!(r.o, vec![5.0, 0.0]); // the NaN value sits under a masked key: it never leaks
    }

    #[test]
    fn nan_reaches_only_the_rows_that_read_it() {
        let spec = AttentionSpec::new(Shape::new(1, 2, 3, 4, 2), DType::F32);
        let mut inp = HostInputs::random(&spec, 5).unwrap();
        inp.q.set_f32(spec.q_strides.offset(0, 1, 2), f32::NAN);
        let r = reference_attention(&spec, &inp).unwrap();
        for row in 0..6 {
            let nan = r.o[row * 2].is_nan();
            assert_eq!(nan, row == 5, "row {row}");
        }
    }

    /// An independent naive formula: full score matrix per head, softmax by explicit max/sum, then P·V,
    /// all on logical (copied, contiguous) tensors. Compared on random data with GQA, Dv != D, both layouts,
    /// every mask kind.
    #[test]
    fn agrees_with_an_independent_naive_formula() {
        let shape = Shape { b: 2, hq: 6, hkv: 2, sq: 5, sk: 7, d: 3, dv: 4 };
        let masks = [
            Mask::None,
            Mask::CausalTopLeft,
            Mask::CausalBottomRight,
            Mask::Explicit(ExplicitMask { values: MaskValues::Additive, dims: [2, 1, 5, 7] }),
            Mask::Explicit(ExplicitMask { values: MaskValues::Boolean, dims: [1, 6, 1, 7] }),
        ];
        for layout in [Layout::Bhsd, Layout::Bshd] {
            for mask in masks {
                let spec = AttentionSpec::new(shape, DType::F32).with_layout(layout).with_mask(mask).with_scale(0.7);
                let inp = HostInputs::random(&spec, 11).unwrap();
                let r = reference_attention(&spec, &inp).unwrap();
                let naive = naive(&spec, &inp);
                for (x, y) in r.o.iter().zip(&naive) {
                    assert!((x - y).abs() < 1e-12 || (x.is_nan() && y.is_nan()), "{layout:?} {mask:?}: {x} vs {y}");
                }
            }
        }
    }

    /// Windows (narrow, one-sided, wider than Sk, empty for some rows), softcaps and ALiBi, alone and
    /// together, over both diagonals and every mask, against the naive formula written from FlashAttention's
    /// documented definitions.
    #[test]
    fn variants_agree_with_the_naive_formula() {
        use crate::variants::{Alibi, Diagonal, Window};
        let shape = Shape { b: 1, hq: 4, hkv: 2, sq: 6, sk: 9, d: 3, dv: 2 };
        let windows = [
            None,
            Some(Window { left: Some(0), right: Some(0) }),
            Some(Window { left: Some(2), right: Some(1) }),
            Some(Window { left: None, right: Some(0) }),
            Some(Window { left: Some(3), right: None }),
            Some(Window { left: Some(100), right: Some(100) }),
        ];
        let masks = [
            Mask::None,
            Mask::CausalTopLeft,
            Mask::CausalBottomRight,
            Mask::Explicit(ExplicitMask { values: MaskValues::Additive, dims: [1, 4, 6, 9] }),
        ];
        let mut cases = 0;
        for mask in masks {
            for diagonal in [Diagonal::TopLeft, Diagonal::BottomRight] {
                if mask.diagonal().is_some_and(|d| d != diagonal) {
                    continue;
                }
                for window in windows {
                    for softcap in [None, Some(0.5), Some(30.0)] {
                        for alibi in [None, Some(Alibi::Standard), Some(Alibi::Slopes(vec![0.5, -0.25, 0.0, 2.0]))] {
                            let mut spec = AttentionSpec::new(shape, DType::F32)
                                .with_mask(mask)
                                .with_scale(1.3)
                                .with_diagonal(diagonal);
                            spec.variants.window = window;
                            spec.variants.softcap = softcap;
                            spec.variants.alibi = alibi;
                            spec.validate().unwrap();
                            let inp = HostInputs::random(&spec, 17).unwrap();
                            let r = reference_attention(&spec, &inp).unwrap();
                            for (x, y) in r.o.iter().zip(&naive(&spec, &inp)) {
                                assert!((x - y).abs() < 1e-12, "{mask:?} {diagonal:?} {:?}: {x} vs {y}", spec.variants);
                            }
                            cases += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(cases, 6 * 6 * 3 * 3); // (mask, diagonal) pairs × windows × caps × slopes
    }

    fn naive(spec: &AttentionSpec, inp: &HostInputs) -> Vec<f64> {
        let s = spec.shape;
        let get = |buf: &HostBuffer, st: crate::spec::Strides, b, h, t, c| buf.get_f64(st.offset(b, h, t) + c);
        let mut out = Vec::new();
        for b in 0..s.b {
            for h in 0..s.hq {
                let g = h * s.hkv / s.hq; // same group mapping, computed differently
                let mut sc = vec![vec![0.0f64; s.sk]; s.sq];
                for i in 0..s.sq {
                    for j in 0..s.sk {
                        let mut dot = 0.0;
                        for c in 0..s.d {
                            dot += get(&inp.q, spec.q_strides, b, h, i, c) * get(&inp.k, spec.k_strides, b, g, j, c);
                        }
                        let mut x = dot * spec.scale();
                        // FlashAttention's documented forms, on the diagonal i + shift.
                        let br = i as i64 + s.sk as i64 - s.sq as i64;
                        let diag = match spec.diagonal() {
                            Some(crate::variants::Diagonal::BottomRight) => br,
                            _ => i as i64,
                        };
                        let mut allowed = match spec.mask {
                            Mask::CausalTopLeft => j <= i,
                            Mask::CausalBottomRight => (j as i64) <= br,
                            _ => true,
                        };
                        if let Some(w) = spec.variants.window {
                            let left = w.left.map_or(i64::MAX / 2, |l| l as i64);
                            let right = w.right.map_or(i64::MAX / 2, |r| r as i64);
                            allowed &= j as i64 >= diag - left && j as i64 <= diag + right;
                        }
                        if let Some(cap) = spec.variants.softcap {
                            x = (x / cap).tanh() * cap;
                        }
                        if let Some(a) = &spec.variants.alibi {
                            let slope = a.slopes(s.hq).unwrap()[h] as f64;
                            x += -slope * (diag - j as i64).abs() as f64;
                        }
                        if let (Mask::Explicit(m), Some(md)) = (spec.mask, &inp.mask) {
                            let idx = |d: usize, n: usize| if m.dims[d] == 1 { 0 } else { n };
                            let flat =
                                ((idx(0, b) * m.dims[1] + idx(1, h)) * m.dims[2] + idx(2, i)) * m.dims[3] + idx(3, j);
                            x += md[flat] as f64;
                        }
                        sc[i][j] = if allowed { x } else { f64::NEG_INFINITY };
                    }
                }
                for row in sc {
                    let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> =
                        row.iter().map(|&x| if m == f64::NEG_INFINITY { 0.0 } else { (x - m).exp() }).collect();
                    let z: f64 = w.iter().sum();
                    for c in 0..s.dv {
                        let mut acc = 0.0;
                        for j in 0..s.sk {
                            if w[j] != 0.0 {
                                acc += w[j] * get(&inp.v, spec.v_strides, b, g, j, c);
                            }
                        }
                        out.push(if z == 0.0 { 0.0 } else { acc / z });
                    }
                }
            }
        }
        out
    }

    #[test]
    fn reference_backend_writes_through_strides() {
        use crate::backend::HostBackend;
        let spec = AttentionSpec::new(Shape { b: 1, hq: 4, hkv: 2, sq: 3, sk: 5, d: 8, dv: 8 }, DType::BF16)
            .with_layout(Layout::Bshd)
            .with_mask(Mask::CausalBottomRight);
        let inp = HostInputs::random(&spec, 9).unwrap();
        let run = ReferenceBackend.run_host(&spec, &RunOptions { lse: true, ..Default::default() }, &inp).unwrap();
        assert!(run.output.o.to_f32_vec().iter().all(|x| x.is_finite()));
        assert_eq!(run.output.lse.map(|l| l.len()), Some(12));
    }
}
