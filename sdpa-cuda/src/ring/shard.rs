//! Cutting a gathered tensor into the ranks' zigzag shards and putting shards back, on the host: a tensor is
//! `[heads, seq, width]` (BHSD with batch and heads flattened; LSE rows have width 1), and rank `r`'s shard
//! holds, per head, the rows of chunk `r` followed by those of chunk `2N-1-r` ([`RingPlan::chunks_of`]).

use sdpa_core::{HostBuffer, Result, RingPlan, SdpaError};

/// The extent of one operand: `heads` rows of `width` elements per sequence position.
#[derive(Debug, Clone, Copy)]
pub struct Extent {
    /// Batch times heads.
    pub heads: usize,
    /// Elements per row (D, Dv, or 1 for the LSE).
    pub width: usize,
}

fn cut<T: Copy>(src: &[T], plan: &RingPlan, r: usize, e: Extent) -> Vec<T> {
    let mut out = Vec::with_capacity(e.heads * plan.local_len(r) * e.width);
    for h in 0..e.heads {
        let head = &src[h * plan.seq * e.width..(h + 1) * plan.seq * e.width];
        for c in plan.chunks_of(r) {
            out.extend_from_slice(&head[c.start * e.width..c.end * e.width]);
        }
    }
    out
}

fn paste<T: Copy>(dst: &mut [T], part: &[T], plan: &RingPlan, r: usize, e: Extent) {
    let local = plan.local_len(r);
    for h in 0..e.heads {
        let mut at = h * local * e.width;
        for c in plan.chunks_of(r) {
            let n = c.len() * e.width;
            let start = (h * plan.seq + c.start) * e.width;
            dst[start..start + n].copy_from_slice(&part[at..at + n]);
            at += n;
        }
    }
}

fn check_len(what: &'static str, len: usize, needed: usize) -> Result<()> {
    if len < needed {
        return Err(SdpaError::BufferTooShort { name: what, len, needed });
    }
    Ok(())
}

/// Rank `r`'s shard of the gathered `src`.
pub fn shard(src: &HostBuffer, plan: &RingPlan, r: usize, e: Extent) -> Result<HostBuffer> {
    check_len("ring input", src.len(), e.heads * plan.seq * e.width)?;
    Ok(match src {
        HostBuffer::F32(v) => HostBuffer::F32(cut(v, plan, r, e)),
        HostBuffer::F16(v) => HostBuffer::F16(cut(v, plan, r, e)),
        HostBuffer::BF16(v) => HostBuffer::BF16(cut(v, plan, r, e)),
    })
}

/// Writes rank `r`'s shard `part` into its rows of the gathered `dst`.
pub fn unshard(dst: &mut HostBuffer, part: &HostBuffer, plan: &RingPlan, r: usize, e: Extent) -> Result<()> {
    check_len("ring output", dst.len(), e.heads * plan.seq * e.width)?;
    check_len("ring shard", part.len(), e.heads * plan.local_len(r) * e.width)?;
    match (dst, part) {
        (HostBuffer::F32(d), HostBuffer::F32(p)) => paste(d, p, plan, r, e),
        (HostBuffer::F16(d), HostBuffer::F16(p)) => paste(d, p, plan, r, e),
        (HostBuffer::BF16(d), HostBuffer::BF16(p)) => paste(d, p, plan, r, e),
        (d, p) => return Err(SdpaError::DTypeMismatch { name: "ring output", expected: d.dtype(), found: p.dtype() }),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cutting and pasting back gives the tensor again, with a length not divisible by 2N.
    #[test]
    fn shards_paste_back_into_the_gathered_tensor() {
        let plan = RingPlan::new(3, 13).unwrap();
        let e = Extent { heads: 2, width: 3 };
        let src = HostBuffer::F32((0..2 * 13 * 3).map(|x| x as f32).collect());
        let mut back = HostBuffer::F32(vec![-1.0; 2 * 13 * 3]);
        for r in 0..3 {
            let s = shard(&src, &plan, r, e).unwrap();
            assert_eq!(s.len(), 2 * plan.local_len(r) * 3);
            unshard(&mut back, &s, &plan, r, e).unwrap();
        }
        assert_eq!(back, src);
        // Rank 0 holds chunk 0 (rows 0..3) then chunk 5 (rows 11..13) of each head.
        let HostBuffer::F32(s0) = shard(&src, &plan, 0, e).unwrap() else { unreachable!() };
        let rows: Vec<f32> = s0.chunks(3).take(5).map(|row| row[0] / 3.0).collect();
        assert_eq!(rows, vec![0.0, 1.0, 2.0, 11.0, 12.0]);
    }
}
