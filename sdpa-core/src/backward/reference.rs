//! The f64 reference backward (the oracle for every backend's gradients), and an emulation of an eager
//! same-dtype backward (the "unfused in the same dtype" error that f16/bf16 kernels are held to twice of).

use super::{kv_row_index, kv_rows, round_to, validate_backward};
use crate::dtype::DType;
use crate::error::{Result, SdpaError};
use crate::reference::row_scores;
use crate::spec::{AttentionSpec, Operand};
use crate::tensor::{HostBuffer, HostInputs};

/// Gradients in logical order: `dq` is `[rows, D]` in the LSE's row order ([`AttentionSpec::row_index`]),
/// `dk`/`dv` are `[kv rows, D]`/`[kv rows, Dv]` in [`super::kv_row_index`] order. `o` and `lse` are the
/// forward the gradients were computed with (row order, like [`crate::ReferenceOutput`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceGradients {
    /// `dQ`.
    pub dq: Vec<f64>,
    /// `dK`.
    pub dk: Vec<f64>,
    /// `dV`.
    pub dv: Vec<f64>,
    /// The forward output.
    pub o: Vec<f64>,
    /// The forward log-sum-exp.
    pub lse: Vec<f64>,
}

/// Computes `dQ, dK, dV` in f64 from Q, K, V and `d_o` alone (O and LSE are recomputed exactly, never read
/// from a backend). Work is split over `(b, kv head)` groups on the machine's cores, so each group's
/// `dK`/`dV` has one writer.
pub fn reference_backward(spec: &AttentionSpec, inputs: &HostInputs, d_o: &HostBuffer) -> Result<ReferenceGradients> {
    backward_impl(spec, inputs, d_o, None)
}

/// The same backward as an eager implementation in `dtype` computes it (matmul + softmax + matmul and
/// their gradients, each product accumulated in f32 and its result rounded to `dtype`; per-head gradients
/// of a GQA group rounded before they are summed, as after `repeat_interleave`). Its distance from
/// [`reference_backward`] is the error a same-dtype unfused backward makes; fused kernels are held to at
/// most twice that ([`super::GradCheckReport::within_unfused`]).
pub fn reference_backward_rounded(
    spec: &AttentionSpec,
    inputs: &HostInputs,
    d_o: &HostBuffer,
    dtype: DType,
) -> Result<ReferenceGradients> {
    backward_impl(spec, inputs, d_o, Some(dtype))
}

fn backward_impl(
    spec: &AttentionSpec,
    inputs: &HostInputs,
    d_o: &HostBuffer,
    rounded: Option<DType>,
) -> Result<ReferenceGradients> {
    validate_backward(spec)?;
    inputs.check(spec)?;
    d_o.expect_dtype("d_o", spec.dtype)?;
    let o_len = spec.required_len(Operand::O)?;
    if d_o.len() < o_len {
        return Err(SdpaError::BufferTooShort { name: "d_o", len: d_o.len(), needed: o_len });
    }
    let s = spec.shape;
    let rows = spec.lse_len()?;
    let krows = kv_rows(spec)?;
    let elems = |n: usize, d: usize| n.checked_mul(d).ok_or_else(|| SdpaError::overflow("reference gradients"));
    let mut out = ReferenceGradients {
        dq: vec![0.0; elems(rows, s.d)?],
        dk: vec![0.0; elems(krows, s.d)?],
        dv: vec![0.0; elems(krows, s.dv)?],
        o: vec![0.0; elems(rows, s.dv)?],
        lse: vec![0.0; rows],
    };
    let groups: Vec<(usize, usize)> = (0..s.b).flat_map(|b| (0..s.hkv).map(move |g| (b, g))).collect();
    let workers = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).clamp(1, groups.len().max(1));
    let per = groups.len().div_ceil(workers).max(1);
    let seqs = spec.seqs();
    let results: Vec<Vec<GroupGradients>> = std::thread::scope(|scope| {
        let handles: Vec<_> = groups
            .chunks(per)
            .map(|chunk| {
                let seqs = &seqs;
                scope.spawn(move || {
                    chunk.iter().map(|&(b, g)| group_backward(spec, inputs, d_o, &seqs[b], b, g, rounded)).collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join()).collect::<std::result::Result<Vec<_>, _>>()
    })
    .map_err(|_| SdpaError::invalid("a reference backward worker panicked (a bug in sdpa-core)"))?;
    // Scatter each group's rows into the logical order.
    for gg in results.into_iter().flatten() {
        for (row, dq, o, lse) in gg.q_rows {
            out.dq[row * s.d..(row + 1) * s.d].copy_from_slice(&dq);
            out.o[row * s.dv..(row + 1) * s.dv].copy_from_slice(&o);
            out.lse[row] = lse;
        }
        for (krow, dk, dv) in gg.kv_rows {
            out.dk[krow * s.d..(krow + 1) * s.d].copy_from_slice(&dk);
            out.dv[krow * s.dv..(krow + 1) * s.dv].copy_from_slice(&dv);
        }
    }
    Ok(out)
}

/// One `(b, kv head)` group's results: per query row `(row index, dQ, O, LSE)`, per key `(kv row, dK, dV)`.
#[derive(Default)]
struct GroupGradients {
    q_rows: Vec<(usize, Vec<f64>, Vec<f64>, f64)>,
    kv_rows: Vec<(usize, Vec<f64>, Vec<f64>)>,
}

fn group_backward(
    spec: &AttentionSpec,
    inputs: &HostInputs,
    d_o: &HostBuffer,
    seq: &crate::ragged::Seq,
    b: usize,
    g: usize,
    rounded: Option<DType>,
) -> GroupGradients {
    let s = spec.shape;
    let r = |x: f64| rounded.map_or(x, |dt| round_to(dt, x));
    let scale = spec.scale();
    let table = inputs.block_table.as_deref();
    let group = s.group_size();
    let mut dk_total = vec![0.0f64; seq.sk * s.d];
    let mut dv_total = vec![0.0f64; seq.sk * s.dv];
    let mut out = GroupGradients::default();
    let k_at = |j: usize, c: usize| inputs.k.get_f64(spec.kv_offset(Operand::K, table, seq, b, g, j) + c);
    let v_at = |j: usize, c: usize| inputs.v.get_f64(spec.kv_offset(Operand::V, table, seq, b, g, j) + c);
    for h in g * group..(g + 1) * group {
        let mut dk_h = vec![0.0f64; seq.sk * s.d];
        let mut dv_h = vec![0.0f64; seq.sk * s.dv];
        for i in 0..seq.sq {
            let (q, keys) = row_scores(spec, inputs, seq, (b, h, i), &r);
            let o_off = spec.o_offset(seq, b, h, i);
            let dout: Vec<f64> = (0..s.dv).map(|c| d_o.get_f64(o_off + c)).collect();
            let row = spec.row_index(seq, b, h, i);
            let mut dq = vec![0.0f64; s.d];
            let mut o = vec![0.0f64; s.dv];
            // NaN scores poison the row (`fold` with `max` would skip them); -inf max means no visible key.
            let m = if keys.iter().any(|k| k.s.is_nan()) {
                f64::NAN
            } else {
                keys.iter().map(|k| k.s).fold(f64::NEG_INFINITY, f64::max)
            };
            if m == f64::NEG_INFINITY {
                out.q_rows.push((row, dq, o, f64::NEG_INFINITY));
                continue;
            }
            let l: f64 = keys.iter().map(|k| (k.s - m).exp()).sum();
            let lse = m + l.ln();
            let p: Vec<f64> = keys.iter().map(|k| r((k.s - m).exp() / l)).collect();
            for (key, &pj) in keys.iter().zip(&p) {
                for (c, oc) in o.iter_mut().enumerate() {
                    *oc += pj * v_at(key.j, c);
                }
            }
            o.iter_mut().for_each(|x| *x = r(*x));
            let delta: f64 = dout.iter().zip(&o).map(|(a, b)| a * b).sum();
            for (key, &pj) in keys.iter().zip(&p) {
                let dp = r((0..s.dv).map(|c| dout[c] * v_at(key.j, c)).sum::<f64>());
                let ds = r(pj * (dp - delta));
                let dx = if key.ds_dx == 1.0 { ds } else { r(ds * key.ds_dx) };
                for c in 0..s.d {
                    dq[c] += dx * k_at(key.j, c);
                    dk_h[key.j * s.d + c] += dx * q[c];
                }
                for c in 0..s.dv {
                    dv_h[key.j * s.dv + c] += pj * dout[c];
                }
            }
            dq.iter_mut().for_each(|x| *x = r(*x * scale));
            out.q_rows.push((row, dq, o, lse));
        }
        for (t, x) in dk_total.iter_mut().zip(&dk_h) {
            *t += r(x * scale);
        }
        for (t, x) in dv_total.iter_mut().zip(&dv_h) {
            *t += r(*x);
        }
    }
    for j in 0..seq.sk {
        let dk = dk_total[j * s.d..(j + 1) * s.d].iter().map(|&x| r(x)).collect();
        let dv = dv_total[j * s.dv..(j + 1) * s.dv].iter().map(|&x| r(x)).collect();
        out.kv_rows.push((kv_row_index(spec, seq, b, g, j), dk, dv));
    }
    out
}
