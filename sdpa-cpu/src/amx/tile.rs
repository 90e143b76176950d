//! The tile unit: the four AMX operations the kernel uses, as real instructions ([`Hardware`]) or as a
//! scalar model of them ([`Emulated`]) that runs on any CPU, so the packing and the driver are tested where
//! AMX is absent.
//!
//! Every tile is configured the same way: 16 rows of 64 bytes (16 f32, or 32 bf16, or 16 bf16 pairs), the
//! largest shape of palette 1. Tiles 0..=3 hold products (C), 4 and 5 the A operand, 6 and 7 the B operand.

use std::arch::asm;

/// Rows of every tile.
pub(crate) const ROWS: usize = 16;
/// Bytes per tile row.
pub(crate) const ROW_BYTES: usize = 64;

/// The tile operations, with tile registers named by const parameters (0..=7).
///
/// # Safety (all methods)
/// Between [`TileUnit::configure`] and [`TileUnit::release`]; pointers address [`ROWS`] rows of
/// [`ROW_BYTES`] bytes at `stride` bytes apart, readable (loads) or writable (stores).
pub(crate) trait TileUnit {
    /// Configures all eight tiles as 16 rows of 64 bytes.
    unsafe fn configure(&mut self);
    /// Returns the tile state to its initial (unconfigured) state.
    unsafe fn release(&mut self);
    /// Zeroes tile `T`.
    unsafe fn zero<const T: u8>(&mut self);
    /// Loads tile `T` from 16 rows at `p`, `stride` bytes apart.
    unsafe fn load<const T: u8>(&mut self, p: *const u8, stride: usize);
    /// Stores tile `T` to 16 rows at `p`, `stride` bytes apart.
    unsafe fn store<const T: u8>(&mut self, p: *mut u8, stride: usize);
    /// `TDPBF16PS`: tile `C` (16 × 16 f32) += tile `A` (16 × 32 bf16) · tile `B` (16 pairs × 16 columns, the
    /// VNNI layout: row `k` holds `(b[2k][n], b[2k+1][n])` for each column `n`).
    unsafe fn dp<const C: u8, const A: u8, const B: u8>(&mut self);
}

/// The 64-byte operand of `LDTILECFG` (palette 1): palette id, start row, then per tile its bytes per row
/// (u16 at byte 16 + 2·t) and its rows (u8 at byte 48 + t).
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn uniform() -> TileConfig {
        let mut c = [0u8; 64];
        c[0] = 1;
        for t in 0..8 {
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&(ROW_BYTES as u16).to_le_bytes());
            c[48 + t] = ROWS as u8;
        }
        TileConfig(c)
    }
}

/// The AMX instructions themselves. Built only where [`super::status`] said AMX-TILE and AMX-BF16 run (CPU
/// and OS permission), which is what makes the `asm!` blocks sound.
#[derive(Debug)]
pub(crate) struct Hardware(());

impl Hardware {
    /// # Safety
    /// The CPU has AMX-TILE and AMX-BF16 and this process holds the permission for the tile data
    /// ([`super::status`] returned `Ok`).
    pub(crate) unsafe fn new() -> Hardware {
        Hardware(())
    }
}

// SAFETY (every asm! block below): the token exists only after the CPU and OS checks (`Hardware::new`); the
// tile registers are named in the instruction text (the tile number is a const generic, so the blocks do not
// declare them as `tmm` clobbers) and nothing else in the program uses them: the compiler never allocates
// them, and no code outside this module issues AMX instructions, so neither the tile data nor the tile
// configuration loaded by `configure` is disturbed by the ordinary calls made between `configure` and
// `release` (the psABI makes tile state caller-saved; that holds because none of those callees use AMX);
// memory operands are the caller's contract on the trait's methods; no stack is touched and no flags change.
impl TileUnit for Hardware {
    #[inline(always)]
    unsafe fn configure(&mut self) {
        let cfg = TileConfig::uniform();
        unsafe { asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly, preserves_flags)) };
    }

    #[inline(always)]
    unsafe fn release(&mut self) {
        unsafe { asm!("tilerelease", options(nostack, nomem, preserves_flags)) };
    }

    #[inline(always)]
    unsafe fn zero<const T: u8>(&mut self) {
        unsafe { asm!("tilezero tmm{t}", t = const T, options(nostack, nomem, preserves_flags)) };
    }

    #[inline(always)]
    unsafe fn load<const T: u8>(&mut self, p: *const u8, stride: usize) {
        unsafe {
            asm!("tileloadd tmm{t}, [{p} + {s}*1]", t = const T, p = in(reg) p, s = in(reg) stride,
                 options(nostack, readonly, preserves_flags))
        };
    }

    #[inline(always)]
    unsafe fn store<const T: u8>(&mut self, p: *mut u8, stride: usize) {
        unsafe {
            asm!("tilestored [{p} + {s}*1], tmm{t}", t = const T, p = in(reg) p, s = in(reg) stride,
                 options(nostack, preserves_flags))
        };
    }

    #[inline(always)]
    unsafe fn dp<const C: u8, const A: u8, const B: u8>(&mut self) {
        unsafe {
            asm!("tdpbf16ps tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B,
                 options(nostack, nomem, preserves_flags))
        };
    }
}

/// A scalar model of the tile unit: eight 1 KiB tiles in memory, `TDPBF16PS` as its definition (each
/// output lane adds the two products of a pair to its f32 accumulator). Slow; for tests on CPUs without AMX.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct Emulated {
    tiles: Box<[[u32; ROWS * ROW_BYTES / 4]; 8]>,
    configured: bool,
}

#[cfg(test)]
impl Emulated {
    pub(crate) fn new() -> Emulated {
        Emulated { tiles: Box::new([[0; ROWS * ROW_BYTES / 4]; 8]), configured: false }
    }

    fn tile(&mut self, t: u8) -> &mut [u32; ROWS * ROW_BYTES / 4] {
        assert!(self.configured, "tile {t} used outside configure .. release");
        &mut self.tiles[t as usize]
    }
}

#[cfg(test)]
fn bf16_lo(x: u32) -> f32 {
    f32::from_bits(x << 16)
}

#[cfg(test)]
fn bf16_hi(x: u32) -> f32 {
    f32::from_bits(x & 0xFFFF_0000)
}

#[cfg(test)]
impl TileUnit for Emulated {
    unsafe fn configure(&mut self) {
        self.configured = true;
    }

    unsafe fn release(&mut self) {
        self.configured = false;
        self.tiles.iter_mut().for_each(|t| t.fill(0));
    }

    unsafe fn zero<const T: u8>(&mut self) {
        self.tile(T).fill(0);
    }

    unsafe fn load<const T: u8>(&mut self, p: *const u8, stride: usize) {
        let t = self.tile(T);
        for r in 0..ROWS {
            for w in 0..ROW_BYTES / 4 {
                // SAFETY: the trait's contract (16 rows of 64 bytes at `stride`).
                t[r * 16 + w] = unsafe { p.add(r * stride + 4 * w).cast::<u32>().read_unaligned() };
            }
        }
    }

    unsafe fn store<const T: u8>(&mut self, p: *mut u8, stride: usize) {
        let t = *self.tile(T);
        for r in 0..ROWS {
            for w in 0..ROW_BYTES / 4 {
                // SAFETY: the trait's contract.
                unsafe { p.add(r * stride + 4 * w).cast::<u32>().write_unaligned(t[r * 16 + w]) };
            }
        }
    }

    unsafe fn dp<const C: u8, const A: u8, const B: u8>(&mut self) {
        let (a, b) = (*self.tile(A), *self.tile(B));
        let c = self.tile(C);
        for m in 0..ROWS {
            for n in 0..16 {
                let mut acc = f32::from_bits(c[m * 16 + n]);
                for k in 0..16 {
                    let (x, y) = (a[m * 16 + k], b[k * 16 + n]);
                    acc += bf16_lo(x) * bf16_lo(y) + bf16_hi(x) * bf16_hi(y);
                }
                c[m * 16 + n] = acc.to_bits();
            }
        }
    }
}
