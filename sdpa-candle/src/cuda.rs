//! `cuda_fwd`: sdpa-cuda on candle's CUDA storage, queued on candle's own stream. Q, K, V and the mask
//! are read in place (views from their start offsets); the output is a new device allocation that
//! candle owns. No operand is copied through the host. The variants (window, softcap, ALiBi slopes as host
//! values: a slopes tensor's `Hq` floats are read once when the op is built) travel in the plan's spec;
//! sdpa-cuda's capability check refuses the ones its kernels do not honour. The backward (`backward`) runs
//! the same way: dQ, dK, dV are new allocations, written on candle's stream.

use crate::backward::{BackwardInputs, SavedLse};
use crate::error::sdpa_err;
use crate::op::SdpaOp;
use crate::plan::Plan;
use candle_core::cuda::cudarc::driver::{CudaSlice, CudaStream, CudaView};
use candle_core::cuda::{CudaDType, CudaStorageSlice};
use candle_core::{bail, CudaStorage, Result, Shape, Storage, Tensor};
use sdpa_core::Backend;
use sdpa_cuda::{CudaBackend, CudaElement};
use std::sync::{Arc, Mutex, OnceLock};

/// The backends made so far, one per candle device.
type Backends = Mutex<Vec<(candle_core::cuda::DeviceId, Arc<CudaBackend>)>>;

/// One sdpa-cuda backend per candle device, created on first use: a backend holds its loaded kernel
/// programs, so making one per call would load them again every time ([`crate::warmup`] fills it ahead).
pub(crate) fn backend_for(device: &candle_core::CudaDevice) -> Result<Arc<CudaBackend>> {
    static BACKENDS: OnceLock<Backends> = OnceLock::new();
    let all = BACKENDS.get_or_init(|| Mutex::new(Vec::new()));
    let mut all =
        all.lock().map_err(|_| candle_core::Error::Msg("sdpa: the CUDA backend cache lock is poisoned".into()))?;
    if let Some((_, b)) = all.iter().find(|(id, _)| *id == device.id()) {
        return Ok(b.clone());
    }
    let b = Arc::new(CudaBackend::from_stream(device.cuda_stream()).map_err(sdpa_err)?);
    all.push((device.id(), b.clone()));
    Ok(b)
}

/// An element type candle stores on the GPU and sdpa-cuda computes on.
trait Element: CudaDType + CudaElement + candle_core::cuda::cudarc::driver::DeviceRepr {}
impl<T: CudaDType + CudaElement + candle_core::cuda::cudarc::driver::DeviceRepr> Element for T {}

/// A read guard on the prepared mask's storage, or `None` when the call has no explicit mask.
fn mask_storage(op: &SdpaOp) -> Result<Option<candle_core::StorageRef<'_>>> {
    let Some(m) = &op.mask_tensor else { return Ok(None) };
    let (storage, layout) = m.tensor.storage_and_layout();
    if layout.start_offset() != 0 {
        bail!("sdpa: internal: the prepared mask must start at offset 0 of its storage");
    }
    Ok(Some(storage))
}

/// The prepared mask's device values under a guard from [`mask_storage`].
fn mask_slice<'a>(guard: &'a Option<candle_core::StorageRef<'_>>) -> Result<Option<&'a CudaSlice<f32>>> {
    match guard.as_deref() {
        None => Ok(None),
        Some(Storage::Cuda(c)) => Ok(Some(c.as_cuda_slice::<f32>()?)),
        Some(_) => bail!("sdpa: internal: the prepared mask should be f32 on the GPU"),
    }
}

/// The part of a storage an operand reads, from its start offset.
fn view<'a, T: Element>(s: &'a CudaStorage, off: usize, name: &str) -> Result<CudaView<'a, T>> {
    let slice: &CudaSlice<T> = s.as_cuda_slice::<T>()?;
    if off > slice.len() {
        bail!("sdpa: {name} starts at offset {off} past the end of its storage ({} elements)", slice.len());
    }
    Ok(slice.slice(off..))
}

fn run_typed<T: Element>(
    op: &SdpaOp,
    plan: &Plan,
    stream: &Arc<CudaStream>,
    backend: &CudaBackend,
    s1: &CudaStorage,
    s2: &CudaStorage,
    s3: &CudaStorage,
) -> Result<(CudaStorage, Shape)> {
    let q = view::<T>(s1, plan.q_offset, "q")?;
    let k = view::<T>(s2, plan.k_offset, "k")?;
    let v = view::<T>(s3, plan.v_offset, "v")?;
    let mask_guard = mask_storage(op)?;
    let mask = mask_slice(&mask_guard)?;
    let device = s1.device.clone();
    // SAFETY: the kernels write every element of O before anything reads it (sdpa-cuda's tests poison O
    // and compare every element with the reference); candle never reads it before this call is queued.
    let mut o = unsafe { device.alloc::<T>(plan.out_len.max(1)) }?;
    // The block table the host checked (op.rs says why it travels as host values), copied to the device on
    // candle's stream, so the kernel reads exactly the checked entries.
    let table = match op.block_table() {
        Some(t) => Some(
            stream
                .clone_htod(t)
                .map_err(|e| candle_core::Error::Msg(format!("sdpa: copying the block table to the GPU: {e}")))?,
        ),
        None => None,
    };
    // The LSE the backward will need (backward.rs says why it is kept); only when the inputs track gradients.
    let mut lse = match op.saved.keep {
        // SAFETY: the forward writes every row's LSE (sdpa-cuda's tests compare each with the reference).
        true => Some(unsafe { device.alloc::<f32>(plan.spec.lse_len().map_err(sdpa_err)?.max(1)) }?),
        false => None,
    };
    backend
        .forward_on_stream(stream, &plan.spec, &plan.run, &q, &k, &v, mask, &mut o, lse.as_mut(), table.as_ref())
        .map_err(sdpa_err)?;
    if let Some(lse) = lse {
        op.saved.put(SavedLse::Cuda(lse))?;
    }
    Ok((CudaStorage::wrap_cuda_slice(o, device), Shape::from_dims(&plan.out_dims)))
}

/// Runs one planned call on candle's CUDA storages and stream.
pub(crate) fn run(
    op: &SdpaOp,
    plan: &Plan,
    s1: &CudaStorage,
    s2: &CudaStorage,
    s3: &CudaStorage,
) -> Result<(CudaStorage, Shape)> {
    let backend = backend_for(&s1.device)?;
    let stream = s1.device.cuda_stream();
    match plan.spec.dtype {
        sdpa_core::DType::F32 => run_typed::<f32>(op, plan, &stream, &backend, s1, s2, s3),
        sdpa_core::DType::F16 => run_typed::<half::f16>(op, plan, &stream, &backend, s1, s2, s3),
        sdpa_core::DType::BF16 => run_typed::<half::bf16>(op, plan, &stream, &backend, s1, s2, s3),
        sdpa_core::DType::F8E4M3 => run_fp8(plan, &stream, &backend, s1, s2, s3),
    }
}

/// The E4M3 bytes of an f8e4m3 storage from an operand's start offset, as sdpa-cuda takes them (`u8`).
fn fp8_view<'a>(s: &'a CudaStorage, off: usize, name: &str) -> Result<CudaView<'a, u8>> {
    let CudaStorageSlice::F8E4M3(slice) = &s.slice else { bail!("sdpa: internal: {name} should be f8e4m3") };
    if off > slice.len() {
        bail!("sdpa: {name} starts at offset {off} past the end of its storage ({} elements)", slice.len());
    }
    let part = slice.slice(off..);
    // SAFETY: float8::F8E4M3 is one byte (`repr(transparent)` over u8), so the view covers the same bytes.
    unsafe { part.transmute::<u8>(part.len()) }
        .ok_or_else(|| candle_core::Error::Msg(format!("sdpa: internal: {name} cannot be read as bytes")))
}

/// FP8 inputs (with the plan's descales) on `fa3`: O is a new bf16 allocation. Forward only: the op keeps no
/// LSE (the backward refuses FP8), and FP8 takes no explicit mask or ragged batch (`fa3` refuses them).
fn run_fp8(
    plan: &Plan,
    stream: &Arc<CudaStream>,
    backend: &CudaBackend,
    s1: &CudaStorage,
    s2: &CudaStorage,
    s3: &CudaStorage,
) -> Result<(CudaStorage, Shape)> {
    let q = fp8_view(s1, plan.q_offset, "q")?;
    let k = fp8_view(s2, plan.k_offset, "k")?;
    let v = fp8_view(s3, plan.v_offset, "v")?;
    let device = s1.device.clone();
    // SAFETY: fa3 writes every element of O before anything reads it (sdpa-cuda's FP8 tests poison O and
    // compare every element with the reference); candle never reads it before this call is queued.
    let mut o = unsafe { device.alloc::<half::bf16>(plan.out_len.max(1)) }?;
    backend.forward_on_stream(stream, &plan.spec, &plan.run, &q, &k, &v, None, &mut o, None, None).map_err(sdpa_err)?;
    Ok((CudaStorage::wrap_cuda_slice(o, device), Shape::from_dims(&plan.out_dims)))
}

/// The CUDA storage under a tensor, from a read guard.
fn cuda_of<'a>(name: &str, s: &'a Storage) -> Result<&'a CudaStorage> {
    match s {
        Storage::Cuda(c) => Ok(c),
        _ => bail!("sdpa: internal: {name} should be on the GPU"),
    }
}

/// The CUDA backward of one planned call on candle's stream: dQ, dK, dV are new allocations written
/// through Q's, K's and V's strides (backward.rs says how those map onto dense buffers).
pub(crate) fn backward(
    op: &SdpaOp,
    plan: &Plan,
    qkv: [&Tensor; 3],
    g: &BackwardInputs,
    lse: &CudaSlice<f32>,
) -> Result<(Storage, Storage, Storage)> {
    let (sq, sk, sv) = (qkv[0].storage_and_layout().0, qkv[1].storage_and_layout().0, qkv[2].storage_and_layout().0);
    let (so, sdo) = (g.o.storage_and_layout().0, g.d_o.storage_and_layout().0);
    let s = Stores {
        q: cuda_of("q", &sq)?,
        k: cuda_of("k", &sk)?,
        v: cuda_of("v", &sv)?,
        o: cuda_of("o", &so)?,
        d_o: cuda_of("d_o", &sdo)?,
        d_o_offset: g.d_o.layout().start_offset(),
        lens: [qkv[0].elem_count(), qkv[1].elem_count(), qkv[2].elem_count()],
    };
    match plan.spec.dtype {
        sdpa_core::DType::F32 => backward_typed::<f32>(op, plan, &s, lse),
        sdpa_core::DType::F16 => backward_typed::<half::f16>(op, plan, &s, lse),
        sdpa_core::DType::BF16 => backward_typed::<half::bf16>(op, plan, &s, lse),
        sdpa_core::DType::F8E4M3 => bail!("sdpa: the backward of f8e4m3 inputs: FP8 attention is forward only"),
    }
}

/// The storages one backward reads, and the element counts of the gradients it writes.
struct Stores<'a> {
    q: &'a CudaStorage,
    k: &'a CudaStorage,
    v: &'a CudaStorage,
    o: &'a CudaStorage,
    d_o: &'a CudaStorage,
    d_o_offset: usize,
    lens: [usize; 3],
}

fn backward_typed<T: Element>(
    op: &SdpaOp,
    plan: &Plan,
    s: &Stores,
    lse: &CudaSlice<f32>,
) -> Result<(Storage, Storage, Storage)> {
    let backend = backend_for(&s.q.device)?;
    let run = crate::backward::backward_run(&backend.capabilities(), &plan.run);
    let stream = s.q.device.cuda_stream();
    let q = view::<T>(s.q, plan.q_offset, "q")?;
    let k = view::<T>(s.k, plan.k_offset, "k")?;
    let v = view::<T>(s.v, plan.v_offset, "v")?;
    let o = view::<T>(s.o, 0, "o")?;
    let d_o = view::<T>(s.d_o, s.d_o_offset, "d_o")?;
    let mask_guard = mask_storage(op)?;
    let mask = mask_slice(&mask_guard)?;
    let device = s.q.device.clone();
    // SAFETY: the backward writes every element of dQ, dK and dV the spec addresses, and the buffers are
    // dense in those strides (sdpa-cuda's tests poison them and compare every element with the reference).
    let (mut dq, mut dk, mut dv) = unsafe {
        (
            device.alloc::<T>(s.lens[0].max(1))?,
            device.alloc::<T>(s.lens[1].max(1))?,
            device.alloc::<T>(s.lens[2].max(1))?,
        )
    };
    backend
        .backward_on_stream(
            &stream, &plan.spec, &run, &op.bwd, &q, &k, &v, mask, &o, &d_o, lse, &mut dq, &mut dk, &mut dv, None,
        )
        .map_err(sdpa_err)?;
    let wrap = |x: CudaSlice<T>| Storage::Cuda(CudaStorage::wrap_cuda_slice(x, device.clone()));
    Ok((wrap(dq), wrap(dk), wrap(dv)))
}
