//! `paged_append` (`kernels/paged_append.cu`): the "write to cache" step of a paged KV cache on the device,
//! exactly [`sdpa_core::append_to_pages`]: new K (or V) rows, packed `[total_new, Hkv, D]` in sequence
//! order, copied into their pages after each sequence's cached tokens. The append is validated on the host
//! ([`AppendSpec::validate`]: lengths, room in the block table, buffer lengths) and each new token resolved
//! to its (sequence, position) there; the kernel reads the device block table (its page indices clamped into
//! the pool, as the attention kernels do). Each thread copies 16, 4 or 2 bytes of one row: the widest that
//! every row start and the row length allow.

use crate::checked::device::Device;
use crate::checked::launch::{launch, LaunchDims};
use crate::error::unsupported;
use crate::sys::modules::PAGED_APPEND;
use crate::sys::program::Program;
use cudarc::driver::{CudaStream, DeviceRepr};
use sdpa_core::{AppendSpec, Result};

/// The module, compiled whole (entries `paged_append_16`, `_4`, `_2`: bytes each thread copies).
pub fn program() -> Program {
    Program::whole(&PAGED_APPEND)
}

/// The kernel's parameter: `PagedAppendArgs` in paged_append.cu (strides in bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct AppendArgs {
    src: u64,
    pages: u64,
    table: u64,
    rows: u64,
    src_token: i64,
    src_head: i64,
    page_stride: i64,
    slot_stride: i64,
    head_stride: i64,
    n_units: i64,
    units_per_row: i32,
    hkv: i32,
    page_size: i32,
    max_pages: i32,
    num_pages: i32,
    reserved: i32,
}
const _: () = assert!(std::mem::size_of::<AppendArgs>() == 104);
// SAFETY: plain data with C layout matching the kernel's `PagedAppendArgs`.
unsafe impl DeviceRepr for AppendArgs {}

/// Sequence and position of every new token, `[total_new][2]` (the table the kernel reads).
pub fn token_rows(spec: &AppendSpec) -> Result<Vec<i32>> {
    let int = |v: usize| i32::try_from(v).map_err(|_| unsupported("paged append: a position exceeds i32"));
    let mut rows = Vec::new();
    for (b, (&c, &n)) in spec.cache_lens.iter().zip(&spec.new_lens).enumerate() {
        for t in 0..n {
            rows.push(int(b)?);
            rows.push(int(c + t)?);
        }
    }
    Ok(rows)
}

/// The widest copy (16, 4 or 2 bytes) that divides a row of `row_bytes` and every byte offset a row starts
/// at (`starts`: base addresses and strides).
pub fn copy_width(row_bytes: usize, starts: &[u64]) -> usize {
    [16usize, 4, 2, 1]
        .into_iter()
        .find(|&w| row_bytes.is_multiple_of(w) && starts.iter().all(|&s| s.is_multiple_of(w as u64)))
        .unwrap_or(1)
}

/// Device pointers of one append (the buffers' lengths and the spec already validated by the caller).
#[derive(Debug, Clone, Copy)]
pub struct AppendPtrs {
    /// The packed new rows.
    pub new: u64,
    /// The page pool.
    pub pages: u64,
    /// The block table (`u32`, `[B, max_pages]`).
    pub table: u64,
    /// The uploaded [`token_rows`].
    pub rows: u64,
}

/// Launches the copy of `spec` (validated) with elements of `elem` bytes.
///
/// # Safety
/// `ptrs` must point at live device buffers on `stream` holding what `spec` addresses: `new` at least
/// `spec.new_len()` elements, `pages` at least `spec.pages_len()`, `table` at least `B x max_pages` entries and
/// `rows` [`token_rows`]`(spec)`.
pub unsafe fn run(dev: &Device, stream: &CudaStream, spec: &AppendSpec, elem: usize, ptrs: AppendPtrs) -> Result<()> {
    let total: usize = spec.new_lens.iter().sum();
    if total == 0 {
        return Ok(());
    }
    let b = |v: usize| (v * elem) as u64;
    let (pp, ps, ph) = spec.page_strides;
    let starts = [ptrs.new, ptrs.pages, b(spec.new_strides.0), b(spec.new_strides.1), b(pp), b(ps), b(ph)];
    let width = copy_width(spec.d * elem, &starts);
    if width == 1 {
        return Err(unsupported("paged append: rows must start at even byte offsets"));
    }
    let i64_of = |v: u64| i64::try_from(v).map_err(|_| unsupported("paged append: a stride exceeds i64"));
    let i32_of = |v: usize| i32::try_from(v).map_err(|_| unsupported("paged append: a size exceeds i32"));
    let units_per_row = spec.d * elem / width;
    let n_units = total
        .checked_mul(spec.hkv)
        .and_then(|x| x.checked_mul(units_per_row))
        .ok_or_else(|| unsupported("paged append: too many rows"))?;
    let args = AppendArgs {
        src: ptrs.new,
        pages: ptrs.pages,
        table: ptrs.table,
        rows: ptrs.rows,
        src_token: i64_of(b(spec.new_strides.0))?,
        src_head: i64_of(b(spec.new_strides.1))?,
        page_stride: i64_of(b(pp))?,
        slot_stride: i64_of(b(ps))?,
        head_stride: i64_of(b(ph))?,
        n_units: i64_of(n_units as u64)?,
        units_per_row: i32_of(units_per_row)?,
        hkv: i32_of(spec.hkv)?,
        page_size: i32_of(spec.paging.page_size)?,
        max_pages: i32_of(spec.paging.max_pages)?,
        num_pages: i32_of(spec.paging.num_pages)?,
        reserved: 0,
    };
    // Enough blocks for a few waves; the grid-stride loop takes the rest.
    let blocks = n_units.div_ceil(256).clamp(1, 4096) as u32;
    let dims = LaunchDims { grid: (blocks, 1, 1), block: (256, 1, 1), smem_bytes: 0 };
    let entry = format!("paged_append_{width}");
    // SAFETY: the caller guarantees the buffers (see # Safety); every thread copies `width` bytes inside one
    // row of `new` (token < total, head < Hkv, unit < row bytes / width) to the same bytes of one slot of
    // one page below `num_pages` (clamped), which `pages` holds.
    unsafe { launch(dev, stream, &program(), &entry, dims, &args) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sdpa_core::Paging;

    #[test]
    fn tokens_go_after_each_cached_sequence() {
        let paging = Paging { page_size: 4, num_pages: 8, max_pages: 4 };
        let spec = AppendSpec::new(paging, 2, 8, vec![3, 0, 5], vec![2, 0, 1]);
        assert_eq!(token_rows(&spec).expect("rows"), vec![0, 3, 0, 4, 2, 5]);
    }

    #[test]
    fn copies_are_as_wide_as_the_rows_allow() {
        assert_eq!(copy_width(256, &[0, 4096, 256]), 16);
        assert_eq!(copy_width(80, &[0, 80]), 16);
        assert_eq!(copy_width(40, &[0, 40]), 4);
        assert_eq!(copy_width(6, &[0, 6]), 2);
        assert_eq!(copy_width(256, &[2]), 2);
    }
}
