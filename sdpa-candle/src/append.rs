//! The write-to-cache step on candle tensors: new K/V rows copied into their pages in place, as a candle
//! `InplaceOp2` (the pages are the written tensor, the new rows the read one; the block table and the
//! lengths travel in the op as checked host values, like the attention op's, and the CUDA path uploads the
//! checked table).

use crate::error::sdpa_err;
use crate::tables::{lengths, lengths_from_offsets, BlockTable};
use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, InplaceOp2, Layout as CandleLayout, Result, Tensor};
use sdpa_core::{AppendSpec, Paging};

/// One append (K or V): where each new row goes, and the table that says it.
#[derive(Debug, Clone)]
struct AppendOp {
    spec: AppendSpec,
    table: Vec<u32>,
}

/// `[total, Hkv, dim]` rows and `[num_pages, page_size, Hkv, dim]` pages read as an [`AppendSpec`], with
/// the strides of the candle views (the head dims contiguous).
fn spec_of(
    name: &str,
    new: &CandleLayout,
    pages: &CandleLayout,
    base: &AppendSpec,
    what: (&str, &str),
) -> Result<AppendSpec> {
    let (nd, pd) = (new.dims(), pages.dims());
    let (&[total, h, d], &[num_pages, page_size, ph, pdim]) = (nd, pd) else {
        bail!(
            "sdpa: append_to_pages needs {} as [total_new, Hkv, D] and {} as [num_pages, page_size, Hkv, D], got \
             {nd:?} and {pd:?}",
            what.0,
            what.1
        );
    };
    if (h, d) != (ph, pdim) {
        bail!("sdpa: {} {nd:?} and {} {pd:?} disagree on heads or head dim", what.0, what.1);
    }
    let (ns, ps) = (new.stride(), pages.stride());
    if (d > 1 && ns[2] != 1) || (pdim > 1 && ps[3] != 1) {
        bail!("sdpa: the head dims of {} and {} must be contiguous; call `.contiguous()` first", what.0, what.1);
    }
    let paging = Paging { num_pages, page_size, ..base.paging };
    let total_new: usize = base.new_lens.iter().sum();
    if total != total_new {
        bail!("sdpa: {name} holds {total} new rows but cu_seqlens_new ends at {total_new}");
    }
    Ok(AppendSpec {
        paging,
        hkv: h,
        d,
        dv: d,
        new_strides: (ns[0], ns[1]),
        page_strides: (ps[0], ps[1], ps[2]),
        ..base.clone()
    })
}

/// Writes new K and V rows into a paged cache in place, after each sequence's cached tokens (the step
/// vLLM calls `reshape_and_cache`), before [`crate::sdpa_paged`] reads them.
///
/// `k_new` is `[total_new, Hkv, D]` and `v_new` `[total_new, Hkv, Dv]`, packed in sequence order;
/// `k_pages`/`v_pages` are NHD pages `[num_pages, page_size, Hkv, D]` (any strides with a contiguous head
/// dim); `block_table` `[B, max_pages]` and `cache_lens` `[B]` (tokens cached **before** this append) as in
/// [`crate::sdpa_paged`]. `cu_seqlens_new` (`[B + 1]` offsets) says which new rows belong to which sequence: it is
/// the `cu_seqlens_q` of the attention call that follows. Sequence `b`'s `n_b` new tokens land in its slots
/// `cache_lens[b] .. cache_lens[b] + n_b`, so its cache length afterwards is `cache_lens[b] + n_b`.
/// Everything is checked first (shapes, lengths, room in the sequence's pages, every page it writes inside
/// the pool) and nothing is written, in K or in V, when anything is wrong.
///
/// On the CPU this is sdpa-cpu's parallel copy, on CUDA sdpa-cuda's append kernel on candle's stream (one
/// launch for K, one for V); any page strides with a contiguous head dim.
pub fn append_to_pages(
    k_new: &Tensor,
    v_new: &Tensor,
    k_pages: &Tensor,
    v_pages: &Tensor,
    block_table: &Tensor,
    cache_lens: &Tensor,
    cu_seqlens_new: &Tensor,
) -> Result<()> {
    let device = k_pages.device();
    for (name, t) in [("k_new", k_new), ("v_new", v_new), ("v_pages", v_pages)] {
        if !t.device().same_device(device) {
            bail!("sdpa: k_pages is on {device:?} but {name} is on {:?}; all must share one device", t.device());
        }
    }
    for (new, pages, names) in [(k_new, k_pages, ("k_new", "k_pages")), (v_new, v_pages, ("v_new", "v_pages"))] {
        if new.dtype() != pages.dtype() {
            bail!(
                "sdpa: {} is {:?} but {} is {:?}; they must share one dtype",
                names.0,
                new.dtype(),
                names.1,
                pages.dtype()
            );
        }
    }
    let new_lens = lengths_from_offsets("cu_seqlens_new", cu_seqlens_new)?;
    let b = new_lens.len();
    let cache = lengths("cache_lens", cache_lens, b)?;
    let table = BlockTable::read(block_table, b)?;
    let paging = Paging { page_size: 1, num_pages: 1, max_pages: table.max_pages };
    let base = AppendSpec::new(paging, 1, 1, cache, new_lens);
    let k = spec_of("k_new", k_new.layout(), k_pages.layout(), &base, ("k_new", "k_pages"))?;
    let v = spec_of("v_new", v_new.layout(), v_pages.layout(), &base, ("v_new", "v_pages"))?;
    if k.paging != v.paging || k.hkv != v.hkv {
        bail!("sdpa: k_pages {:?} and v_pages {:?} must hold the same pages and heads", k_pages.dims(), v_pages.dims());
    }
    // Both checked before either is written (the buffer lengths are checked again in the op, on the storage).
    for s in [&k, &v] {
        s.validate(&table.pages, s.new_len().map_err(sdpa_err)?, s.pages_len().map_err(sdpa_err)?).map_err(sdpa_err)?;
    }
    k_pages.inplace_op2(k_new, &AppendOp { spec: k, table: table.pages.clone() })?;
    v_pages.inplace_op2(v_new, &AppendOp { spec: v, table: table.pages })
}

impl InplaceOp2 for AppendOp {
    fn name(&self) -> &'static str {
        "sdpa-append-to-pages"
    }

    fn cpu_fwd(&self, s1: &mut CpuStorage, l1: &CandleLayout, s2: &CpuStorage, l2: &CandleLayout) -> Result<()> {
        let (o1, o2) = (l1.start_offset(), l2.start_offset());
        fn tail<T>(x: &[T], off: usize) -> Result<&[T]> {
            match x.get(off..) {
                Some(t) => Ok(t),
                None => bail!("sdpa: internal: a start offset {off} past its storage"),
            }
        }
        fn tail_mut<T>(x: &mut [T], off: usize) -> Result<&mut [T]> {
            match x.get_mut(off..) {
                Some(t) => Ok(t),
                None => bail!("sdpa: internal: a start offset {off} past its storage"),
            }
        }
        let run = |r: sdpa_core::Result<()>| r.map_err(sdpa_err);
        match (s1, s2) {
            (CpuStorage::F32(p), CpuStorage::F32(n)) => {
                run(sdpa_cpu::append_to_pages(&self.spec, &self.table, tail(n, o2)?, tail_mut(p, o1)?))
            }
            (CpuStorage::F16(p), CpuStorage::F16(n)) => {
                run(sdpa_cpu::append_to_pages(&self.spec, &self.table, tail(n, o2)?, tail_mut(p, o1)?))
            }
            (CpuStorage::BF16(p), CpuStorage::BF16(n)) => {
                run(sdpa_cpu::append_to_pages(&self.spec, &self.table, tail(n, o2)?, tail_mut(p, o1)?))
            }
            (p, n) => bail!(
                "sdpa: append_to_pages takes f32, f16 or bf16 pages and rows of the same dtype, got {:?} and {:?}",
                p.dtype(),
                n.dtype()
            ),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &mut candle_core::CudaStorage,
        l1: &CandleLayout,
        s2: &candle_core::CudaStorage,
        l2: &CandleLayout,
    ) -> Result<()> {
        match (s1.dtype(), s2.dtype()) {
            (candle_core::DType::F32, candle_core::DType::F32) => self.cuda_typed::<f32>(s1, l1, s2, l2),
            (candle_core::DType::F16, candle_core::DType::F16) => self.cuda_typed::<half::f16>(s1, l1, s2, l2),
            (candle_core::DType::BF16, candle_core::DType::BF16) => self.cuda_typed::<half::bf16>(s1, l1, s2, l2),
            (p, n) => bail!(
                "sdpa: append_to_pages takes f32, f16 or bf16 pages and rows of the same dtype, got {p:?} and {n:?}"
            ),
        }
    }
}

#[cfg(feature = "cuda")]
impl AppendOp {
    /// sdpa-cuda's append kernel on candle's stream, the checked table uploaded for it.
    fn cuda_typed<T>(
        &self,
        s1: &mut candle_core::CudaStorage,
        l1: &CandleLayout,
        s2: &candle_core::CudaStorage,
        l2: &CandleLayout,
    ) -> Result<()>
    where
        T: candle_core::cuda::CudaDType + sdpa_cuda::CudaElement + candle_core::cuda::cudarc::driver::DeviceRepr,
    {
        let device = s1.device.clone();
        let backend = crate::cuda::backend_for(&device)?;
        let stream = device.cuda_stream();
        let table = stream
            .clone_htod(&self.table)
            .map_err(|e| candle_core::Error::Msg(format!("sdpa: copying the block table to the GPU: {e}")))?;
        let new = s2.as_cuda_slice::<T>()?;
        let new = match new.try_slice(l2.start_offset()..) {
            Some(v) => v,
            None => bail!("sdpa: internal: the new rows start past their storage"),
        };
        let mut pages = match s1.as_cuda_slice_mut::<T>()?.try_slice_mut(l1.start_offset()..) {
            Some(v) => v,
            None => bail!("sdpa: internal: the pages start past their storage"),
        };
        backend.append_to_pages(&stream, &self.spec, &table, &new, &mut pages).map_err(sdpa_err)
    }
}
