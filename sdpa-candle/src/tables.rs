//! The integer tensors of a serving call read to the host and checked: cumulative offsets (`cu_seqlens`),
//! per-sequence lengths and block tables.
//!
//! They decide how much work there is and where every row lives, so they are read before anything runs
//! (a few hundred bytes) and checked there. They may live on any device, whatever the device of Q, K and V:
//! a server that builds them on the host passes CPU tensors and the call never waits for the GPU; a GPU
//! tensor costs one small device-to-host copy, which waits for the work queued before it. Offsets that
//! go down or a page index outside the pool would make a kernel read or write out of bounds, and no kernel
//! can report that as clearly as the host can. They may be u32 (candle-flash-attn's choice), i32 or i64.

use candle_core::{bail, DType, Result, Tensor};

/// The values of a rank-1 integer tensor, each checked to be a non-negative index that fits u32.
fn indices(name: &str, t: &Tensor) -> Result<Vec<usize>> {
    let values: Vec<i64> = match t.dtype() {
        DType::U32 => t.to_vec1::<u32>()?.into_iter().map(i64::from).collect(),
        DType::I32 => t.to_vec1::<i32>()?.into_iter().map(i64::from).collect(),
        DType::I64 => t.to_vec1::<i64>()?,
        other => bail!("sdpa: {name} must be a u32, i32 or i64 tensor, got {other:?}"),
    };
    values
        .into_iter()
        .enumerate()
        .map(|(i, x)| match u32::try_from(x) {
            Ok(x) => Ok(x as usize),
            Err(_) => bail!("sdpa: {name}[{i}] is {x}, outside 0..=u32::MAX"),
        })
        .collect()
}

/// Cumulative offsets `[0, l0, l0 + l1, ...]` of a `[B + 1]` tensor, checked to start at 0 and never go
/// down; returns the per-sequence lengths (B of them).
pub(crate) fn lengths_from_offsets(name: &str, t: &Tensor) -> Result<Vec<usize>> {
    if t.rank() != 1 {
        bail!("sdpa: {name} must have rank 1 (B + 1 cumulative offsets), got shape {:?}", t.dims());
    }
    let cu = indices(name, t)?;
    if cu.len() < 2 {
        bail!("sdpa: {name} holds {} offsets; it needs B + 1 >= 2 (0, then the end of each sequence)", cu.len());
    }
    if cu[0] != 0 {
        bail!("sdpa: {name} starts at {}; the first offset must be 0", cu[0]);
    }
    if let Some(b) = cu.windows(2).position(|w| w[1] < w[0]) {
        bail!("sdpa: {name} goes down at sequence {b} ({} then {}); offsets must not decrease", cu[b], cu[b + 1]);
    }
    Ok(cu.windows(2).map(|w| w[1] - w[0]).collect())
}

/// Per-sequence lengths of a `[B]` tensor (a paged cache's lengths).
pub(crate) fn lengths(name: &str, t: &Tensor, b: usize) -> Result<Vec<usize>> {
    if t.dims() != [b] {
        bail!("sdpa: {name} must have shape [B] = [{b}] (one length per sequence), got {:?}", t.dims());
    }
    indices(name, t)
}

/// A block table `[B, max_pages]` read to the host, row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BlockTable {
    /// Sequences (rows).
    pub rows: usize,
    /// Columns: the most pages one sequence may own.
    pub max_pages: usize,
    /// `rows × max_pages` page indices.
    pub pages: Vec<u32>,
}

impl BlockTable {
    /// Reads a rank-2 integer tensor. Entries a sequence never reaches may hold anything a u32 holds, but
    /// negative values are refused even there (they mean a caller's bug, e.g. a -1 filler in an i32 table
    /// meant for a kernel that stops at it).
    pub(crate) fn read(t: &Tensor, b: usize) -> Result<Self> {
        let &[rows, max_pages] = t.dims() else {
            bail!("sdpa: the block table must have rank 2 ([B, max_pages]), got shape {:?}", t.dims());
        };
        if rows != b {
            bail!("sdpa: the block table has {rows} rows but the batch has B = {b} sequences");
        }
        let pages = indices("block_table", &t.flatten_all()?)?.into_iter().map(|p| p as u32).collect();
        Ok(BlockTable { rows, max_pages, pages })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn t<T: candle_core::WithDType>(v: &[T]) -> Tensor {
        Tensor::new(v, &Device::Cpu).expect("tensor")
    }

    #[test]
    fn offsets_become_lengths_in_any_integer_dtype() {
        assert_eq!(lengths_from_offsets("cu", &t(&[0u32, 3, 3, 10])).expect("u32"), vec![3, 0, 7]);
        assert_eq!(lengths_from_offsets("cu", &t(&[0i32, 1])).expect("i32"), vec![1]);
        assert_eq!(lengths_from_offsets("cu", &t(&[0i64, 2, 5])).expect("i64"), vec![2, 3]);
    }

    #[test]
    fn bad_offsets_name_their_problem() {
        let err = |x: Tensor| lengths_from_offsets("cu_seqlens_q", &x).expect_err("bad").to_string();
        assert!(err(t(&[0u32, 4, 2])).contains("goes down at sequence 1 (4 then 2)"));
        assert!(err(t(&[1u32, 4])).contains("starts at 1"));
        assert!(err(t(&[0u32])).contains("B + 1 >= 2"));
        assert!(err(t(&[0i64, -3])).contains("cu_seqlens_q[1] is -3"));
        assert!(err(t(&[0f32, 1.0])).contains("u32, i32 or i64"));
        assert!(err(Tensor::zeros((2, 2), DType::U32, &Device::Cpu).expect("zeros")).contains("rank 1"));
    }

    #[test]
    fn block_tables_keep_their_rows_and_refuse_negative_pages() {
        let table = Tensor::new(&[[3u32, 1], [0, u32::MAX]], &Device::Cpu).expect("table");
        let bt = BlockTable::read(&table, 2).expect("read");
        assert_eq!((bt.rows, bt.max_pages, bt.pages), (2, 2, vec![3, 1, 0, u32::MAX]));
        assert!(BlockTable::read(&table, 3).expect_err("rows").to_string().contains("2 rows but the batch has B = 3"));
        let neg = Tensor::new(&[[2i32, -1]], &Device::Cpu).expect("table");
        assert!(BlockTable::read(&neg, 1).expect_err("negative").to_string().contains("is -1"));
        let flat = t(&[1u32, 2]);
        assert!(BlockTable::read(&flat, 1).expect_err("rank").to_string().contains("rank 2"));
    }
}
