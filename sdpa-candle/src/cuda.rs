//! `cuda_fwd`: sdpa-cuda on candle's CUDA storage, queued on candle's own stream. Q, K, V and the mask
//! are read in place (views from their start offsets); the output is a new device allocation that
//! candle owns. No operand is copied through the host. The variants (window, softcap, ALiBi slopes as host
//! values: a slopes tensor's `Hq` floats are read once when the op is built) travel in the plan's spec;
//! sdpa-cuda's capability check refuses the ones its kernels do not honour.

use crate::error::sdpa_err;
use crate::op::SdpaOp;
use crate::plan::Plan;
use candle_core::cuda::cudarc::driver::{CudaSlice, CudaStream, CudaView};
use candle_core::cuda::CudaDType;
use candle_core::{bail, CudaStorage, Result, Shape, Storage};
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
    let mask: Option<&CudaSlice<f32>> = match &mask_guard {
        None => None,
        Some(storage) => match &**storage {
            Storage::Cuda(c) => Some(c.as_cuda_slice::<f32>()?),
            _ => bail!("sdpa: internal: the prepared mask should be f32 on the GPU"),
        },
    };
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
    backend
        .forward_on_stream(stream, &plan.spec, &plan.run, &q, &k, &v, mask, &mut o, None, table.as_ref())
        .map_err(sdpa_err)?;
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
    }
}
