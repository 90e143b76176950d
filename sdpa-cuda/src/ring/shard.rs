//! Cutting a gathered tensor into the ranks' zigzag shards and putting shards back, on the host: a tensor is
//! `[heads, seq, width]` (BHSD with batch and heads flattened; LSE rows have width 1), and rank `r`'s shard
//! holds, per head, the rows of chunk `r` followed by those of chunk `2N-1-r` ([`RingPlan::chunks_of`]).
//! [`fingerprint`] names a host tensor's contents, so a call on the same inputs reuses the shards already on
//! the GPUs instead of cutting and uploading them again.

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
        HostBuffer::F8E4M3(v) => HostBuffer::F8E4M3(cut(v, plan, r, e)),
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
        (HostBuffer::F8E4M3(d), HostBuffer::F8E4M3(p)) => paste(d, p, plan, r, e),
        (d, p) => return Err(SdpaError::DTypeMismatch { name: "ring output", expected: d.dtype(), found: p.dtype() }),
    }
    Ok(())
}

/// A 64-bit fingerprint of a host tensor's dtype, length and bits, computed on several threads (a few
/// hundred milliseconds for gigabytes). Each step of the per-chunk chain, `h -> rotl((h ^ w) * K, 29)` with
/// `K` odd, is a bijection of `h` for a fixed word `w`, so tensors that differ in one 64-bit word always get
/// different fingerprints; tensors that differ in several collide with probability about 2^-64.
pub fn fingerprint(buf: &HostBuffer) -> u64 {
    match buf {
        HostBuffer::F32(v) => chain_parallel(v, |x| u64::from(x.to_bits()), 2, 0x32),
        HostBuffer::F16(v) => chain_parallel(v, |x| u64::from(x.to_bits()), 4, 0x16),
        HostBuffer::BF16(v) => chain_parallel(v, |x| u64::from(x.to_bits()), 4, 0xb16),
        HostBuffer::F8E4M3(v) => chain_parallel(v, u64::from, 8, 0xe4),
    }
}

const K: u64 = 0x9e37_79b9_7f4a_7c15;

fn step(h: u64, w: u64) -> u64 {
    ((h ^ w).wrapping_mul(K)).rotate_left(29)
}

/// Chains the words of `per_word` elements of `bits` bits' packing over `v`, chunk by chunk on threads, then
/// chains the chunks' values with the length and a dtype tag.
fn chain_parallel<T: Copy + Sync>(v: &[T], bits: fn(T) -> u64, per_word: usize, tag: u64) -> u64 {
    const CHUNK: usize = 1 << 24;
    let width = 64 / per_word as u32;
    let chain = |part: &[T]| {
        part.chunks(per_word).fold(K, |h, w| step(h, w.iter().fold(0u64, |acc, &x| (acc << width) | bits(x))))
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(16);
    let chunks: Vec<&[T]> = v.chunks(CHUNK).collect();
    let per_thread = chunks.len().div_ceil(threads).max(1);
    let hashes: Vec<u64> = std::thread::scope(|scope| {
        let handles: Vec<_> = chunks
            .chunks(per_thread)
            .map(|group| scope.spawn(move || group.iter().map(|c| chain(c)).collect::<Vec<u64>>()))
            .collect();
        // A thread that panicked (it cannot: plain arithmetic) would give a value no other input gives.
        handles.into_iter().flat_map(|h| h.join().unwrap_or_else(|_| vec![u64::MAX])).collect()
    });
    hashes.into_iter().fold(step(tag, v.len() as u64), step)
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

    /// Equal tensors share a fingerprint; one changed element, another length or another dtype of the same
    /// bits does not.
    #[test]
    fn fingerprints_tell_contents_apart() {
        let a: Vec<half::bf16> = (0..100_003).map(|i| half::bf16::from_f32((i % 97) as f32)).collect();
        let mut b = a.clone();
        assert_eq!(fingerprint(&HostBuffer::BF16(a.clone())), fingerprint(&HostBuffer::BF16(b.clone())));
        b[77_777] = half::bf16::from_f32(-1.0);
        assert_ne!(fingerprint(&HostBuffer::BF16(a.clone())), fingerprint(&HostBuffer::BF16(b)));
        assert_ne!(fingerprint(&HostBuffer::BF16(a.clone())), fingerprint(&HostBuffer::BF16(a[1..].to_vec())));
        let same_bits: Vec<half::f16> = a.iter().map(|x| half::f16::from_bits(x.to_bits())).collect();
        assert_ne!(fingerprint(&HostBuffer::BF16(a)), fingerprint(&HostBuffer::F16(same_bits)));
    }
}
