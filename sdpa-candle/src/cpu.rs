//! `cpu_fwd`: sdpa-cpu on candle's CPU storage, reading Q, K, V and the mask in place (a ragged call through
//! `attention_ragged`, with the checked block table).

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
    if !spec.variants.is_plain() || spec.ragged.is_some() {
        // sdpa-cpu's capability list names the variants and serving layouts its kernels honour; one missing
        // from it is refused here with sdpa's `Unsupported` error rather than risk a kernel that ignores it.
        let cpu = sdpa_cpu::CpuBackend::new(None).map_err(sdpa_err)?;
        cpu.capabilities().check(cpu.name(), spec, &plan.run).map_err(sdpa_err)?;
    }
    let need = |op| spec.required_len(op).map_err(sdpa_err);
    let q = operand_slice("q", q, plan.q_offset, need(Operand::Q)?)?;
    let k = operand_slice("k", k, plan.k_offset, need(Operand::K)?)?;
    let v = operand_slice("v", v, plan.v_offset, need(Operand::V)?)?;
    let mut o = vec![<T as sdpa_cpu::CpuElement>::from_f32(f32::NAN); plan.out_len];
    match spec.ragged {
        None => sdpa_cpu::attention(spec, &plan.run, q, k, v, mask, &mut o, None),
        Some(_) => sdpa_cpu::attention_ragged(spec, &plan.run, q, k, v, block_table, &mut o, None),
    }
    .map_err(sdpa_err)?;
    Ok((T::to_cpu_storage_owned(o), Shape::from_dims(&plan.out_dims)))
}
