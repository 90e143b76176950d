//! Phase counters of the AMX item kernel, for measurement only: with `SDPA_CPU_AMX_PROFILE=1` (read once)
//! each item adds the time-stamp-counter ticks of its phases (packing K and V, Q·Kᵀ on tiles, the vector
//! softmax with the output rescale, P·V on tiles) to process-wide totals, and each `fa2`/`splitkv` call on
//! the AMX path prints their shares to stderr and starts afresh. Off (the default), each phase costs one
//! predictable branch.
//!
//! A lap ends with `lfence` before `rdtsc`, so it waits for the phase's instructions to finish: the
//! counters see each phase whole, and the overlap the out-of-order core would find between a phase's tile
//! work and the next phase's vector work is lost while they run (profiled calls are slower; their shares,
//! not their totals, are the reading).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The phases of a key block, in the order a block runs them.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Phase {
    Pack = 0,
    Scores = 1,
    Softmax = 2,
    Pv = 3,
}

const NAMES: [&str; 4] = ["pack K/V", "Q·Kᵀ tiles", "softmax + rescale", "P·V tiles"];

static TICKS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
static ITEMS: AtomicU64 = AtomicU64::new(0);

/// Whether `SDPA_CPU_AMX_PROFILE=1` was set when first asked.
pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("SDPA_CPU_AMX_PROFILE").is_ok_and(|v| v == "1"))
}

fn now() -> u64 {
    // SAFETY: LFENCE and RDTSC exist on every x86-64 CPU (newer compilers call them safe, hence the allow).
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::_mm_lfence();
        std::arch::x86_64::_rdtsc()
    }
}

/// One item's laps, added to the totals when it is dropped.
pub(crate) struct Laps {
    on: bool,
    last: u64,
    ticks: [u64; 4],
}

impl Laps {
    /// Starts timing (a no-op unless [`enabled`]).
    pub(crate) fn start() -> Laps {
        let on = enabled();
        Laps { on, last: if on { now() } else { 0 }, ticks: [0; 4] }
    }

    /// Charges the ticks since the last lap to `phase`.
    #[inline(always)]
    pub(crate) fn lap(&mut self, phase: Phase) {
        if self.on {
            let t = now();
            self.ticks[phase as usize] += t.wrapping_sub(self.last);
            self.last = t;
        }
    }
}

impl Drop for Laps {
    fn drop(&mut self) {
        if self.on {
            for (total, &t) in TICKS.iter().zip(&self.ticks) {
                total.fetch_add(t, Ordering::Relaxed);
            }
            ITEMS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Prints the totals since the last report as shares of their sum, then clears them (nothing unless
/// [`enabled`] and some item ran).
pub(crate) fn report() {
    if !enabled() {
        return;
    }
    let ticks: Vec<u64> = TICKS.iter().map(|t| t.swap(0, Ordering::Relaxed)).collect();
    let items = ITEMS.swap(0, Ordering::Relaxed);
    let sum: u64 = ticks.iter().sum();
    if items == 0 || sum == 0 {
        return;
    }
    let shares: Vec<String> =
        NAMES.iter().zip(&ticks).map(|(n, &t)| format!("{n} {:.1} %", 100.0 * t as f64 / sum as f64)).collect();
    eprintln!("sdpa-cpu amx profile: {items} items, {sum} ticks (all threads): {}", shares.join(", "));
}
