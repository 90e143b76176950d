//! Times paged decoding on `splitkv` (issue 23's speed case) against the memory system and against the
//! same bytes read contiguously: bf16, B = 32 sequences decoding one token each, Hq = 32, Hkv = 8, D = 128,
//! cache lengths spread evenly over 512..32768 (shuffled), page size 16 with the pages in shuffled order.
//! In one run, with device events, the median of `reps` calls:
//!  - the copy ceiling: `cuMemcpyDtoD` of a 1 GiB buffer (bytes read + written);
//!  - `paged`: the paged batch;
//!  - `varlen`: the same lengths as packed varlen K/V (the same kernel, contiguous rows);
//!  - both again on the 2-stage ring (`SDPA_SPLITKV_RAGGED_STAGES=2`, the dense cp.async tile's);
//!  - `dense`: a dense B = 32 call with the same total keys (Sk = the mean length), the contiguous
//!    `splitkv` every earlier issue timed (TMA on sm_90), and the same with its cp.async path.
//!
//! All calls read the same K/V buffer (2 GiB and more: no L2 reuse between calls). GB/s counts K/V, Q and
//! O bytes once. Then a few rows of a small paged batch are checked against the f64 reference.
//!
//!     cargo run --release -p sdpa-cuda --example paged_timing -- [reps] [page_size] [longest]
//!
//! (`longest` below 32768 shrinks the lengths in proportion, for sanitizer runs.)

use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
use sdpa_core::{AttentionSpec, Backend, DType, HostBuffer, Kernel, Layout, Mask, Ragged, RunOptions, Shape};
use sdpa_cuda::CudaBackend;
use std::sync::Arc;

const B: usize = 32;
const HQ: usize = 32;
const HKV: usize = 8;
const D: usize = 128;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Median of `reps` timed runs of `f` (device events on `stream`), microseconds, after 3 warm-ups.
fn time_us(stream: &Arc<CudaStream>, reps: usize, mut f: impl FnMut() -> Res<()>) -> Res<f64> {
    for _ in 0..3 {
        f()?;
    }
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = stream.record_event(flags)?;
        f()?;
        let end = stream.record_event(flags)?;
        end.synchronize()?;
        t.push(start.elapsed_ms(&end)? as f64 * 1000.0);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

/// A device buffer of `len` random bf16 values (a random block repeated: timing needs non-zero data, not
/// distinct values).
fn random_device(stream: &Arc<CudaStream>, len: usize, seed: u64) -> Res<CudaSlice<bf16>> {
    let block: Vec<bf16> =
        HostBuffer::random(DType::BF16, 1 << 22, seed).to_f32_vec().into_iter().map(bf16::from_f32).collect();
    let mut buf = unsafe { stream.alloc::<bf16>(len) }?;
    let mut at = 0;
    while at < len {
        let n = block.len().min(len - at);
        stream.memcpy_htod(&block[..n], &mut buf.slice_mut(at..at + n))?;
        at += n;
    }
    Ok(buf)
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let reps: usize = args.get(1).map_or(Ok(20), |x| x.parse())?;
    let page: usize = args.get(2).map_or(Ok(16), |x| x.parse())?;
    let longest: usize = args.get(3).map_or(Ok(32768), |x| x.parse())?;
    let gpu = CudaBackend::new(0)?;
    let stream = gpu.device().stream().clone();

    // Lengths 512..32768 evenly spread, in a shuffled order (a fixed permutation).
    let shortest = (longest / 64).max(1);
    let mut lens: Vec<usize> = (0..B).map(|b| shortest + (longest - shortest) * b / (B - 1)).collect();
    for b in 0..B {
        lens.swap(b, (b * 7 + 3) % B);
    }
    let total: usize = lens.iter().sum();
    let mean = total / B;
    let paged = Ragged::new(vec![1; B], lens.clone()).paged(page, 0);
    let pages = paged.pages.ok_or("paged")?;
    let table = paged.shuffled_block_table(5)?;
    let shape = Shape { b: B, hq: HQ, hkv: HKV, sq: 1, sk: longest, d: D, dv: D };
    let spec_paged = AttentionSpec::new(shape, DType::BF16)
        .with_ragged(paged.clone(), Layout::Bshd)
        .with_mask(Mask::CausalBottomRight);
    let spec_varlen = AttentionSpec::new(shape, DType::BF16)
        .with_ragged(Ragged::new(vec![1; B], lens.clone()), Layout::Bshd)
        .with_mask(Mask::CausalBottomRight);
    let spec_dense = AttentionSpec::new(Shape { sk: mean, ..shape }, DType::BF16)
        .with_layout(Layout::Bshd)
        .with_mask(Mask::CausalBottomRight);

    // One K and one V buffer large enough for every call (the pool holds at least `total` rows).
    let kv_rows = (pages.num_pages * page).max(total);
    let k = random_device(&stream, kv_rows * HKV * D, 1)?;
    let v = random_device(&stream, kv_rows * HKV * D, 2)?;
    let q = random_device(&stream, B * HQ * D, 3)?;
    let mut o = unsafe { stream.alloc::<bf16>(B * HQ * D) }?;
    let dev_table = gpu.upload_index(&table)?;
    let opts = RunOptions { kernel: Kernel::SplitKv, lse: false, ..Default::default() };

    // The copy ceiling.
    let n_copy = 1usize << 29; // bf16: 1 GiB
    let src = random_device(&stream, n_copy, 4)?;
    let mut dst = unsafe { stream.alloc::<bf16>(n_copy) }?;
    eprintln!("timing the copy");
    let copy_us = time_us(&stream, reps, || Ok(stream.memcpy_dtod(&src, &mut dst)?))?;
    let copy_gbs = 2.0 * (n_copy * 2) as f64 / copy_us / 1e3;
    drop((src, dst));

    let kv_bytes = |keys: usize| (2 * keys * HKV * D * 2) as f64;
    let qo_bytes = (2 * B * HQ * D * 2) as f64;
    let mut rows: Vec<(String, f64, f64)> = Vec::new();
    let mut run = |name: &str, spec: &AttentionSpec, keys: usize, bt: Option<&CudaSlice<u32>>| -> Res<f64> {
        eprintln!("timing {name}");
        let us = time_us(&stream, reps, || {
            gpu.forward_on_stream(&stream, spec, &opts, &q, &k, &v, None, &mut o, None, bt)?;
            Ok(())
        })?;
        let gbs = (kv_bytes(keys) + qo_bytes) / us / 1e3;
        rows.push((name.to_string(), us, gbs));
        Ok(us)
    };
    let paged_us = run("paged", &spec_paged, total, Some(&dev_table))?;
    let varlen_us = run("varlen", &spec_varlen, total, None)?;
    std::env::set_var("SDPA_SPLITKV_RAGGED_STAGES", "2");
    run("paged, 2-stage ring", &spec_paged, total, Some(&dev_table))?;
    run("varlen, 2-stage ring", &spec_varlen, total, None)?;
    std::env::remove_var("SDPA_SPLITKV_RAGGED_STAGES");
    let dense_us = run("dense (default load)", &spec_dense, mean * B, None)?;
    std::env::set_var("SDPA_SPLITKV_LOAD", "cp.async");
    let dense_cp_us = run("dense (cp.async)", &spec_dense, mean * B, None)?;
    std::env::remove_var("SDPA_SPLITKV_LOAD");
    // Chunk sweep of the ragged schedule (tuning): SDPA_SPLITKV_CHUNK forces the keys per block.
    let mut sweep = Vec::new();
    for chunk in [4096usize, 8192, 16384] {
        std::env::set_var("SDPA_SPLITKV_CHUNK", chunk.to_string());
        sweep.push((chunk, run(&format!("paged, chunk {chunk}"), &spec_paged, total, Some(&dev_table))?));
    }
    std::env::remove_var("SDPA_SPLITKV_CHUNK");

    // Correctness of a few rows of a smaller paged batch.
    let small = AttentionSpec::new(Shape { b: 4, sk: 4000, ..shape }, DType::BF16)
        .with_ragged(Ragged::new(vec![1; 4], vec![700, 4000, 16, 1]).paged(page, 0), Layout::Bshd)
        .with_mask(Mask::CausalBottomRight);
    let inputs = sdpa_core::HostInputs::random(&small, 9)?;
    let out = sdpa_core::HostBackend::run_host(&gpu, &small, &opts, &inputs)?;
    let check = sdpa_core::check::check_output(&small, &inputs, &out.output, sdpa_core::F32Math::Exact, None)?;

    println!(
        "{}: bf16 B={B} Hq={HQ} Hkv={HKV} D={D}, decode (Sq=1), lengths {shortest}..{longest} (total {total} keys, mean {mean}), \
         page {page}, median of {reps}",
        gpu.device_name()
    );
    println!("copy ceiling (cuMemcpyDtoD 1 GiB, read + write): {copy_us:.1} us, {copy_gbs:.0} GB/s");
    println!("{:<24} {:>10} {:>9} {:>8}", "call", "us", "GB/s", "% copy");
    for (name, us, gbs) in &rows {
        println!("{name:<24} {us:>10.1} {gbs:>9.0} {:>7.1}%", 100.0 * gbs / copy_gbs);
    }
    // Same bytes: the dense call reads mean·B keys, within B keys of the ragged total.
    let per_byte = |us: f64, keys: usize| us / (kv_bytes(keys) + qo_bytes);
    println!(
        "paged vs varlen: {:.3}x; paged vs dense splitkv (per byte): {:.3}x (default load), {:.3}x (cp.async)",
        varlen_us / paged_us,
        per_byte(dense_us, mean * B) / per_byte(paged_us, total),
        per_byte(dense_cp_us, mean * B) / per_byte(paged_us, total)
    );
    let best = sweep.iter().min_by(|a, b| a.1.total_cmp(&b.1)).map_or(0, |x| x.0);
    println!("fastest forced chunk: {best} keys; small paged batch vs f64 reference: pass = {}", check.pass);
    Ok(())
}
