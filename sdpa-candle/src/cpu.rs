//! `cpu_fwd`: sdpa-cpu on candle's CPU storage, reading Q, K, V and the mask in place.

use crate::error::sdpa_err;
use crate::plan::{operand_slice, Plan};
use candle_core::{CpuStorage, Result, Shape, WithDType};
use sdpa_core::{Backend, Operand};

/// An element type candle stores and sdpa-cpu computes on: f32, f16, bf16.
pub(crate) trait Element: WithDType + sdpa_cpu::CpuElement {}
impl<T: WithDType + sdpa_cpu::CpuElement> Element for T {}

/// Runs one planned call on host slices (whole storages; the plan's offsets say where each operand starts).
/// The output is allocated NaN-filled, so an element a kernel failed to write can never pass for a value.
pub(crate) fn run<T: Element>(
    plan: &Plan,
    q: &[T],
    k: &[T],
    v: &[T],
    mask: Option<&[f32]>,
    block_table: Option<&[u32]>,
) -> Result<(CpuStorage, Shape)> {
    let spec = &plan.spec;
    if spec.ragged.is_some() {
        return ragged_by_reference(plan, q, k, v, block_table);
    }
    if !spec.variants.is_plain() {
        // sdpa-cpu's capability list names the variants its kernels honour; a variant missing from it is
        // refused here with sdpa's `Unsupported` error rather than risk a kernel that would ignore it.
        let cpu = sdpa_cpu::CpuBackend::new(None).map_err(sdpa_err)?;
        cpu.capabilities().check(cpu.name(), spec, &plan.run).map_err(sdpa_err)?;
    }
    let need = |op| spec.required_len(op).map_err(sdpa_err);
    let q = operand_slice("q", q, plan.q_offset, need(Operand::Q)?)?;
    let k = operand_slice("k", k, plan.k_offset, need(Operand::K)?)?;
    let v = operand_slice("v", v, plan.v_offset, need(Operand::V)?)?;
    let mut o = vec![<T as sdpa_cpu::CpuElement>::from_f32(f32::NAN); plan.out_len];
    sdpa_cpu::attention(spec, &plan.run, q, k, v, mask, &mut o, None).map_err(sdpa_err)?;
    Ok((T::to_cpu_storage_owned(o), Shape::from_dims(&plan.out_dims)))
}

/// TEMPORARY, until sdpa-cpu's ragged kernels land (branch i23-cpu): a ragged call row by row through the
/// f64 reference, rounded to the output dtype.
fn ragged_by_reference<T: Element>(
    plan: &Plan,
    q: &[T],
    k: &[T],
    v: &[T],
    block_table: Option<&[u32]>,
) -> Result<(CpuStorage, Shape)> {
    use sdpa_core::{HostBuffer, HostInputs};
    let spec = &plan.spec;
    let need = |op| spec.required_len(op).map_err(sdpa_err);
    let host = |name, x: &[T], off, op| -> Result<HostBuffer> {
        let s = operand_slice(name, x, off, need(op)?)?;
        let f: Vec<f32> = s.iter().map(|&e| e.to_f32()).collect();
        Ok(HostBuffer::from_f32(spec.dtype, &f))
    };
    let inputs = HostInputs {
        q: host("q", q, plan.q_offset, Operand::Q)?,
        k: host("k", k, plan.k_offset, Operand::K)?,
        v: host("v", v, plan.v_offset, Operand::V)?,
        mask: None,
        block_table: block_table.map(<[u32]>::to_vec),
    };
    let mut o = vec![<T as sdpa_cpu::CpuElement>::from_f32(f32::NAN); plan.out_len];
    let mut row = vec![0f64; spec.shape.dv];
    for (b, seq) in spec.seqs().iter().enumerate() {
        for h in 0..spec.shape.hq {
            for i in 0..seq.sq {
                sdpa_core::reference::reference_row_in(spec, &inputs, seq, b, h, i, &mut row);
                let at = spec.o_offset(seq, b, h, i);
                for (c, &x) in row.iter().enumerate() {
                    o[at + c] = T::from_f32(x as f32);
                }
            }
        }
    }
    Ok((T::to_cpu_storage_owned(o), Shape::from_dims(&plan.out_dims)))
}
