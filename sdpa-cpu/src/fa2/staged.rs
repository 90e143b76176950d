//! A kv head's K and V rows staged as aligned f32 in the worker's scratch, once, where the item kernel would
//! otherwise widen or copy the same key tiles again in every work item of that head.
//!
//! An item of [`super::process`] walks the keys its rows see, and each kv head's keys are walked by every
//! row tile of that head (`group · Sq / br` of them). Where a tile cannot be read in place (bf16 and f16
//! inputs, which the f32 micro-kernels widen; f32 V rows a multiple of 512 bytes apart on AVX2, copied into
//! the aligned scratch: `super::copies_v`), each of those items repeated the widening or the copy. Staged,
//! a worker widens a head's rows once for all of its items of that head (consecutive items share their head:
//! they are ordered by head, and each worker takes runs of them), and reads them in place: already f32, and
//! with every V row on a 32-byte boundary, which is what the AVX2 copy was for (a `Vec` from the allocator
//! starts 16 bytes off a cache line, so half of the 32-byte loads of a V row read in place straddle two
//! lines).
//!
//! The staging sits in the worker's scratch and is kept from item to item and from call to call (a fresh
//! buffer per call paid a page fault per 4 KiB: 8 % of an in-cache bf16 call), so it is bounded per worker:
//! [`MAX_HEAD_BYTES`]. A head's rows are staged as the items reach them (a causal item reaches the head's
//! first keys only), and the staging belongs to one call ([`StagePlan::call`]): the next call's inputs may be
//! other data at the same address.
//!
//! Staged where it pays and fits ([`plan`]): keys not in pages, on the item kernel's paths (AVX2 and AVX-512;
//! the AMX and AVX512_BF16 kernels read bf16 in place), at least [`MIN_ITEMS_PER_KV_HEAD`] row tiles per kv
//! head, a head within [`MAX_HEAD_BYTES`]. Where an allocation fails the items widen tile by tile as before;
//! the result is the same bit for bit either way (the staged values are the inputs' exact f32 values, and the
//! micro-kernels read them in the same order).

use super::{copies_v, row_tile_count, uses_amx, uses_pairs, Tiles};
use crate::aligned::Aligned;
use crate::element::{widen_with, CpuElement};
use crate::problem::{round_up, Problem};
use crate::simd::{Simd, SimdPath};
use std::sync::atomic::{AtomicU64, Ordering};

/// Row tiles per kv head from which staging pays: a worker then widens a head's rows once for several of its
/// items instead of once per item.
pub(crate) const MIN_ITEMS_PER_KV_HEAD: usize = 4;

/// Most bytes one worker stages (one kv head's K and V rows), and keeps between calls: 16 MiB holds
/// D = Dv = 128 at 16k keys. Longer heads widen tile by tile as before.
pub(crate) const MAX_HEAD_BYTES: usize = 16 << 20;

/// What a call stages: its K rows, its V rows, under the call's number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StagePlan {
    pub k: bool,
    pub v: bool,
    /// Distinct for every call that stages (`next_call`), so that no call reads another's staging.
    pub call: u64,
}

/// A number no earlier call took.
pub(crate) fn next_call() -> u64 {
    static CALLS: AtomicU64 = AtomicU64::new(1);
    CALLS.fetch_add(1, Ordering::Relaxed)
}

/// What the items of `p` stage on `path` with `tiles` (`call`: [`next_call`]), if anything.
pub(crate) fn plan<T: CpuElement>(p: &Problem<'_, T>, path: SimdPath, tiles: Tiles, call: u64) -> Option<StagePlan> {
    let k = T::as_f32(p.k).is_none();
    let v = T::as_f32(p.v).is_none() || copies_v(p, path);
    let kernel = matches!(path, SimdPath::Avx2 | SimdPath::Avx512 | SimdPath::Avx512Bf16 | SimdPath::Amx)
        && !uses_amx(p, path)
        && !uses_pairs(p, path);
    let enough = row_tile_count(p, tiles.br) >= MIN_ITEMS_PER_KV_HEAD * (p.b * p.hkv()).max(1);
    let fits = head_fits(p.sk, p.d, p.dv, super::lanes(path));
    (!switched_off() && (k || v) && kernel && p.pages.is_none() && enough && fits).then_some(StagePlan { k, v, call })
}

/// The call's problems with their staging planned ([`plan`]), under one new call number.
pub(crate) fn planned<'a, T: CpuElement>(ps: &[Problem<'a, T>], path: SimdPath, tiles: Tiles) -> Vec<Problem<'a, T>> {
    let call = next_call();
    ps.iter().map(|p| Problem { stage: plan(p, path, tiles, call), ..p.clone() }).collect()
}

/// Whether one head's staging fits [`MAX_HEAD_BYTES`].
fn head_fits(sk: usize, d: usize, dv: usize, lanes: usize) -> bool {
    head_bytes(sk, d, dv, lanes).is_some_and(|n| n <= MAX_HEAD_BYTES)
}

/// Bytes of one head's staging: `sk` K rows at stride `d`, then (from a 64-byte boundary) `sk` V rows at
/// stride `dv` rounded up to `lanes`.
fn head_bytes(sk: usize, d: usize, dv: usize, lanes: usize) -> Option<usize> {
    let floats = round_up(sk.checked_mul(d)?, 16).checked_add(sk.checked_mul(round_up(dv, lanes))?)?;
    floats.checked_mul(4)
}

/// Most bytes a worker may hold for a call of these head dims and keys (the backend's memory estimate):
/// its staging where one head fits [`MAX_HEAD_BYTES`] (16 lanes, the widest rounding), else none.
pub(crate) fn worker_bytes(sk: usize, d: usize, dv: usize) -> u64 {
    head_bytes(sk, d, dv, 16).filter(|&n| n <= MAX_HEAD_BYTES).map_or(0, |n| n as u64)
}

/// `SDPA_CPU_STAGE=0`: a measurement switch (read once) that keeps every call on the per-tile widening and
/// copies, for an A/B on one machine. The unit tests flip [`tests::UNSTAGED`] instead.
fn switched_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    #[cfg(test)]
    if tests::UNSTAGED.load(Ordering::Relaxed) {
        return true;
    }
    *OFF.get_or_init(|| std::env::var("SDPA_CPU_STAGE").is_ok_and(|v| v.trim() == "0"))
}

/// A worker's staged head: keys `lo..hi` of kv head `kvh` (batch `b`) of one call's problem, at their own
/// positions (key `j` at row `j`).
#[derive(Debug, Default)]
pub(crate) struct HeadStage {
    buf: Option<Aligned<f32>>,
    /// (call, the problem's K address, batch, kv head) of the rows held; `None`: nothing held.
    owner: Option<(u64, usize, usize, usize)>,
    lo: usize,
    hi: usize,
}

/// Staged rows of a head, from its key 0: K at `k` with row stride `ks`, V at `v` with row stride `vs`
/// (`None`: that operand is not staged and reads as before).
#[derive(Debug, Clone, Copy)]
pub(crate) struct StagedRows {
    pub k: Option<*const f32>,
    pub ks: usize,
    pub v: Option<*const f32>,
    pub vs: usize,
}

impl HeadStage {
    /// Keys `lo..hi` of kv head `kvh` of batch `b` of `p`, staged as `plan` says (widening what this worker
    /// holds no copy of yet); `None` when the buffer cannot be had.
    pub(crate) fn rows<S: Simd, T: CpuElement>(
        &mut self,
        s: S,
        p: &Problem<'_, T>,
        plan: StagePlan,
        b: usize,
        kvh: usize,
        lo: usize,
        hi: usize,
    ) -> Option<StagedRows> {
        let lanes = S::LANES;
        let (d, dv) = (p.d, p.dv);
        let dvp = round_up(dv, lanes);
        let voff = round_up(p.sk * d, 16);
        let need = voff + p.sk * dvp;
        if self.buf.as_ref().is_none_or(|b| b.len() < need) {
            self.owner = None;
            self.buf = None;
            self.buf = Some(Aligned::try_new(need)?);
        }
        let owner = (plan.call, p.k.as_ptr() as usize, b, kvh);
        if self.owner != Some(owner) {
            self.owner = Some(owner);
            (self.lo, self.hi) = (lo, lo);
        }
        let buf = self.buf.as_mut()?;
        // Widen what `lo..hi` adds to the rows held (the hull: a gap between them is widened too, at most
        // the head once).
        let (new_lo, new_hi) = (lo.min(self.lo), hi.max(self.hi));
        #[cfg(test)]
        tests::STAGED_ROWS.fetch_add(self.lo - new_lo + new_hi - self.hi, Ordering::Relaxed);
        for range in [new_lo..self.lo, self.hi..new_hi] {
            for j in range {
                if plan.k {
                    widen_with(s, p.k, p.k_row(b, kvh, j), &mut buf[j * d..(j + 1) * d]);
                }
                if plan.v {
                    let row = voff + j * dvp;
                    widen_with(s, p.v, p.v_row(b, kvh, j), &mut buf[row..row + dv]);
                }
            }
        }
        (self.lo, self.hi) = (new_lo, new_hi);
        let base = buf.as_ptr();
        Some(StagedRows {
            k: plan.k.then_some(base),
            ks: d,
            // SAFETY (the offset): voff < need <= the buffer's length.
            v: plan.v.then(|| unsafe { base.add(voff) }),
            vs: dvp,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::{head_fits, plan, switched_off, worker_bytes, StagePlan, MAX_HEAD_BYTES};
    use crate::fa2::tests::assert_same_output;
    use crate::fa2::Tiles;
    use crate::problem::Problem;
    use crate::{supported_paths, CpuBackend, SimdPath};
    use half::bf16;
    use sdpa_core::{
        AttentionSpec, DType, HostBackend, HostBuffer, HostInputs, Kernel, Layout, Mask, RunOptions, Shape,
    };
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// Set by [`staging_changes_no_bit`] while it runs the unstaged side (other tests running meanwhile then
    /// run unstaged too, which is what the test shows to be the same).
    pub(crate) static UNSTAGED: AtomicBool = AtomicBool::new(false);
    /// Rows widened into a staging so far, by any test: shows that the shapes reach it.
    pub(crate) static STAGED_ROWS: AtomicUsize = AtomicUsize::new(0);

    /// Restores staging even when a run panics, so that no other test loses it.
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            UNSTAGED.store(false, Ordering::Relaxed);
        }
    }

    /// Staged and unstaged calls agree bit for bit (O and LSE), on shapes that stage on every vector path:
    /// f32 V rows 512 bytes apart on AVX2 in both layouts (D = 128 head-major, D = 64 x 2 kv heads
    /// sequence-major), bf16 and f16 with an odd head dim (so bf16 stays off the AVX512_BF16 and AMX kernels)
    /// and Dv != D (P·V transposed on AVX-512), GQA 4, Sq != Sk both ways, both causal alignments, `fa2` and
    /// `splitkv`, two threads. The reference tests (`tests/correctness.rs`) run staged by default.
    #[test]
    fn staging_changes_no_bit() {
        if switched_off() {
            eprintln!("skipped: SDPA_CPU_STAGE=0 in the environment keeps every call unstaged");
            return;
        }
        let cases = [
            (Shape { b: 1, hq: 2, hkv: 2, sq: 300, sk: 333, d: 128, dv: 128 }, Layout::Bhsd),
            (Shape { b: 2, hq: 4, hkv: 1, sq: 97, sk: 260, d: 33, dv: 24 }, Layout::Bhsd),
            (Shape { b: 1, hq: 8, hkv: 2, sq: 130, sk: 77, d: 64, dv: 64 }, Layout::Bshd),
        ];
        let mut checked = 0;
        for path in supported_paths().into_iter().filter(|&p| p != SimdPath::Scalar) {
            let be = CpuBackend::with_simd(path, Some(2)).expect("a supported path builds");
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                let before = STAGED_ROWS.load(Ordering::Relaxed);
                for (shape, layout) in cases {
                    for mask in [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight] {
                        for kernel in [Kernel::Fa2, Kernel::SplitKv] {
                            let spec = AttentionSpec::new(shape, dtype).with_layout(layout).with_mask(mask);
                            let inputs = HostInputs::random(&spec, 31).expect("valid spec");
                            let opts = RunOptions { kernel, lse: true, ..Default::default() };
                            let label = format!("{path} {dtype} {shape} {layout:?} {mask:?} {kernel}");
                            let run = |unstaged: bool| {
                                UNSTAGED.store(unstaged, Ordering::Relaxed);
                                let _restore = Restore;
                                be.run_host(&spec, &opts, &inputs).unwrap_or_else(|e| panic!("{label}: {e}")).output
                            };
                            let (a, b) = (run(false), run(true));
                            // Every bit: -0 and NaN (the poison of an element left unwritten) included.
                            assert_same_output(&label, &a, &b, |u, v| u.to_bits() == v.to_bits());
                            checked += 1;
                        }
                    }
                }
                // bf16 and f16 stage on every path here (the odd head dim); f32 only on AVX2, whose V copies
                // the first and third shapes reach.
                let staged = STAGED_ROWS.load(Ordering::Relaxed) > before;
                assert!(
                    staged || (dtype == DType::F32 && path != SimdPath::Avx2),
                    "{path} {dtype}: nothing was staged"
                );
            }
        }
        assert!(checked >= 18 || supported_paths().len() == 1, "{checked}");
    }

    /// A call never reads rows an earlier call staged from the same buffer: the second call, on K and V
    /// changed in place (same addresses, same worker and scratch), matches the same call on fresh buffers.
    #[test]
    fn a_call_never_reads_an_earlier_calls_staging() {
        let Some(&path) = supported_paths().iter().find(|&&p| p != SimdPath::Scalar) else {
            eprintln!("skipped: no vector path on this CPU");
            return;
        };
        let spec = AttentionSpec::new(Shape { b: 1, hq: 2, hkv: 1, sq: 260, sk: 200, d: 33, dv: 33 }, DType::BF16);
        let opts = RunOptions { kernel: Kernel::Fa2, ..Default::default() };
        // One thread: both calls run on the same worker, whose scratch keeps the staging.
        let be = CpuBackend::with_simd(path, Some(1)).expect("a supported path builds");
        let mut inputs = HostInputs::random(&spec, 5).expect("valid spec");
        let before = STAGED_ROWS.load(Ordering::Relaxed);
        let _first = be.run_host(&spec, &opts, &inputs).expect("runs");
        assert!(STAGED_ROWS.load(Ordering::Relaxed) > before || switched_off(), "the first call staged nothing");
        for buf in [&mut inputs.k, &mut inputs.v] {
            let HostBuffer::BF16(x) = buf else { panic!("bf16 inputs") };
            x.iter_mut().enumerate().for_each(|(i, e)| *e = bf16::from_f32(e.to_f32() * -0.5 + (i % 7) as f32 * 0.25));
        }
        let second = be.run_host(&spec, &opts, &inputs).expect("runs").output.o.to_f32_vec();
        let fresh =
            HostInputs { k: inputs.k.clone(), v: inputs.v.clone(), q: inputs.q.clone(), mask: None, block_table: None };
        let want = be.run_host(&spec, &opts, &fresh).expect("runs").output.o.to_f32_vec();
        assert!(second.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "stale staged rows were read");
    }

    /// The plan: what the items would widen or copy, where each kv head has enough row tiles and fits.
    #[test]
    fn plan_stages_what_items_would_widen_where_it_pays() {
        let tiles = Tiles { br: 48, bc: 64 };
        let plan_of = |shape: Shape, dtype: DType, path: SimdPath| -> Option<StagePlan> {
            let spec = AttentionSpec::new(shape, dtype);
            let inputs = HostInputs::random(&spec, 1).expect("valid spec");
            macro_rules! planned {
                ($q:expr, $k:expr, $v:expr, $t:ty) => {{
                    let mut o = vec![<$t>::default(); $q.len()];
                    let ps = Problem::parts(&spec, $q, $k, $v, None, &mut o, None, None).expect("a dense call");
                    plan(&ps[0], path, tiles, 7)
                }};
            }
            match (&inputs.q, &inputs.k, &inputs.v) {
                (HostBuffer::F32(q), HostBuffer::F32(k), HostBuffer::F32(v)) => planned!(q, k, v, f32),
                (HostBuffer::BF16(q), HostBuffer::BF16(k), HostBuffer::BF16(v)) => planned!(q, k, v, bf16),
                _ => panic!("f32 or bf16"),
            }
        };
        let tall = |d| Shape { b: 1, hq: 2, hkv: 2, sq: 4 * 48, sk: 100, d, dv: d };
        let avx2 = SimdPath::Avx2;
        // f32: V only, and only where AVX2 copies it (rows 512 bytes apart); nothing at D = 64.
        assert_eq!(plan_of(tall(128), DType::F32, avx2), Some(StagePlan { k: false, v: true, call: 7 }));
        assert_eq!(plan_of(tall(64), DType::F32, avx2), None);
        assert_eq!(plan_of(tall(128), DType::F32, SimdPath::Avx512), None);
        // bf16: both, on the item kernel's paths; not on the scalar one.
        assert_eq!(plan_of(tall(64), DType::BF16, avx2), Some(StagePlan { k: true, v: true, call: 7 }));
        assert_eq!(plan_of(tall(64), DType::BF16, SimdPath::Scalar), None);
        // Three row tiles per kv head: not enough; four are (GQA counts the group's rows).
        assert_eq!(plan_of(Shape { sq: 3 * 48, ..tall(64) }, DType::BF16, avx2), None);
        assert!(plan_of(Shape { hq: 4, sq: 2 * 48, ..tall(64) }, DType::BF16, avx2).is_some());
        // The AVX512_BF16 kernel reads bf16 in place (where the CPU has it: `uses_pairs`).
        if SimdPath::Avx512Bf16.is_supported() {
            assert_eq!(plan_of(tall(64), DType::BF16, SimdPath::Avx512Bf16), None);
        }
        // A head within MAX_HEAD_BYTES: 16k keys at D = Dv = 128, not 32k; sizes that overflow are refused.
        assert!(head_fits(16 << 10, 128, 128, 8) && !head_fits(32 << 10, 128, 128, 8));
        assert!(!head_fits(usize::MAX / 2, 128, 128, 8));
        assert_eq!(MAX_HEAD_BYTES, 16 << 20);
        assert_eq!(worker_bytes(16 << 10, 128, 128), 16 << 20);
        assert_eq!(worker_bytes(32 << 10, 128, 128), 0);
    }
}
