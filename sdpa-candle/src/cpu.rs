//! `cpu_fwd` and the CPU `bwd`: sdpa-cpu on candle's CPU storage, reading Q, K, V and the mask in place (a
//! ragged call through `attention_ragged`, with the checked block table).

use crate::backward::BackwardInputs;
use crate::error::sdpa_err;
use crate::op::SdpaOp;
use crate::plan::{operand_slice, Plan};
use candle_core::{bail, CpuStorage, Result, Shape, Storage, Tensor, WithDType};
use sdpa_core::{Backend, Operand};

/// An element type candle stores and sdpa-cpu computes on: f32, f16, bf16.
pub(crate) trait Element: WithDType + sdpa_cpu::CpuElement {}
impl<T: WithDType + sdpa_cpu::CpuElement> Element for T {}

/// Runs one planned call on host slices (whole storages; the plan's offsets say where each operand starts).
/// The output is allocated NaN-filled, so an element a kernel failed to write can never pass for a value.
/// `lse`, when given, receives the rows' log-sum-exp (`spec.lse_len()` floats) for the backward.
pub(crate) fn run<T: Element>(
    plan: &Plan,
    q: &[T],
    k: &[T],
    v: &[T],
    mask: Option<&[f32]>,
    block_table: Option<&[u32]>,
    lse: Option<&mut [f32]>,
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
        None => sdpa_cpu::attention(spec, &plan.run, q, k, v, mask, &mut o, lse),
        Some(_) => sdpa_cpu::attention_ragged(spec, &plan.run, q, k, v, block_table, &mut o, lse),
    }
    .map_err(sdpa_err)?;
    Ok((T::to_cpu_storage_owned(o), Shape::from_dims(&plan.out_dims)))
}

/// The elements of a tensor's CPU storage, from its start offset.
fn host<'a, T: Element>(name: &str, s: &'a Storage, offset: usize) -> Result<&'a [T]> {
    match s {
        Storage::Cpu(c) => {
            let all = c.as_slice::<T>()?;
            operand_slice(name, all, offset, 0)
        }
        _ => bail!("sdpa: internal: {name} should be on the CPU"),
    }
}

/// The CPU backward of one planned call: dQ, dK, dV written through Q's, K's and V's strides into fresh
/// NaN-filled buffers (so an element the kernel failed to write can never pass for a gradient).
pub(crate) fn backward(
    op: &SdpaOp,
    plan: &Plan,
    qkv: [&Tensor; 3],
    g: &BackwardInputs,
    lse: &[f32],
) -> Result<(Storage, Storage, Storage)> {
    match plan.spec.dtype {
        sdpa_core::DType::F32 => backward_typed::<f32>(op, plan, qkv, g, lse),
        sdpa_core::DType::F16 => backward_typed::<half::f16>(op, plan, qkv, g, lse),
        sdpa_core::DType::BF16 => backward_typed::<half::bf16>(op, plan, qkv, g, lse),
        sdpa_core::DType::F8E4M3 => bail!("sdpa: the backward of f8e4m3 inputs: FP8 attention is forward only"),
    }
}

fn backward_typed<T: Element>(
    op: &SdpaOp,
    plan: &Plan,
    qkv: [&Tensor; 3],
    g: &BackwardInputs,
    lse: &[f32],
) -> Result<(Storage, Storage, Storage)> {
    let spec = &plan.spec;
    let cpu = sdpa_cpu::CpuBackend::new(None).map_err(sdpa_err)?;
    let caps = cpu.capabilities();
    let run = crate::backward::backward_run(&caps, &plan.run);
    caps.check_backward(cpu.name(), spec, &run).map_err(sdpa_err)?;
    let need = |op| spec.required_len(op).map_err(sdpa_err);
    let (sq, sk, sv) = (qkv[0].storage_and_layout().0, qkv[1].storage_and_layout().0, qkv[2].storage_and_layout().0);
    let q = operand_slice("q", host::<T>("q", &sq, plan.q_offset)?, 0, need(Operand::Q)?)?;
    let k = operand_slice("k", host::<T>("k", &sk, plan.k_offset)?, 0, need(Operand::K)?)?;
    let v = operand_slice("v", host::<T>("v", &sv, plan.v_offset)?, 0, need(Operand::V)?)?;
    let (so, sdo) = (g.o.storage_and_layout().0, g.d_o.storage_and_layout().0);
    let o = operand_slice("o", host::<T>("o", &so, 0)?, 0, plan.out_len)?;
    let d_o = operand_slice("d_o", host::<T>("d_o", &sdo, g.d_o.layout().start_offset())?, 0, plan.out_len)?;
    let lse = operand_slice("lse", lse, 0, spec.lse_len().map_err(sdpa_err)?)?;
    let mask_len = op.mask_len()?;
    let mask_guard = op.mask_tensor.as_ref().map(|m| m.tensor.storage_and_layout());
    let mask = match &mask_guard {
        None => None,
        Some((storage, layout)) => {
            Some(operand_slice("mask", host::<f32>("mask", storage, layout.start_offset())?, 0, mask_len)?)
        }
    };
    let nan = <T as sdpa_cpu::CpuElement>::from_f32(f32::NAN);
    let mut dq = vec![nan; qkv[0].elem_count()];
    let mut dk = vec![nan; qkv[1].elem_count()];
    let mut dv = vec![nan; qkv[2].elem_count()];
    let slices =
        sdpa_cpu::BackwardSlices { q, k, v, mask, o, d_o, lse, dq: &mut dq, dk: &mut dk, dv: &mut dv, dq_accum: None };
    sdpa_cpu::attention_backward(spec, &run, &op.bwd, slices).map_err(sdpa_err)?;
    let wrap = |x: Vec<T>| Storage::Cpu(T::to_cpu_storage_owned(x));
    Ok((wrap(dq), wrap(dk), wrap(dv)))
}
