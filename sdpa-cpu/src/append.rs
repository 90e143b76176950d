//! The "write to cache" step of a server on the CPU: new K or V rows copied into the slots after each
//! sequence's cached tokens, in parallel over rows (sdpa-core's `append_to_pages` is the serial
//! definition; this one gives the same pages).

use crate::problem::SharedMut;
use rayon::prelude::*;
use sdpa_core::{AppendSpec, Result};

/// Rows per parallel task: a few KiB each, so small appends do not pay for many tasks.
const ROWS_PER_TASK: usize = 64;

/// Copies the packed new rows `new` (`[total_new, Hkv, D]` by `spec.new_strides`) into `pages`
/// (`spec.page_strides`) after each sequence's `cache_lens[b]` tokens, through the block table `table`
/// (`[B, max_pages]`). Validates first (lengths, room in the pages, the table) and changes nothing when
/// anything is wrong. Rows are copied in parallel on the current rayon pool; when two rows would land on
/// overlapping slots (a page shared by two sequences that both grow, or strides that overlap) the copies
/// run one after another in order, so the last one wins as in sdpa-core's serial definition.
pub fn append_to_pages<T: Copy + Send + Sync>(
    spec: &AppendSpec,
    table: &[u32],
    new: &[T],
    pages: &mut [T],
) -> Result<()> {
    spec.validate(table, new.len(), pages.len())?;
    let d = spec.d;
    let copies: Vec<(usize, usize)> = spec.row_copies(table).collect();
    let mut dst: Vec<usize> = copies.iter().map(|&(_, t)| t).collect();
    dst.sort_unstable();
    if dst.windows(2).any(|w| w[1] - w[0] < d) {
        for &(src, to) in &copies {
            pages[to..to + d].copy_from_slice(&new[src..src + d]);
        }
        return Ok(());
    }
    let out = SharedMut(pages.as_mut_ptr());
    copies.par_chunks(ROWS_PER_TASK).for_each(|chunk| {
        for &(src, to) in chunk {
            // SAFETY: validation put every destination row (d elements from `to`) inside `pages`, and the
            // check above showed that no two rows overlap, so each element has one writer.
            let row = unsafe { std::slice::from_raw_parts_mut(out.ptr().add(to), d) };
            row.copy_from_slice(&new[src..src + d]);
        }
    });
    Ok(())
}
