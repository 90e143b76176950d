//! A kv head's K and V rows staged as aligned f32 in a worker's own buffer, once, where the item kernel would
//! otherwise widen or copy the same key tiles again in every work item of that head.
//!
//! An item of [`super::process`] walks the keys its rows see, and each kv head's keys are walked by every
//! row tile of that head (`group · Sq / br` of them). Where a tile cannot be read in place (bf16 and f16
//! inputs, which the f32 micro-kernels widen; f32 V rows a multiple of 512 bytes apart on AVX2, copied into
//! the aligned scratch: `super::copies_v`), each of those items repeated the widening or the copy. Staged,
//! a worker widens a head's rows once for its items of that head that follow one another (a dense call's
//! items go head by head, and each worker takes runs of them; a ragged batch's go heaviest first across its
//! sequences, so there a worker restages more often, never more than the per-tile path widened), and they
//! read the rows in place: already f32, and every V row on a 32-byte boundary, which is what the AVX2 copy
//! was for (a `Vec` from the allocator starts 16 bytes off a cache line, so half of the 32-byte loads of a V
//! row read in place straddle two lines).
//!
//! The buffer is the worker thread's own ([`with_head_stage`]) and is kept from item to item and from call
//! to call: a fresh buffer per call paid a page fault per 4 KiB (8 % of an in-cache bf16 call). So it is
//! bounded, [`MAX_HEAD_BYTES`] per worker thread of every pool a process has used, which the backend's
//! memory estimate counts for the call's threads ([`worker_bytes`]). A head's rows are staged as the items
//! reach them (a causal item reaches the head's first keys only; a window or a split-KV chunk, a range from
//! elsewhere), and the staging belongs to one call ([`StagePlan::call`]): the next call's inputs may be
//! other data at the same address.
//!
//! Staged where it pays and fits ([`planned`]): keys not in pages, on the item kernel's paths (AVX2 and
//! AVX-512; the AMX and AVX512_BF16 kernels read bf16 in place), at least [`MIN_ITEMS_PER_KV_HEAD`] row tiles
//! per kv head, a head within [`MAX_HEAD_BYTES`]. Where the buffer cannot be had the items widen tile by tile
//! as before, with the same result bit for bit (the staged values are the inputs' exact f32 values, and the
//! micro-kernels read them in the same order). Under Linux's overcommit a reservation seldom fails, though:
//! the bound, not the fallback, is what keeps the memory in check.

use super::{copies_v, row_tile_count, uses_amx, uses_pairs, Tiles};
use crate::aligned::Aligned;
use crate::element::{widen_with, CpuElement};
use crate::problem::{round_up, Problem};
use crate::simd::{Simd, SimdPath};
use sdpa_core::DType;
use std::sync::atomic::{AtomicU64, Ordering};

/// Row tiles per kv head from which staging pays: a worker then widens a head's rows once for several of its
/// items instead of once per item.
pub(crate) const MIN_ITEMS_PER_KV_HEAD: usize = 4;

/// Most bytes one worker stages (one kv head's staged rows), and keeps between calls: 16 MiB holds
/// D = Dv = 128 at 16k keys. Longer heads widen tile by tile as before.
pub(crate) const MAX_HEAD_BYTES: usize = 16 << 20;

/// What a call stages: its K rows, its V rows, under the call's number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StagePlan {
    pub k: bool,
    pub v: bool,
    /// Distinct for every call that stages, so that no call reads another's staging.
    pub call: u64,
}

/// The call's problems with their staging planned ([`plan`]) under one new call number; none staged under
/// `SDPA_CPU_STAGE=0`.
pub(crate) fn planned<'a, T: CpuElement>(ps: &[Problem<'a, T>], path: SimdPath, tiles: Tiles) -> Vec<Problem<'a, T>> {
    static CALLS: AtomicU64 = AtomicU64::new(1);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let on = !switched_off();
    ps.iter().map(|p| Problem { stage: plan(p, path, tiles, call).filter(|_| on), ..p.clone() }).collect()
}

/// What the items of `p` would stage on `path` with `tiles` under call number `call`, if anything.
pub(crate) fn plan<T: CpuElement>(p: &Problem<'_, T>, path: SimdPath, tiles: Tiles, call: u64) -> Option<StagePlan> {
    let k = T::as_f32(p.k).is_none();
    let v = T::as_f32(p.v).is_none() || copies_v(p, path);
    let kernel = matches!(path, SimdPath::Avx2 | SimdPath::Avx512 | SimdPath::Avx512Bf16 | SimdPath::Amx)
        && !uses_amx(p, path)
        && !uses_pairs(p, path);
    let enough = row_tile_count(p, tiles.br) >= MIN_ITEMS_PER_KV_HEAD * (p.b * p.hkv()).max(1);
    let fits = layout(p.sk, p.d, p.dv, super::lanes(path), k, v).is_some_and(|l| 4 * l.floats <= MAX_HEAD_BYTES);
    ((k || v) && kernel && p.pages.is_none() && enough && fits).then_some(StagePlan { k, v, call })
}

/// Where a head's staged rows sit in the buffer (floats): K rows at stride `d` from 0, then, from a 64-byte
/// boundary, V rows at `voff` with stride `dvp` (Dv rounded up to the vectors); only the staged operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    voff: usize,
    dvp: usize,
    floats: usize,
}

/// The [`Layout`] of `sk` keys at head dims `d`, `dv` on a path of `lanes`, staging K (`k`) and V (`v`);
/// `None` when the sizes overflow.
fn layout(sk: usize, d: usize, dv: usize, lanes: usize, k: bool, v: bool) -> Option<Layout> {
    let voff = if k { round_up(sk.checked_mul(d)?, 16) } else { 0 };
    let dvp = round_up(dv, lanes);
    let floats = voff.checked_add(if v { sk.checked_mul(dvp)? } else { 0 })?;
    floats.checked_mul(4)?;
    Some(Layout { voff, dvp, floats })
}

/// Most bytes a worker may hold for a call (the backend's memory estimate): a head's staging where the
/// call may stage (not paged; f32 only on AVX2, whose V it copies) and one fits [`MAX_HEAD_BYTES`] on some
/// path, counted at the widest rounding, else none.
pub(crate) fn worker_bytes(sk: usize, d: usize, dv: usize, dtype: DType, path: SimdPath, paged: bool) -> u64 {
    let k = dtype != DType::F32;
    if paged || path == SimdPath::Scalar || !(k || path == SimdPath::Avx2) {
        return 0;
    }
    let bytes = |lanes| layout(sk, d, dv, lanes, k, true).map(|l| 4 * l.floats);
    match (bytes(8), bytes(16)) {
        (Some(narrow), Some(wide)) if narrow <= MAX_HEAD_BYTES => wide.min(MAX_HEAD_BYTES) as u64,
        _ => 0,
    }
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

thread_local! {
    /// The worker's staging, apart from its scratch (which a change of tiles or head dims rebuilds), so that
    /// calls of alternating shapes keep it.
    static HEAD_STAGE: std::cell::RefCell<HeadStage> = std::cell::RefCell::new(HeadStage::default());
}

/// Runs `f` with this thread's staging (a fresh, empty one if re-entered on this thread).
pub(crate) fn with_head_stage<R>(f: impl FnOnce(&mut HeadStage) -> R) -> R {
    HEAD_STAGE.with(|cell| match cell.try_borrow_mut() {
        Ok(mut st) => f(&mut st),
        Err(_) => f(&mut HeadStage::default()),
    })
}

/// The rows one worker holds: keys `lo..hi` of one kv head of one call's problem, at their own positions
/// (key `j` at row `j`).
#[derive(Debug, Default)]
pub(crate) struct HeadStage {
    buf: Option<Aligned<f32>>,
    /// Whose rows are held: (call, K and V addresses, keys, batch, kv head); `None`: nothing.
    owner: Option<(u64, usize, usize, usize, usize, usize)>,
    lo: usize,
    hi: usize,
}

/// Staged rows of a head, from its key 0: K at `k` with row stride `ks`, V at `v` with row stride `vs`
/// (`None`: that operand is not staged and reads as before). The pointers address the worker's buffer,
/// which no one touches until the item that asked for them ends (items never re-enter the staging).
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
    #[allow(clippy::too_many_arguments)]
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
        let (d, dv) = (p.d, p.dv);
        let Layout { voff, dvp, floats } = layout(p.sk, d, dv, S::LANES, plan.k, plan.v)?;
        if self.buf.as_ref().is_none_or(|b| b.len() < floats) {
            self.owner = None;
            self.buf = None;
            self.buf = Some(Aligned::try_new(floats)?);
        }
        let owner = (plan.call, p.k.as_ptr() as usize, p.v.as_ptr() as usize, p.sk, b, kvh);
        if self.owner != Some(owner) {
            self.owner = Some(owner);
            (self.lo, self.hi) = (lo, lo);
        }
        let buf = self.buf.as_mut()?;
        // Widen what `lo..hi` adds to the rows held: the hull of both, the gap between them too (at most
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
            // SAFETY (the offset): voff <= floats <= the buffer's length.
            v: plan.v.then(|| unsafe { base.add(voff) }),
            vs: dvp,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::{layout, plan, switched_off, worker_bytes, StagePlan, MAX_HEAD_BYTES};
    use crate::fa2::tests::{assert_same_output, FA2_TESTS};
    use crate::fa2::Tiles;
    use crate::problem::Problem;
    use crate::{supported_paths, CpuBackend, SimdPath};
    use half::bf16;
    use sdpa_core::{
        AttentionSpec, DType, HostBackend, HostBuffer, HostInputs, Kernel, Layout, Mask, RunOptions, Shape, Window,
    };
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// Set by [`staging_changes_no_bit`] while it runs the unstaged side.
    pub(crate) static UNSTAGED: AtomicBool = AtomicBool::new(false);
    /// Rows widened into a staging so far: shows that the shapes reach it (the tests that run fa2 hold
    /// `FA2_TESTS`, so the count is theirs alone).
    pub(crate) static STAGED_ROWS: AtomicUsize = AtomicUsize::new(0);

    /// Restores staging even when a run panics, so that no other test loses it.
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            UNSTAGED.store(false, Ordering::Relaxed);
        }
    }

    /// Whether bf16/f16 calls stage on `path` at an odd head dim: on every vector path but AMX, whose bf16
    /// items take the tile kernel at any head dim (its f16 ones take the AVX-512 item kernel and stage).
    fn stages_odd(path: SimdPath, dtype: DType) -> bool {
        path != SimdPath::Scalar && !(path == SimdPath::Amx && dtype == DType::BF16)
    }

    /// Staged and unstaged calls agree bit for bit (O and LSE), on shapes that stage on every vector path:
    /// f32 V rows 512 bytes apart on AVX2 in both layouts (D = 128 head-major, D = 64 x 2 kv heads
    /// sequence-major), bf16 and f16 with an odd head dim (off the AVX512_BF16 kernel) and Dv != D (P·V
    /// transposed on AVX-512), GQA 4, Sq != Sk both ways, both causal alignments, a window (ranges that start
    /// past a head's first key, below and apart from the rows held: the hull), `fa2` and `splitkv` (chunks
    /// of a head's keys out of order), two threads. The reference tests (`tests/correctness.rs`) run staged.
    #[test]
    fn staging_changes_no_bit() {
        let _alone = FA2_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        if switched_off() {
            eprintln!("skipped: SDPA_CPU_STAGE=0 in the environment keeps every call unstaged");
            return;
        }
        let masks = [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight];
        type Masks = Vec<(Mask, Option<Window>)>;
        let cases: Vec<(Shape, Layout, Masks)> = vec![
            (
                Shape { b: 1, hq: 2, hkv: 2, sq: 300, sk: 333, d: 128, dv: 128 },
                Layout::Bhsd,
                masks.map(|m| (m, None)).to_vec(),
            ),
            (
                Shape { b: 2, hq: 4, hkv: 1, sq: 97, sk: 260, d: 33, dv: 24 },
                Layout::Bhsd,
                masks.map(|m| (m, None)).to_vec(),
            ),
            (
                Shape { b: 1, hq: 8, hkv: 2, sq: 130, sk: 77, d: 64, dv: 64 },
                Layout::Bshd,
                masks.map(|m| (m, None)).to_vec(),
            ),
            (
                Shape { b: 1, hq: 4, hkv: 2, sq: 400, sk: 700, d: 33, dv: 40 },
                Layout::Bhsd,
                vec![(Mask::CausalBottomRight, Some(Window::left(90))), (Mask::CausalTopLeft, Some(Window::left(40)))],
            ),
            // Four or five row tiles of one kv head: enough to stage, few enough that `splitkv` cuts the keys
            // in two, so a worker's next item may ask for keys below the ones it holds.
            (
                Shape { b: 1, hq: 2, hkv: 1, sq: 100, sk: 700, d: 33, dv: 40 },
                Layout::Bhsd,
                vec![(Mask::None, None), (Mask::CausalBottomRight, Some(Window::left(90)))],
            ),
        ];
        let mut checked = 0;
        for path in supported_paths().into_iter().filter(|&p| p != SimdPath::Scalar) {
            let be = CpuBackend::with_simd(path, Some(2)).expect("a supported path builds");
            for dtype in [DType::F32, DType::BF16, DType::F16] {
                let before = STAGED_ROWS.load(Ordering::Relaxed);
                for (shape, layout, masks) in &cases {
                    for (mask, window) in masks {
                        for kernel in [Kernel::Fa2, Kernel::SplitKv] {
                            let mut spec = AttentionSpec::new(*shape, dtype).with_layout(*layout).with_mask(*mask);
                            if let Some(w) = window {
                                spec = spec.with_window(*w);
                            }
                            // A seed of its own: rows a worker kept from the case before must differ.
                            let inputs = HostInputs::random(&spec, 31 + checked as u64).expect("valid spec");
                            let opts = RunOptions { kernel, lse: true, ..Default::default() };
                            let label = format!("{path} {dtype} {shape} {layout:?} {mask:?} {window:?} {kernel}");
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
                // bf16 and f16 stage wherever `stages_odd` says (the odd head dims); f32 only on AVX2, whose V
                // copies the first and third shapes reach.
                let staged = STAGED_ROWS.load(Ordering::Relaxed) > before;
                let expected = if dtype == DType::F32 { path == SimdPath::Avx2 } else { stages_odd(path, dtype) };
                assert_eq!(staged, expected, "{path} {dtype}: rows staged");
            }
        }
        assert!(checked >= 26 || supported_paths().len() == 1, "{checked}");
    }

    /// A call never reads rows an earlier call staged from the same buffers: two calls through the slice
    /// entry on the same `Vec`s, changed in place between them, on one worker thread (whose staging is
    /// kept), against the second call's inputs in fresh buffers.
    #[test]
    fn a_call_never_reads_an_earlier_calls_staging() {
        let _alone = FA2_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let Some(path) = supported_paths().into_iter().find(|&p| stages_odd(p, DType::BF16)) else {
            eprintln!("skipped: no path here stages bf16");
            return;
        };
        let spec = AttentionSpec::new(Shape { b: 1, hq: 2, hkv: 1, sq: 260, sk: 200, d: 33, dv: 33 }, DType::BF16);
        // One thread: both calls run on the same worker, which keeps its staging.
        let opts = RunOptions { kernel: Kernel::Fa2, threads: Some(1), ..Default::default() };
        let inputs = HostInputs::random(&spec, 5).expect("valid spec");
        let [HostBuffer::BF16(q), HostBuffer::BF16(k), HostBuffer::BF16(v)] = [inputs.q, inputs.k, inputs.v] else {
            panic!("bf16 inputs")
        };
        let (mut k, mut v) = (k, v);
        let mut o = vec![bf16::ZERO; q.len()];
        let call = |k: &[bf16], v: &[bf16], o: &mut [bf16]| {
            crate::run::attention_on(path, None, &spec, &opts, &q, k, v, None, None, o, None).expect("runs");
        };
        let before = STAGED_ROWS.load(Ordering::Relaxed);
        call(&k, &v, &mut o);
        assert!(STAGED_ROWS.load(Ordering::Relaxed) > before || switched_off(), "the first call staged nothing");
        let (kp, vp) = (k.as_ptr(), v.as_ptr());
        for x in [&mut k, &mut v] {
            x.iter_mut().enumerate().for_each(|(i, e)| *e = bf16::from_f32(e.to_f32() * -0.5 + (i % 7) as f32 * 0.25));
        }
        assert_eq!((kp, vp), (k.as_ptr(), v.as_ptr()), "changed in place");
        call(&k, &v, &mut o);
        let (k2, v2) = (k.clone(), v.clone());
        let mut want = vec![bf16::ZERO; q.len()];
        call(&k2, &v2, &mut want);
        assert!(o.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "stale staged rows were read");
    }

    /// The rows a worker holds follow its items' ranges in any order: above, below, apart (the gap widened
    /// too, then asked for), inside; another head starts afresh. Every range asked for reads back as the
    /// inputs' values.
    #[test]
    fn held_rows_cover_every_range_asked_for_in_any_order() {
        let spec = AttentionSpec::new(Shape { b: 2, hq: 2, hkv: 2, sq: 8, sk: 500, d: 5, dv: 3 }, DType::BF16)
            .with_layout(Layout::Bshd);
        let inputs = HostInputs::random(&spec, 3).expect("valid spec");
        let (HostBuffer::BF16(q), HostBuffer::BF16(k), HostBuffer::BF16(v)) = (&inputs.q, &inputs.k, &inputs.v) else {
            panic!("bf16 inputs")
        };
        let mut o = vec![bf16::ZERO; q.len()];
        let ps = Problem::parts(&spec, q, k, v, None, &mut o, None, None).expect("a dense call");
        let p = &ps[0];
        let mut stage = super::HeadStage::default();
        let s = crate::simd::scalar::Scalar;
        let check = |stage: &mut super::HeadStage, plan: StagePlan, b: usize, kvh: usize, lo: usize, hi: usize| {
            let rows = stage.rows(s, p, plan, b, kvh, lo, hi).expect("memory");
            for j in lo..hi {
                // SAFETY: the staging holds keys lo..hi at their own rows (d and dv values each).
                let (kr, vr) = unsafe {
                    let k = std::slice::from_raw_parts(rows.k.expect("K staged").add(j * rows.ks), p.d);
                    let v = std::slice::from_raw_parts(rows.v.expect("V staged").add(j * rows.vs), p.dv);
                    (k.to_vec(), v.to_vec())
                };
                let want_k: Vec<f32> = p.k[p.k_row(b, kvh, j)..][..p.d].iter().map(|x| x.to_f32()).collect();
                let want_v: Vec<f32> = p.v[p.v_row(b, kvh, j)..][..p.dv].iter().map(|x| x.to_f32()).collect();
                assert_eq!((kr, vr), (want_k, want_v), "key {j} of ({b}, {kvh}) after asking {lo}..{hi}");
            }
        };
        let plan = StagePlan { k: true, v: true, call: 1 };
        // Then inside the gaps the hull took in: (200, 300) after the second range, (50, 100) after the third.
        for (lo, hi) in [(300, 400), (100, 200), (0, 50), (350, 500), (120, 130), (210, 290), (60, 90)] {
            check(&mut stage, plan, 1, 1, lo, hi);
        }
        // Another head, then back (a call on buffers changed in place: `a_call_never_reads_an_earlier_calls_staging`).
        check(&mut stage, plan, 0, 1, 200, 260);
        check(&mut stage, plan, 1, 1, 0, 500);
        check(&mut stage, plan, 1, 0, 450, 500);
        check(&mut stage, plan, 1, 0, 10, 20);
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
        // The AVX512_BF16 and AMX kernels read bf16 in place (where the CPU has them).
        for path in [SimdPath::Avx512Bf16, SimdPath::Amx] {
            if path.is_supported() {
                assert_eq!(plan_of(tall(64), DType::BF16, path), None, "{path}");
            }
        }
        // The layout holds only what is staged: V alone from 0.
        let kv = layout(100, 40, 24, 16, true, true).expect("small");
        assert_eq!((kv.voff, kv.dvp, kv.floats), (4000, 32, 4000 + 3200));
        let v = layout(100, 40, 24, 8, false, true).expect("small");
        assert_eq!((v.voff, v.dvp, v.floats), (0, 24, 2400));
        assert!(layout(usize::MAX / 2, 128, 128, 8, true, true).is_none());
        // The estimate: a head of 16k keys at D = Dv = 128 fits MAX_HEAD_BYTES, 32k keys do not; f32 stages
        // only on AVX2 (V alone: 32k keys fit there); a head that fits at 8 lanes only is counted, at most
        // the bound (D = Dv = 120: 16 MiB at 8 lanes, more at 16).
        assert_eq!(MAX_HEAD_BYTES, 16 << 20);
        let est = |sk, d, dtype, path| worker_bytes(sk, d, d, dtype, path, false);
        assert_eq!(est(16 << 10, 128, DType::BF16, avx2), 16 << 20);
        assert_eq!(est(32 << 10, 128, DType::BF16, avx2), 0);
        assert_eq!(est(32 << 10, 128, DType::F32, avx2), 16 << 20);
        assert_eq!(est(16 << 10, 128, DType::F32, SimdPath::Avx512), 0);
        assert_eq!(worker_bytes(16 << 10, 128, 128, DType::BF16, avx2, true), 0);
        assert_eq!(est(17_000, 120, DType::BF16, avx2), 16 << 20);
    }
}
