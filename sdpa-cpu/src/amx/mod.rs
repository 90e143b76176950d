//! The AMX path (`SimdPath::Amx`): bf16 attention with Q·Kᵀ and P·V on Intel's AMX tiles (`TDPBF16PS`),
//! the scale, variants, mask and online softmax on AVX-512 between them.
//!
//! - `tile`: the four tile operations, as instructions (`asm!`: `core::arch`'s AMX intrinsics are not
//!   stable in this toolchain) or as a scalar model that runs anywhere, so the layout is tested on CPUs
//!   without AMX;
//! - `pack`: K and V of a key block into the VNNI pair layout of the B operand (once per key block of an
//!   item, shared by all of its query rows);
//! - `kernel`: the item driver, the same work items, key loop, scratch and row finishing as `fa2`;
//! - `profile`: optional phase counters of the item driver (`SDPA_CPU_AMX_PROFILE=1`), for measurement.
//!
//! Detection ([`status`]): CPUID's AMX-TILE and AMX-BF16, the OS's XCR0 bits for the tile state, and on
//! Linux the permission every process must ask for before touching tile data
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`; the kernel refuses it when, e.g., it predates
//! 5.16). Any refusal makes the path unsupported and its reason is what `sdpa devices` prints; the backend
//! then runs the fastest other path (avx512-bf16). f16 has no AMX kernel here (AMX-FP16 is a later
//! extension): on this path it runs the AVX-512 kernel, as f32 does.

#[cfg(target_arch = "x86_64")]
pub(crate) mod kernel;
#[cfg(target_arch = "x86_64")]
pub(crate) mod pack;
#[cfg(target_arch = "x86_64")]
pub(crate) mod profile;
#[cfg(all(test, target_arch = "x86_64"))]
mod tests;
#[cfg(target_arch = "x86_64")]
pub(crate) mod tile;

use std::sync::OnceLock;

/// Whether this process can run the AMX bf16 kernel, and if not, why. Asked once (the permission request
/// is per process); later calls return the cached answer.
pub fn status() -> Result<(), String> {
    static STATUS: OnceLock<Result<(), String>> = OnceLock::new();
    STATUS.get_or_init(probe).clone()
}

/// Whether the CPU reports AMX-FP16 (f16 tiles), for `sdpa devices`; no kernel uses it yet.
pub fn has_amx_fp16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::__cpuid_count;
        // SAFETY: CPUID exists on every x86-64 CPU; leaf 7 sub-leaf 1 is only read when leaf 7 exists.
        #[allow(unused_unsafe)]
        unsafe {
            max_leaf() >= 7 && (__cpuid_count(7, 1).eax >> 21) & 1 == 1
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(target_arch = "x86_64")]
fn max_leaf() -> u32 {
    // SAFETY: CPUID exists on every x86-64 CPU (newer compilers call it safe, hence the allow).
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::__cpuid(0).eax
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn probe() -> Result<(), String> {
    Err("AMX is an x86-64 extension".to_string())
}

#[cfg(target_arch = "x86_64")]
fn probe() -> Result<(), String> {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    let avx512 = crate::simd::x86::avx512_supported() && crate::simd::x86::avx512bf16_supported();
    if !avx512 {
        return Err("the AMX path also needs AVX-512 with AVX512_BF16 (softmax and P rounding)".to_string());
    }
    if max_leaf() < 7 {
        return Err("the CPU has no AMX (no CPUID leaf 7)".to_string());
    }
    // SAFETY: CPUID exists on every x86-64 CPU and leaf 7 exists (checked above).
    #[allow(unused_unsafe)]
    let (edx7, ecx1) = unsafe { (__cpuid_count(7, 0).edx, __cpuid(1).ecx) };
    let (tile, bf16) = ((edx7 >> 24) & 1 == 1, (edx7 >> 22) & 1 == 1);
    if !tile || !bf16 {
        return Err("the CPU has no AMX-TILE and AMX-BF16".to_string());
    }
    if (ecx1 >> 27) & 1 == 0 {
        return Err("the OS has not enabled XSAVE (OSXSAVE clear), so no AMX state".to_string());
    }
    // SAFETY: OSXSAVE is set (checked above), so XGETBV is available.
    let xcr0 = unsafe { xcr0() };
    if (xcr0 >> 17) & 3 != 3 {
        return Err(format!("the OS has not enabled the AMX tile state (XCR0 = {xcr0:#x}, bits 17 and 18 clear)"));
    }
    request_tile_permission()
}

/// XCR0, the state components the OS saves and restores.
///
/// # Safety
/// CPUID.1:ECX.OSXSAVE must be set.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "xsave")]
unsafe fn xcr0() -> u64 {
    // SAFETY: the caller checked OSXSAVE, which makes XGETBV legal.
    unsafe { std::arch::x86_64::_xgetbv(0) }
}

/// Linux: tile data is off until the process asks (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`,
/// kernel Documentation/arch/x86/xstate.rst); the grant holds for every thread of the process. Checked
/// afterwards with `ARCH_GET_XCOMP_PERM`.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_permission() -> Result<(), String> {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_GET_XCOMP_PERM: u64 = 0x1022;
    const ARCH_REQ_XCOMP_PERM: u64 = 0x1023;
    const XFEATURE_XTILEDATA: u64 = 18;
    let ret: i64;
    // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM takes a feature number and touches no user memory; the
    // syscall instruction clobbers rcx and r11 (declared) and returns in rax.
    unsafe {
        std::arch::asm!("syscall", inlateout("rax") SYS_ARCH_PRCTL => ret, in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA, lateout("rcx") _, lateout("r11") _, options(nostack))
    };
    if ret != 0 {
        let why = match -ret {
            22 => " (EINVAL: the kernel predates 5.16 or does not offer AMX tile data)",
            28 => " (ENOSPC: the signal stack is too small for the AMX state)",
            1 => " (EPERM)",
            _ => "",
        };
        return Err(format!("the kernel refused the AMX permission: arch_prctl(ARCH_REQ_XCOMP_PERM) = {ret}{why}"));
    }
    let mut granted: u64 = 0;
    let ret: i64;
    // SAFETY: ARCH_GET_XCOMP_PERM writes one u64 at the address given, a live local here.
    unsafe {
        std::arch::asm!("syscall", inlateout("rax") SYS_ARCH_PRCTL => ret, in("rdi") ARCH_GET_XCOMP_PERM,
            in("rsi") &mut granted as *mut u64, lateout("rcx") _, lateout("r11") _, options(nostack))
    };
    if ret != 0 || (granted >> XFEATURE_XTILEDATA) & 1 == 0 {
        return Err(format!("the AMX permission was not granted (ARCH_GET_XCOMP_PERM = {ret}, mask {granted:#x})"));
    }
    Ok(())
}

/// Elsewhere the kernel's rules for tile state are unknown to this crate: no AMX.
#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn request_tile_permission() -> Result<(), String> {
    Err("the AMX path asks Linux for the tile-data permission; this OS is not Linux".to_string())
}
