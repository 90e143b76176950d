//! Memory a call needs, checked before anything is allocated: what the host has ([`host_available`]), the
//! bytes of a spec's operands ([`OperandBytes`]), a clear error when a request cannot fit
//! ([`SdpaError::InsufficientMemory`]), and vectors reserved fallibly ([`try_filled`]) so an allocation
//! that still fails is an error, not an abort.

use crate::error::{Result, SdpaError};
use crate::spec::{AttentionSpec, Mask, Operand};

/// Bytes the host can still give this process: `MemAvailable` from `/proc/meminfo`, lowered to the
/// cgroup v2 limit's headroom when the process runs in a container with a limit. `None` where neither is
/// readable (not Linux): callers then rely on fallible allocation alone.
pub fn host_available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    });
    let read = |p: &str| std::fs::read_to_string(p).ok().and_then(|s| s.trim().parse::<u64>().ok());
    let cgroup = match (read("/sys/fs/cgroup/memory.max"), read("/sys/fs/cgroup/memory.current")) {
        (Some(max), Some(cur)) => Some(max.saturating_sub(cur)),
        _ => None,
    };
    match (meminfo, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `bytes` as a short human size (`512 B`, `3.0 MiB`, `64.0 GiB`).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = bytes as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{x:.1} {}", UNITS[u])
    }
}

/// Fails with [`SdpaError::InsufficientMemory`] when `needed` bytes exceed what the host has available.
pub fn check_host(needed: u64, what: &str) -> Result<()> {
    match host_available() {
        Some(available) if needed > available => {
            Err(SdpaError::InsufficientMemory { what: what.to_string(), needed, available, place: "the host" })
        }
        _ => Ok(()),
    }
}

/// A vector of `len` copies of `value`, reserved fallibly: an allocation the allocator refuses is an
/// [`SdpaError::InsufficientMemory`] naming `what`, instead of a process abort.
pub fn try_filled<T: Clone>(len: usize, value: T, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    let bytes = (len as u64).saturating_mul(std::mem::size_of::<T>() as u64);
    v.try_reserve_exact(len).map_err(|_| SdpaError::InsufficientMemory {
        what: what.to_string(),
        needed: bytes,
        available: host_available().unwrap_or(0),
        place: "the host",
    })?;
    v.resize(len, value);
    Ok(v)
}

/// Bytes of each buffer of one call at the spec's element size (the mask and LSE in f32, as backends
/// take them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OperandBytes {
    /// Q.
    pub q: u64,
    /// K.
    pub k: u64,
    /// V.
    pub v: u64,
    /// O.
    pub o: u64,
    /// The explicit mask, 0 without one.
    pub mask: u64,
    /// The LSE output.
    pub lse: u64,
    /// A paged cache's block table (`u32` per entry), 0 without one.
    pub block_table: u64,
}

impl OperandBytes {
    /// The sizes for `spec` (checked arithmetic; the spec need not be validated first).
    pub fn of(spec: &AttentionSpec) -> Result<Self> {
        let bytes = |op: Operand| -> Result<u64> {
            // O is stored in the output dtype (bf16 for FP8 inputs).
            let dtype = if op == Operand::O { spec.out_dtype() } else { spec.dtype };
            (spec.required_len(op)? as u64)
                .checked_mul(dtype.size_bytes() as u64)
                .ok_or_else(|| SdpaError::overflow(format!("bytes of {}", op.name())))
        };
        let f32_bytes = |n: usize, what: &str| (n as u64).checked_mul(4).ok_or_else(|| SdpaError::overflow(what));
        let mask = match &spec.mask {
            Mask::Explicit(m) => f32_bytes(m.len()?, "bytes of the mask")?,
            _ => 0,
        };
        Ok(OperandBytes {
            q: bytes(Operand::Q)?,
            k: bytes(Operand::K)?,
            v: bytes(Operand::V)?,
            o: bytes(Operand::O)?,
            mask,
            lse: f32_bytes(spec.lse_len()?, "bytes of lse")?,
            block_table: match spec.ragged.as_ref().and_then(|r| r.pages.map(|p| (r.batch(), p.max_pages))) {
                Some((b, cols)) => b
                    .checked_mul(cols)
                    .and_then(|n| (n as u64).checked_mul(4))
                    .ok_or_else(|| SdpaError::overflow("bytes of the block table"))?,
                None => 0,
            },
        })
    }

    /// Q, K, V and the mask: what a caller's inputs hold.
    pub fn inputs(&self) -> u64 {
        self.q.saturating_add(self.k).saturating_add(self.v).saturating_add(self.mask).saturating_add(self.block_table)
    }

    /// Inputs, output and LSE: one call's buffers.
    pub fn all(&self) -> u64 {
        self.inputs().saturating_add(self.o).saturating_add(self.lse)
    }

    /// The largest single buffer and its name, for an error that says which one does not fit.
    pub fn largest(&self) -> (&'static str, u64) {
        [("Q", self.q), ("K", self.k), ("V", self.v), ("O", self.o), ("the mask", self.mask), ("LSE", self.lse)]
            .into_iter()
            .fold(("Q", 0), |best, x| if x.1 > best.1 { x } else { best })
    }
}

/// Host bytes one call through [`crate::HostBackend`] holds on a backend whose buffers live in host memory
/// (uploads are copies there): the uploaded inputs, the output (and LSE when asked for), and the output's
/// download.
pub fn host_call_bytes(spec: &AttentionSpec, lse: bool) -> Result<u64> {
    let b = OperandBytes::of(spec)?;
    let lse = if lse { b.lse } else { 0 };
    Ok(b.inputs().saturating_add(b.o.saturating_mul(2)).saturating_add(lse))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Shape};

    #[test]
    fn sizes_read_like_people_write_them() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
        assert_eq!(human_bytes(64 << 30), "64.0 GiB");
    }

    #[test]
    fn operand_bytes_count_the_dtype_and_the_kv_heads() {
        let spec = AttentionSpec::new(Shape { hkv: 2, ..Shape::new(2, 8, 10, 20, 64) }, DType::BF16);
        let b = OperandBytes::of(&spec).unwrap();
        let (q, kv) = (2 * 8 * 10 * 64 * 2, 2 * 2 * 20 * 64 * 2);
        assert_eq!((b.q, b.k, b.v, b.o, b.mask), (q, kv, kv, q, 0));
        assert_eq!(b.lse, 2 * 8 * 10 * 4);
        assert_eq!(b.largest(), ("Q", b.q));
    }

    #[test]
    fn a_refused_reservation_is_an_error_not_an_abort() {
        // isize::MAX bytes can never be reserved: the allocator refuses before touching memory.
        let err = try_filled(usize::MAX / 2, 0u16, "a test buffer").unwrap_err();
        assert!(matches!(err, SdpaError::InsufficientMemory { .. }), "{err}");
        assert!(err.to_string().contains("a test buffer"), "{err}");
    }
}
