//! The peak host memory of one call, on Linux: the process's resident-set high-water mark (`VmHWM`) is reset
//! through `/proc/self/clear_refs` before the call and read after it; the rise over the resident set before
//! the call is the call's peak (its buffers, copies and scratch, on every thread). Memory the allocator kept
//! from earlier calls and hands out again does not raise the resident set, so this is what the call added,
//! not everything it touched. `None` where `/proc` is absent or refuses the reset.

/// A measurement in progress.
#[derive(Debug, Clone, Copy)]
pub struct PeakWatch {
    rss_before: u64,
}

impl PeakWatch {
    /// Resets the high-water mark; `None` when this system cannot.
    pub fn start() -> Option<Self> {
        // "5" resets the peak resident set size to the current one (Linux 4.0 and later).
        std::fs::write("/proc/self/clear_refs", "5").ok()?;
        Some(PeakWatch { rss_before: status_kib("VmRSS:")? * 1024 })
    }

    /// Bytes the resident set rose to above where it was at [`Self::start`].
    pub fn peak_extra_bytes(&self) -> Option<u64> {
        Some((status_kib("VmHWM:")? * 1024).saturating_sub(self.rss_before))
    }
}

/// A `kB` field of `/proc/self/status`.
fn status_kib(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    line[field.len()..].trim().trim_end_matches("kB").trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Touching 64 MiB raises the peak by about that much; where /proc cannot reset it, nothing is claimed.
    #[test]
    fn a_large_allocation_shows_in_the_peak() {
        let Some(w) = PeakWatch::start() else { return };
        let v = vec![1u8; 64 << 20];
        let peak = w.peak_extra_bytes().expect("VmHWM is readable once the reset worked");
        assert!(v.iter().step_by(4096).all(|x| *x == 1));
        assert!(peak >= 60 << 20, "{peak}");
        drop(v);
    }
}
