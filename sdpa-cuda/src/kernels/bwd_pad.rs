//! The backward's pad-copy path (issue 21): a backward call whose head dims are not multiples of 8, or whose
//! rows are not whole 16-byte chunks starting 16-byte aligned (a misaligned view; [`bwd::aligned`]), copies
//! Q, K, V, O and dO once into zero-filled scratch of `[B, H, S, D8]` (D8 = D rounded up to 8, likewise
//! Dv8), runs the backward's own kernels there on whole 16-byte rows (`bwd::run_aligned`), and copies the
//! own D or Dv columns of dQ, dK and dV (and of dQ in f32, when asked for) back into the caller's views
//! through their strides. The backward's loads copy whole 16-byte chunks and have no narrow path as `fa2`'s
//! forward has, so every such call takes this path, whatever its size (the forward's [`pad_copy::pays`]
//! rule has no counterpart here).
//!
//! Why zeros are enough: the padding columns of Q and K add nothing to Q·Kᵀ; those of O and dO add nothing
//! to Delta = rowsum(dO∘O); the padding columns of dQ, dK and dV that the kernels compute are never copied
//! back. What stays the caller's: the softmax scale (the parameters' `scale` and `scale_log2`, from the
//! call's own D, carried over by [`pad_copy::padded_params`]; the padded spec names it explicitly, so
//! nothing recomputes it from D8), the mask and its strides, the ALiBi slopes, the ragged offsets, and the
//! LSE (per row, read in place). GQA: dK and dV are written per kv head in the scratch by the kernels, which
//! sum a group's query heads themselves, and copied back like K and V. A ragged batch (packed K/V) copies
//! its packed rows as one block ([`row_shape`]); paged caches are refused before ([`bwd::refusal`]).
//!
//! Memory: the scratch is stream-ordered pool memory (freed stream-ordered after the last copy back, as the
//! forward's is), its size checked arithmetic (an overflow is `Unsupported`) and checked, with the padded
//! backward's own f32 workspace ([`needed_bytes`]), against the free device memory with the forward's
//! headroom ([`pad_copy::HEADROOM_BYTES`]; short is `InsufficientMemory`);
//! an allocation the driver refuses is its error. No fallback: nothing else runs the backward at these head
//! dims on the GPU.

use super::bwd::{self, BwdParams};
use super::pad_copy::{self, copy, pack, padded_params, part, round8, Rows, Scratch, Width};
use crate::checked::call::Call;
use crate::error::unsupported;
use cudarc::driver::DevicePtr;
use sdpa_core::{AttentionSpec, Layout, Result, Shape};

/// The call's rows as a dense shape: its own shape, or for a ragged batch one block of packed rows
/// (B = 1, Sq = total_q, Sk = total_k), whose batch stride the kernels never use (`q_row_offset` in
/// common.cuh addresses packed rows by row and head only).
pub fn row_shape(spec: &AttentionSpec) -> Shape {
    let s = spec.shape;
    match &spec.ragged {
        Some(r) => Shape { b: 1, sq: r.total_q(), sk: r.total_k(), ..s },
        None => s,
    }
}

/// The scratch of one call, in 2-byte elements: the forward's layout of padded Q, K, V and O, then dO, dQ,
/// dK, dV and the f32 dQ (two elements per value; empty when not asked for). Every part is a multiple of 8
/// elements, so each starts 16-byte aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BwdScratch {
    /// Q, K, V and O ([`Scratch`], its `len` the end of O).
    pub inputs: Scratch,
    /// Offsets of dO, dQ, dK, dV and the f32 dQ.
    pub grads: [usize; 5],
    /// Total elements.
    pub len: usize,
}

impl BwdScratch {
    /// The layout for the row shape `s` (with the f32 dQ when `dq_f32`); `None` when its size overflows.
    pub fn of(s: &Shape, dq_f32: bool) -> Option<BwdScratch> {
        let (q, k, v, o) = (
            part(s, s.hq, s.sq, s.d),
            part(s, s.hkv, s.sk, s.d),
            part(s, s.hkv, s.sk, s.dv),
            part(s, s.hq, s.sq, s.dv),
        );
        let q32 = if dq_f32 { q.and_then(|n| n.checked_mul(2)) } else { Some(0) };
        let (at, len) = pack([q, k, v, o, o, q, k, v, q32])?;
        let inputs = Scratch { at: [at[0], at[1], at[2], at[3]], len: at[4] };
        Some(BwdScratch { inputs, grads: [at[4], at[5], at[6], at[7], at[8]], len })
    }

    /// Bytes (2-byte elements).
    pub fn bytes(&self) -> u64 {
        (self.len as u64).saturating_mul(2)
    }
}

/// The spec the padded call runs: `spec` at D8 and Dv8 in contiguous BHSD strides over its row space (a
/// ragged batch's packed rows stay packed), with the caller's scale named explicitly (never `1/sqrt(D8)`).
pub fn padded_spec(spec: &AttentionSpec) -> AttentionSpec {
    let s = spec.shape;
    let scale = spec.scale();
    let shape = Shape { d: round8(s.d), dv: round8(s.dv), ..s };
    AttentionSpec { shape, ..spec.clone() }.with_scale(scale).with_layout(Layout::Bhsd)
}

/// Device memory the path allocates for `spec` (with the f32 dQ when `dq_f32`): the scratch ([`BwdScratch`]
/// over the [`row_shape`]) and the padded backward's own workspace (Delta and, unless `deterministic`, the
/// f32 dQ accumulator at D8), which it allocates after the copies; `None` when a size overflows.
pub fn needed_bytes(spec: &AttentionSpec, dq_f32: bool, deterministic: bool) -> Option<u64> {
    let scratch = BwdScratch::of(&row_shape(spec), dq_f32)?.bytes();
    scratch.checked_add(bwd::workspace_bytes(&padded_spec(spec), deterministic)?)
}

/// Free device memory [`run`] requires before its first copy ([`needed_bytes`] with
/// [`pad_copy::HEADROOM_BYTES`] on top): what a check made before the call must count for it (the ring
/// backward's, before any rank starts); `None` when a size overflows.
pub fn required_free(spec: &AttentionSpec, dq_f32: bool, deterministic: bool) -> Option<u64> {
    needed_bytes(spec, dq_f32, deterministic)?.checked_add(pad_copy::HEADROOM_BYTES)
}

/// Runs the backward of `call` (not [`bwd::aligned`], accepted by [`bwd::refusal`]) through padded
/// scratch; `params` holds the caller's pointers. Returns whether the run was deterministic.
pub fn run(call: &Call<'_>, params: BwdParams, deterministic: bool) -> Result<bool> {
    let spec = call.spec;
    let s = spec.shape;
    let rs = row_shape(spec);
    let with_f32 = params.dq_f32 != 0;
    let layout = BwdScratch::of(&rs, with_f32).ok_or_else(|| {
        unsupported(format!("the backward's padded copies of a call of shape {s} exceed the address space"))
    })?;
    // Everything the path allocates, checked before the first copy: the scratch and the padded backward's
    // Delta and dQ accumulator (which it allocates after the copies).
    let needed = required_free(spec, with_f32, deterministic).ok_or_else(|| {
        unsupported(format!("the backward's padded copies of a call of shape {s} exceed the address space"))
    })?;
    call.dev.require_free(needed, || {
        format!(
            "the backward's zero-padded copies of Q, K, V, O, dO and the gradients, and its f32 workspace (D = {}, \
             Dv = {})",
            s.d, s.dv
        )
    })?;
    let buf = call.scratch::<u16>(layout.len, "the backward's pad-copy scratch")?;
    // The guard orders the scratch's later reuse after this call's last copy; held until it is queued.
    let (base, guard) = buf.device_ptr(call.stream);
    let p = &params.attn;
    let attn = padded_params(p, &rs, &layout.inputs, base);
    let at = |i: usize| base + 2 * layout.grads[i] as u64;
    let padded = BwdParams {
        attn,
        d_o: at(0),
        dq: at(1),
        dk: at(2),
        dv: at(3),
        delta: 0,
        dq_acc: 0,
        dq_f32: if with_f32 { at(4) } else { 0 },
    };
    let (d8, dv8) = (round8(s.d), round8(s.dv));
    let (q_rows, k_rows) = ((rs.b, rs.hq, rs.sq), (rs.b, rs.hkv, rs.sk));
    let rows = |ptr, stride| Rows { ptr, stride };
    // SAFETY: the caller's views were checked by the backend against the validated spec (every strided
    // offset of Q, K, V, O and dO inside its buffer; dO has O's strides), their base pointers are aligned to
    // their elements (bwd::refusal); the scratch holds each padded operand contiguously at `padded`'s
    // pointers (BwdScratch::of over the row shape), alive until `buf` drops after the last launch.
    unsafe {
        copy(call, Width::Two, rows(p.q, p.q_stride), rows(attn.q, attn.q_stride), q_rows, s.d, d8)?;
        copy(call, Width::Two, rows(p.k, p.k_stride), rows(attn.k, attn.k_stride), k_rows, s.d, d8)?;
        copy(call, Width::Two, rows(p.v, p.v_stride), rows(attn.v, attn.v_stride), k_rows, s.dv, dv8)?;
        copy(call, Width::Two, rows(p.o, p.o_stride), rows(attn.o, attn.o_stride), q_rows, s.dv, dv8)?;
        copy(call, Width::Two, rows(params.d_o, p.o_stride), rows(padded.d_o, attn.o_stride), q_rows, s.dv, dv8)?;
    }
    let spec8 = padded_spec(spec);
    let call8 = Call { dev: call.dev, stream: call.stream, spec: &spec8, opts: call.opts, params: attn };
    // Every row of the padded operands written above (zeros past D and Dv), contiguous and 16-byte aligned.
    let ran = bwd::run_aligned(&call8, padded, deterministic)?;
    // SAFETY: as above for the caller's dQ, dK, dV (Q's, K's and V's strides) and f32 dQ (Q's strides, 4-byte
    // aligned: bwd::refusal); only their own D or Dv columns of each row are written back.
    unsafe {
        copy(call, Width::Two, rows(padded.dq, attn.q_stride), rows(params.dq, p.q_stride), q_rows, d8, s.d)?;
        copy(call, Width::Two, rows(padded.dk, attn.k_stride), rows(params.dk, p.k_stride), k_rows, d8, s.d)?;
        copy(call, Width::Two, rows(padded.dv, attn.v_stride), rows(params.dv, p.v_stride), k_rows, dv8, s.dv)?;
        if with_f32 {
            let (from, to) = (rows(padded.dq_f32, attn.q_stride), rows(params.dq_f32, p.q_stride));
            copy(call, Width::Four, from, to, q_rows, d8, s.d)?;
        }
    }
    drop(guard);
    drop(buf);
    Ok(ran)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checked::params::AttnParams;
    use sdpa_core::{DType, Mask, Ragged};

    #[test]
    fn scratch_holds_inputs_then_gradients_padded_and_aligned() {
        let s = Shape { b: 2, hq: 8, hkv: 2, sq: 77, sk: 130, d: 33, dv: 31 };
        let (q, k, v, o) = (2 * 8 * 77 * 40, 2 * 2 * 130 * 40, 2 * 2 * 130 * 32, 2 * 8 * 77 * 32);
        let l = BwdScratch::of(&s, false).expect("fits");
        // The forward's layout first, so padded_params points Q, K, V and O as the forward does.
        assert_eq!(l.inputs, Scratch::of(&s).expect("fits"));
        let g = q + k + v + o;
        assert_eq!(l.grads, [g, g + o, g + o + q, g + o + q + k, g + o + q + k + v]);
        assert_eq!(l.len, 2 * g);
        assert_eq!(l.bytes(), 4 * g as u64);
        // The f32 dQ takes two elements a value, after dV.
        let f = BwdScratch::of(&s, true).expect("fits");
        assert_eq!((f.grads[4], f.len), (l.len, l.len + 2 * q));
        assert!(f.grads.iter().chain(&f.inputs.at).all(|a| a % 8 == 0));
        // Sizes that overflow give None (an error of the call), never a panic.
        assert_eq!(BwdScratch::of(&Shape { b: usize::MAX / 4, ..s }, false), None);
        assert_eq!(BwdScratch::of(&Shape { sq: usize::MAX / 64, ..s }, true), None);
    }

    /// Regression: the memory check counted the scratch only, not the Delta rows and the f32 dQ accumulator
    /// the padded backward allocates after the copies (4 bytes x rows x D8 on the atomic path: twice the
    /// padded Q in bytes, more than the headroom on long calls), so a call could pass the check, run its copies and
    /// then fail on the allocation with a driver error instead of `InsufficientMemory`.
    #[test]
    fn the_memory_check_counts_the_padded_backwards_workspace() {
        let s = Shape { b: 2, hq: 8, hkv: 2, sq: 77, sk: 130, d: 33, dv: 31 };
        let spec = AttentionSpec::new(s, DType::BF16);
        let scratch = BwdScratch::of(&s, false).expect("fits").bytes();
        let rows = (2 * 8 * 77) as u64;
        // Delta: an f32 per row; the accumulator: rows x D8 (40) f32.
        assert_eq!(needed_bytes(&spec, false, true), Some(scratch + 4 * rows));
        assert_eq!(needed_bytes(&spec, false, false), Some(scratch + 4 * rows + 4 * rows * 40));
        let with_f32 = BwdScratch::of(&s, true).expect("fits").bytes();
        assert_eq!(needed_bytes(&spec, true, true), Some(with_f32 + 4 * rows));
        // A ragged batch: rows of the packed queries (Hq x total_q).
        let r = sdpa_core::Ragged::new(vec![0, 1, 50], vec![9, 0, 70]);
        let ragged = AttentionSpec::new(Shape { b: 3, ..s }, DType::F16).with_ragged(r, Layout::Bshd);
        let scratch = BwdScratch::of(&row_shape(&ragged), false).expect("fits").bytes();
        assert_eq!(needed_bytes(&ragged, false, true), Some(scratch + 4 * 8 * 51));
        // Overflow is None (the call's `Unsupported`), never a panic.
        let huge = AttentionSpec::new(Shape { b: usize::MAX / 4, ..s }, DType::BF16);
        assert_eq!(needed_bytes(&huge, false, false), None);
    }

    #[test]
    fn the_padded_spec_keeps_the_callers_scale_mask_and_ragged_rows() {
        let s = Shape { b: 2, hq: 4, hkv: 1, sq: 50, sk: 70, d: 65, dv: 33 };
        let spec = AttentionSpec::new(s, DType::BF16).with_layout(Layout::Bshd).with_mask(Mask::CausalBottomRight);
        let p = padded_spec(&spec);
        assert_eq!((p.shape.d, p.shape.dv), (72, 40));
        assert_eq!(p.scale(), spec.scale());
        assert!((p.scale() - 1.0 / 65f64.sqrt()).abs() < 1e-12);
        assert_eq!((p.mask, p.layout()), (Mask::CausalBottomRight, Some(Layout::Bhsd)));
        // Its strides are the padded parameters' (the backend's spec and the kernels' pointers agree).
        let params = AttnParams::new(&spec, 2, 4, 6, 8, 0, 0).expect("params");
        let l = BwdScratch::of(&row_shape(&spec), false).expect("fits");
        let q = padded_params(&params, &row_shape(&spec), &l.inputs, 1 << 20);
        let st = |x: sdpa_core::Strides| [x.b as i64, x.h as i64, x.s as i64];
        assert_eq!(
            [q.q_stride, q.k_stride, q.v_stride, q.o_stride],
            [st(p.q_strides), st(p.k_strides), st(p.v_strides), st(p.o_strides)]
        );
        assert_eq!((q.scale, q.d, q.dv), (params.scale, 72, 40));
        // A ragged batch copies its packed rows as one block; its packed strides stay packed.
        let r = Ragged::new(vec![0, 1, 50], vec![9, 0, 70]);
        let ragged = AttentionSpec::new(Shape { b: 3, ..s }, DType::F16).with_ragged(r, Layout::Bshd);
        let rs = row_shape(&ragged);
        assert_eq!((rs.b, rs.sq, rs.sk, rs.hq), (1, 51, 79, 4));
        let pr = padded_spec(&ragged);
        assert_eq!((pr.q_strides.h, pr.q_strides.s, pr.k_strides.h), (51 * 72, 72, 79 * 72));
        assert_eq!(pr.ragged, ragged.ragged);
    }

    /// The premise of the path, on the f64 reference backward: a call at D and Dv gives the same gradients
    /// (and O and LSE) as its padded spec on the inputs copied as the copy kernel copies them (zeros past D
    /// and Dv, the caller's layout to BHSD), and the padding columns of dQ, dK and dV come out zero. Bitwise:
    /// zeros appended to a sum change nothing. With `1/sqrt(D8)` as the scale instead, the gradients differ.
    #[test]
    fn zero_columns_and_the_callers_scale_leave_the_reference_gradients_unchanged() {
        use sdpa_core::backward::reference_backward;
        use sdpa_core::{HostBuffer, HostInputs, Operand, Strides};
        let s = Shape { b: 2, hq: 4, hkv: 2, sq: 9, sk: 13, d: 7, dv: 5 };
        let spec = AttentionSpec::new(s, DType::F32).with_layout(Layout::Bshd).with_mask(Mask::CausalBottomRight);
        let padded = padded_spec(&spec);
        // The copy kernel's semantics: dst[b][h][r][c] = c < n_src ? src[b][h][r][c] : 0.
        let pad = |src: &HostBuffer, from: Strides, to: Strides, heads: usize, rows: usize, n: usize, n8: usize| {
            let src = src.to_f32_vec();
            let mut dst = vec![0f32; s.b * heads * rows * n8];
            for (b, h, r) in (0..s.b).flat_map(|b| (0..heads).flat_map(move |h| (0..rows).map(move |r| (b, h, r)))) {
                for c in 0..n {
                    dst[b * to.b + h * to.h + r * to.s + c] = src[b * from.b + h * from.h + r * from.s + c];
                }
            }
            HostBuffer::from_f32(DType::F32, &dst)
        };
        let inputs = HostInputs::random(&spec, 7).expect("inputs");
        let d_o = HostBuffer::random(DType::F32, spec.required_len(Operand::O).expect("len"), 8);
        let (p, q) = (&spec, &padded);
        let inputs8 = HostInputs {
            q: pad(&inputs.q, p.q_strides, q.q_strides, s.hq, s.sq, s.d, 8),
            k: pad(&inputs.k, p.k_strides, q.k_strides, s.hkv, s.sk, s.d, 8),
            v: pad(&inputs.v, p.v_strides, q.v_strides, s.hkv, s.sk, s.dv, 8),
            ..inputs.clone()
        };
        let d_o8 = pad(&d_o, p.o_strides, q.o_strides, s.hq, s.sq, s.dv, 8);
        let want = reference_backward(&spec, &inputs, &d_o).expect("reference");
        let got = reference_backward(&padded, &inputs8, &d_o8).expect("padded reference");
        assert_eq!((got.lse.clone(), want.lse.len()), (want.lse.clone(), s.b * s.hq * s.sq));
        // Logical order: [rows][width]; the padded call's rows are 8 wide.
        let own = |g: &[f64], n: usize| -> Vec<f64> { g.chunks(8).flat_map(|row| row[..n].to_vec()).collect() };
        let pads = |g: &[f64], n: usize| g.chunks(8).all(|row| row[n..].iter().all(|&x| x == 0.0));
        assert_eq!(own(&got.dq, s.d), want.dq);
        assert_eq!(own(&got.dk, s.d), want.dk);
        assert_eq!(own(&got.dv, s.dv), want.dv);
        assert_eq!(own(&got.o, s.dv), want.o);
        assert!(pads(&got.dq, s.d) && pads(&got.dk, s.d) && pads(&got.dv, s.dv));
        // The scale a padded spec would take by default (from D8) changes the gradients: it must stay named.
        let unnamed = AttentionSpec { scale: None, ..padded.clone() };
        let wrong = reference_backward(&unnamed, &inputs8, &d_o8).expect("reference");
        assert_ne!(own(&wrong.dq, s.d), want.dq);
    }

    /// Regression: `bwd::aligned` did not look at the f32 dQ, so an f32 dQ 4 bytes but not 16 bytes aligned
    /// (which `refusal` accepts) went to the in-place kernels, whose atomic path stores it as `float4`
    /// (`bwd_convert`): a misaligned-address fault. It takes the pad-copy path, which copies it back 4 bytes
    /// at a time; a 16-byte aligned one (or none) stays in place.
    #[test]
    fn an_f32_dq_off_16_bytes_takes_the_copies() {
        let sp = AttentionSpec::new(Shape { b: 1, hq: 2, hkv: 2, sq: 10, sk: 10, d: 64, dv: 64 }, DType::BF16);
        let base = 1u64 << 20;
        let attn = AttnParams::new(&sp, base, base, base, base, 0, 0).expect("params");
        let p = BwdParams { attn, d_o: base, dq: base, dk: base, dv: base, delta: 0, dq_acc: 0, dq_f32: 0 };
        assert!(bwd::aligned(&p, 64, 64));
        assert!(bwd::aligned(&BwdParams { dq_f32: base + 16, ..p }, 64, 64));
        let off = BwdParams { dq_f32: base + 4, ..p };
        assert!(!bwd::aligned(&off, 64, 64));
        assert_eq!(bwd::refusal(&sp, &off, 227 * 1024), None, "the copies take it");
    }

    #[test]
    fn calls_route_by_alignment_and_odd_head_dims_are_no_longer_refused() {
        let spec = |d, dv| AttentionSpec::new(Shape { b: 1, hq: 2, hkv: 2, sq: 10, sk: 10, d, dv }, DType::BF16);
        let ptrs = |spec: &AttentionSpec, base: u64| {
            let attn = AttnParams::new(spec, base, base, base, base, 0, 0).expect("params");
            BwdParams { attn, d_o: base, dq: base, dk: base, dv: base, delta: 0, dq_acc: 0, dq_f32: 0 }
        };
        const H100: usize = 227 * 1024;
        for (d, dv) in [(1, 1), (7, 7), (33, 33), (65, 65), (100, 100), (129, 129), (250, 250), (72, 33), (190, 127)] {
            let sp = spec(d, dv);
            let p = ptrs(&sp, 1 << 20);
            assert!(!bwd::aligned(&p, d, dv), "{d}/{dv}");
            assert_eq!(bwd::refusal(&sp, &p, H100), None, "{d}/{dv}");
            // Warm-ups compile the copies and the backward at the padded classes.
            let names: Vec<String> =
                bwd::programs_for(&sp, &p, false).expect("programs").into_iter().map(|p| p.name).collect();
            assert_eq!(names.len(), 2, "{names:?}");
        }
        // Aligned head dims on an aligned view run in place; a view off 16 bytes takes the copies.
        let sp = spec(64, 64);
        assert!(bwd::aligned(&ptrs(&sp, 1 << 20), 64, 64));
        assert!(!bwd::aligned(&ptrs(&sp, (1 << 20) + 2), 64, 64));
        assert_eq!(bwd::refusal(&sp, &ptrs(&sp, (1 << 20) + 2), H100), None);
        assert_eq!(bwd::programs_for(&sp, &ptrs(&sp, 1 << 20), true).expect("programs").len(), 1);
        // What the copies cannot take stays refused with the reason: odd byte addresses, an f32 dQ off 4
        // bytes, head dims above 256.
        let odd = bwd::refusal(&sp, &ptrs(&sp, (1 << 20) + 1), H100);
        assert!(odd.is_some_and(|w| w.contains("aligned to their elements")));
        let q32 = BwdParams { dq_f32: (1 << 20) + 2, ..ptrs(&spec(33, 33), 1 << 20) };
        assert!(bwd::refusal(&spec(33, 33), &q32, H100).is_some());
        let wide = bwd::refusal(&spec(257, 64), &ptrs(&spec(257, 64), 1 << 20), H100);
        assert!(wide.as_ref().is_some_and(|w| w.contains("from 1 to 256")), "{wide:?}");
        // D = 33 runs at class 64 (40 padded), D = 129 at 160 (136), 72/33 at 96/96 (72/40).
        let label = |d, dv| bwd::padded_dims(d, dv).map(|h| h.label());
        assert_eq!(
            (label(33, 33), label(129, 129), label(72, 33)),
            (Some("64p".into()), Some("160p".into()), Some("96p".into()))
        );
    }

    /// Regression: `bwd::programs_for` added the copy module only for head dims that are not multiples of 8,
    /// so a warm-up of a misaligned view at D = 64 (a base pointer off 16 bytes, a row stride that is not 8
    /// elements, an f32 dQ off 16 bytes) left it out and the first call compiled it. It lists exactly what
    /// `bwd::run` launches: the copies whenever the call is not `bwd::aligned`, the same backward program
    /// either way.
    #[test]
    fn a_warm_up_of_a_misaligned_view_compiles_the_copies() {
        let sp = AttentionSpec::new(Shape { b: 1, hq: 2, hkv: 2, sq: 10, sk: 10, d: 64, dv: 64 }, DType::BF16);
        let base = 1u64 << 20;
        let with = |spec: &AttentionSpec, at: u64| {
            let attn = AttnParams::new(spec, at, base, base, base, 0, 0).expect("params");
            BwdParams { attn, d_o: base, dq: base, dk: base, dv: base, delta: 0, dq_acc: 0, dq_f32: 0 }
        };
        let names = |spec: &AttentionSpec, p: &BwdParams| -> Vec<String> {
            bwd::programs_for(spec, p, false).expect("programs").into_iter().map(|p| p.name).collect()
        };
        let in_place = names(&sp, &with(&sp, base));
        assert_eq!(in_place.len(), 1, "{in_place:?}");
        let copies = pad_copy::program().name;
        // Q's base 2 bytes off 16.
        let off = with(&sp, base + 2);
        assert!(!bwd::aligned(&off, 64, 64));
        assert_eq!(names(&sp, &off), [in_place[0].clone(), copies.clone()]);
        // Rows 66 elements apart (BSHD inside a wider tensor): every base aligned, the strides not.
        let mut strided = sp.clone().with_layout(Layout::Bshd);
        strided.q_strides = sdpa_core::Strides { b: 10 * 2 * 66, h: 66, s: 2 * 66 };
        let p = with(&strided, base);
        assert!(!bwd::aligned(&p, 64, 64));
        assert_eq!(names(&strided, &p), [in_place[0].clone(), copies.clone()]);
        // An f32 dQ 4 bytes but not 16 bytes aligned.
        let q32 = BwdParams { dq_f32: base + 4, ..with(&sp, base) };
        assert_eq!(names(&sp, &q32), [in_place[0].clone(), copies]);
    }
}
