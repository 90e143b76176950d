//! TEMPORARY stand-in for `sdpa_cpu::attention_backward` (i24-cpu's entry, committed there but not yet
//! exported): a naive row-by-row backward with the same signature, in f64, so the candle side is tested
//! end to end until the fused one lands. Not for release: it is O(S²·D) scalar code.

use sdpa_core::{AttentionSpec, Mask, Operand, Result, RunOptions};

use sdpa_core::backward::{BackwardOptions, BackwardRun};

/// The slices of one backward call (as `sdpa_cpu::BackwardSlices`).
#[derive(Debug)]
pub struct BackwardSlices<'a, T> {
    pub q: &'a [T],
    pub k: &'a [T],
    pub v: &'a [T],
    pub mask: Option<&'a [f32]>,
    pub o: &'a [T],
    pub d_o: &'a [T],
    pub lse: &'a [f32],
    pub dq: &'a mut [T],
    pub dk: &'a mut [T],
    pub dv: &'a mut [T],
    #[allow(dead_code)]
    pub dq_accum: Option<&'a mut [f32]>,
}

pub fn attention_backward<T: sdpa_cpu::CpuElement>(
    spec: &AttentionSpec,
    _run: &RunOptions,
    _bwd: &BackwardOptions,
    x: BackwardSlices<'_, T>,
) -> Result<BackwardRun> {
    let BackwardSlices { q, k, v, mask, o, d_o, lse, dq, dk, dv, dq_accum: _ } = x;
    let s = spec.shape;
    let scale = spec.scale();
    let g = |x: &[T], i: usize| x[i].to_f32() as f64;
    let mut dqa = vec![0f64; dq.len()];
    let mut dka = vec![0f64; dk.len()];
    let mut dva = vec![0f64; dv.len()];
    let slopes = spec.alibi_slopes()?;
    for b in 0..s.b {
        let seq = spec.seq(b);
        for h in 0..s.hq {
            let kvh = s.kv_head(h);
            for i in 0..seq.sq {
                let qo = spec.q_offset(&seq, b, h, i);
                let oo = spec.o_offset(&seq, b, h, i);
                let l = lse[spec.row_index(&seq, b, h, i)] as f64;
                if l == f64::NEG_INFINITY {
                    continue;
                }
                let delta: f64 = (0..s.dv).map(|c| g(d_o, oo + c) * g(o, oo + c)).sum();
                for j in spec.key_range_in(&seq, i) {
                    let add = match (&spec.mask, mask) {
                        (Mask::Explicit(m), Some(data)) => {
                            let st = m.strides();
                            let idx = if m.dims[0] == 1 { 0 } else { b * st[0] }
                                + if m.dims[1] == 1 { 0 } else { h * st[1] }
                                + i * st[2]
                                + j * st[3];
                            data[idx] as f64
                        }
                        _ => 0.0,
                    };
                    if add == f64::NEG_INFINITY {
                        continue;
                    }
                    let ko = spec.kv_offset(Operand::K, None, &seq, b, kvh, j);
                    let vo = spec.kv_offset(Operand::V, None, &seq, b, kvh, j);
                    let x = scale * (0..s.d).map(|c| g(q, qo + c) * g(k, ko + c)).sum::<f64>();
                    let (s0, dcap) = match spec.softcap() {
                        Some(cap) => {
                            let t = cap * (x / cap).tanh();
                            (t, 1.0 - (t / cap) * (t / cap))
                        }
                        None => (x, 1.0),
                    };
                    let mut sc = s0 + add;
                    if let Some(sl) = &slopes {
                        let diag = i as f64 + spec.diagonal().map_or(0, |d| d.offset(seq.sq, seq.sk)) as f64;
                        sc -= sl[h] as f64 * (j as f64 - diag).abs();
                    }
                    let p = (sc - l).exp();
                    let dp: f64 = (0..s.dv).map(|c| g(d_o, oo + c) * g(v, vo + c)).sum();
                    for c in 0..s.dv {
                        dva[vo + c] += p * g(d_o, oo + c);
                    }
                    let dx = p * (dp - delta) * dcap;
                    for c in 0..s.d {
                        dqa[qo + c] += scale * dx * g(k, ko + c);
                        dka[ko + c] += scale * dx * g(q, qo + c);
                    }
                }
            }
        }
    }
    for (d, a) in [(dq, dqa), (dk, dka), (dv, dva)] {
        for (x, y) in d.iter_mut().zip(a) {
            *x = T::from_f32(y as f32);
        }
    }
    Ok(BackwardRun { kernel: sdpa_core::Kernel::Auto, deterministic: true })
}
