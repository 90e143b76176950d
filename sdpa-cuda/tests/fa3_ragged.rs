//! `fa3` on ragged (varlen) batches with packed K/V (kernels/fa3.cu `FA3_ENTRY_SERVE`, written in session 10
//! without a GPU) against the f64 reference on an sm_90 GPU: lengths off every tile (1, 33, 70, 130, 300,
//! 513), sequences of length 0 (no query row, or no key) and 1, Sq_b above and below Sk_b, both causal
//! alignments measured from each sequence's own diagonal (as `fa2` runs them), GQA 1/4/8, both layouts, f16
//! and bf16, LSE in the `[Hq, total_q]` layout, every head-dim class at least once, windows, softcap and ALiBi
//! per sequence, paged KV caches (pages of 8 to 256 slots, chunked prefill), more work tiles than
//! multiprocessors; NaN in the value rows of the next sequence (which a
//! sequence's last key tile loads: TMA reads packed rows, so nothing past a sequence is zero) stays out of
//! the sequence; no row past a sequence's end is written (prefixes of one packed batch, the rest poisoned);
//! `auto` takes fa3 for packed ragged prefill. Outputs are NaN-poisoned before every call
//! (`HostBackend::run_host`) and every case asks for `fa3` by name and must report it, so a fallback cannot
//! pass.
//!
//! First run on the H100 in session 10 (`bench/results/gpu/fa3.md`, "Ragged batches"), which made them part
//! of what `fa3` takes. Skips (printing why)
//! without a GPU, and the kernel checks on a GPU other than compute capability 9.0 after checking that `fa3`
//! refuses the call. `bench/studies/fa3/ragged10/run.sh` runs it, again with `SDPA_FA3_GRID` forcing two
//! blocks, and the sanitizers on `small_ragged_calls_for_the_sanitizer`.

mod common;

use common::gpu;
use sdpa_core::check::check_output;
use sdpa_core::{
    Alibi, AttentionSpec, DType, Diagonal, F32Math, HostBackend, HostBuffer, HostInputs, HostOutput, Kernel, Layout,
    Mask, Operand, Ragged, RunOptions, SdpaError, Shape, Window,
};
use sdpa_cuda::CudaBackend;

/// The GPU, or `None` (printing why): no GPU, or one that is not sm_90 (where fa3 must refuse the call).
fn hopper_with_ragged() -> Option<CudaBackend> {
    let gpu = gpu()?;
    if gpu.info().compute_capability == (9, 0) {
        return Some(gpu);
    }
    let (q, k) = lengths();
    let spec = spec(2, 2, 64, 64, Ragged::new(q, k), Layout::Bshd, DType::BF16);
    let inputs = HostInputs::random(&spec, 1).expect("valid");
    match gpu.run_host(&spec, &opts(Kernel::Fa3, true), &inputs) {
        Err(SdpaError::Unsupported { .. }) => eprintln!("skipping fa3 ragged checks: not a compute-capability 9.0 GPU"),
        other => panic!("fa3 on a GPU other than sm_90 must be refused, got {other:?}"),
    }
    None
}

/// The packed batch most cases run (`tests/ragged_prefill.rs`'s): a sequence off every tile with Sq = Sk,
/// one with no query row but keys, single tokens, Sq < Sk over two key tiles, Sq > Sk, and rows without keys.
fn lengths() -> (Vec<usize>, Vec<usize>) {
    (vec![70, 0, 1, 130, 33, 3], vec![70, 5, 1, 200, 20, 0])
}

/// Longer sequences: several 128-row work tiles and key tiles each, Sq_b != Sk_b both ways.
fn long_lengths() -> (Vec<usize>, Vec<usize>) {
    (vec![300, 1, 513, 129, 0, 257], vec![1000, 129, 513, 77, 64, 300])
}

fn spec(hq: usize, hkv: usize, d: usize, dv: usize, r: Ragged, layout: Layout, dtype: DType) -> AttentionSpec {
    let shape = Shape { b: r.batch(), hq, hkv, sq: r.max_q().max(1), sk: r.max_k().max(1), d, dv };
    AttentionSpec::new(shape, dtype).with_ragged(r, layout)
}

fn opts(kernel: Kernel, lse: bool) -> RunOptions {
    RunOptions { kernel, f32_math: F32Math::Exact, threads: None, lse }
}

/// Runs `spec` on `kernel` (reporting `expect`) and checks O and the LSE against the reference; the failure
/// in words, if any.
fn check_on(
    gpu: &CudaBackend,
    spec: &AttentionSpec,
    inputs: &HostInputs,
    kernel: Kernel,
    expect: Kernel,
) -> Option<String> {
    let label = format!("{spec:?}");
    let run = match gpu.run_host(spec, &opts(kernel, true), inputs) {
        Ok(r) => r,
        Err(e) => return Some(format!("{label}: error: {e}")),
    };
    if run.kernel != expect {
        return Some(format!("{label}: ran {}", run.kernel));
    }
    match check_output(spec, inputs, &run.output, F32Math::Exact, None) {
        Ok(r) if r.pass => None,
        Ok(r) => Some(format!("{label}: {r:?}")),
        Err(e) => Some(format!("{label}: check error: {e}")),
    }
}

/// The inputs of every case, built (and so validated) before the GPU is asked for: a case table that does
/// not describe valid calls fails on any machine, not only on the device.
fn inputs_of(specs: &[AttentionSpec], seed0: u64) -> Vec<HostInputs> {
    specs
        .iter()
        .enumerate()
        .map(|(n, s)| HostInputs::random(s, seed0 + n as u64).unwrap_or_else(|e| panic!("{s:?}: inputs: {e}")))
        .collect()
}

fn run_all(specs: Vec<AttentionSpec>, seed0: u64) {
    let inputs = inputs_of(&specs, seed0);
    let Some(gpu) = hopper_with_ragged() else { return };
    let failures: Vec<String> =
        specs.iter().zip(&inputs).filter_map(|(s, i)| check_on(&gpu, s, i, Kernel::Fa3, Kernel::Fa3)).collect();
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), specs.len(), failures.join("\n"));
}

const MASKS: [Mask; 3] = [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight];

/// Both lengths sets, every mask (causal of both alignments), GQA 1, 4 and 8, both layouts, f16 and bf16.
#[test]
fn packed_batches_match_the_reference_in_every_mask_gqa_layout_and_half_type() {
    let mut specs = Vec::new();
    for (n, (q, k)) in [lengths(), long_lengths()].into_iter().enumerate() {
        for (hq, hkv) in [(4, 4), (8, 2), (8, 1)] {
            for dtype in [DType::F16, DType::BF16] {
                for mask in MASKS {
                    let layout = if (hq + hkv + n) % 2 == 0 { Layout::Bshd } else { Layout::Bhsd };
                    let d = if n == 0 { 64 } else { 128 };
                    specs.push(spec(hq, hkv, d, d, Ragged::new(q.clone(), k.clone()), layout, dtype).with_mask(mask));
                }
            }
        }
    }
    run_all(specs, 31_000);
}

/// Every head-dim class (and head dims below their class: 40 -> 64, 80 -> 96, 248 -> 256, MLA's 192/128).
#[test]
fn every_head_dim_class_runs_ragged() {
    let (q, k) = long_lengths();
    let dims = [(40, 40), (80, 80), (128, 128), (192, 128), (160, 160), (192, 192), (224, 224), (248, 248), (256, 256)];
    let specs = dims
        .into_iter()
        .enumerate()
        .map(|(n, (d, dv))| {
            let dtype = if n % 2 == 0 { DType::BF16 } else { DType::F16 };
            let layout = if n % 3 == 0 { Layout::Bhsd } else { Layout::Bshd };
            spec(4, 2, d, dv, Ragged::new(q.clone(), k.clone()), layout, dtype).with_mask(MASKS[n % 3])
        })
        .collect();
    run_all(specs, 32_000);
}

/// Windows, softcap and ALiBi measure from each sequence's own diagonal (fa3's variant code per sequence).
#[test]
fn variants_follow_each_sequence_diagonal() {
    let mut specs = Vec::new();
    for (n, (q, k)) in [lengths(), long_lengths(), lengths(), long_lengths()].into_iter().enumerate() {
        let dtype = if n % 2 == 0 { DType::BF16 } else { DType::F16 };
        let layout = if n < 2 { Layout::Bshd } else { Layout::Bhsd };
        let base = spec(4, 2, 64 + 64 * (n % 2), 64 + 64 * (n % 2), Ragged::new(q, k), layout, dtype);
        specs.push(base.clone().with_mask(Mask::CausalBottomRight).with_window(Window::left(24)));
        specs.push(
            base.clone().with_window(Window { left: Some(10), right: Some(170) }).with_diagonal(Diagonal::TopLeft),
        );
        specs.push(base.clone().with_mask(Mask::CausalTopLeft).with_softcap(20.0));
        specs.push(base.clone().with_mask(Mask::CausalBottomRight).with_alibi(Alibi::Standard));
        specs.push(base.with_alibi(Alibi::Standard).with_softcap(30.0).with_diagonal(Diagonal::BottomRight));
    }
    run_all(specs, 33_000);
}

/// Paged KV caches (K/V through the block table, page by page: boxes of min(keys per tile, page size) keys):
/// pages of 8, 16, 64, 256 slots at the class 128 (128 keys per tile: pages smaller than a tile and larger;
/// 192, which takes 64 keys per tile),
/// 16 and 256 at 256 (80 keys, and 64 for pages of 256), 64 at 192/192 (112 keys -> 64); lengths ending
/// mid-page, both alignments, GQA, a window with ALiBi, chunked prefill against a longer cache, f16 and bf16,
/// both layouts of the pool (BSHD: NHD pages, BHSD: HND).
#[test]
fn paged_caches_match_the_reference() {
    let (q, k) = long_lengths();
    let r = |ps: usize| Ragged::new(q.clone(), k.clone()).paged(ps, 3);
    let mut specs = Vec::new();
    for (n, ps) in [8, 16, 64, 256].into_iter().enumerate() {
        let dtype = if n % 2 == 0 { DType::BF16 } else { DType::F16 };
        let layout = if n < 2 { Layout::Bshd } else { Layout::Bhsd };
        specs.push(spec(8, 2, 128, 128, r(ps), layout, dtype).with_mask(MASKS[n % 3]));
    }
    specs.push(spec(4, 1, 256, 256, r(16), Layout::Bshd, DType::BF16).with_mask(Mask::CausalBottomRight));
    specs.push(spec(4, 4, 256, 256, r(256), Layout::Bshd, DType::F16).with_mask(Mask::CausalTopLeft));
    specs.push(spec(4, 2, 192, 192, r(64), Layout::Bhsd, DType::BF16).with_mask(Mask::None));
    // Pages of 192 slots at the class 128: neither dividing 128 keys nor a multiple of them, so 64 keys per
    // tile in boxes of 64 (review of session 10: this entry had not run).
    specs.push(spec(8, 2, 128, 128, r(192), Layout::Bshd, DType::F16).with_mask(Mask::CausalBottomRight));
    specs.push(
        spec(8, 2, 64, 64, r(16), Layout::Bshd, DType::BF16)
            .with_mask(Mask::CausalBottomRight)
            .with_window(Window::left(100))
            .with_alibi(Alibi::Standard),
    );
    // Chunked prefill: a few new tokens per sequence against a cache of up to 1000 keys.
    let chunks = Ragged::new(vec![16, 1, 40, 0, 129], vec![300, 129, 77, 64, 1000]);
    for (ps, dtype) in [(16, DType::BF16), (64, DType::F16)] {
        specs.push(
            spec(8, 2, 128, 128, chunks.clone().paged(ps, 1), Layout::Bshd, dtype).with_mask(Mask::CausalBottomRight),
        );
    }
    run_all(specs, 39_000);
}

/// Many sequences and heads: more work tiles than the H100's 132 multiprocessors, so every persistent block
/// walks several tiles of different sequences (the ring, the Q buffers and the turns carry across them),
/// heaviest first.
#[test]
fn more_work_tiles_than_multiprocessors() {
    let q: Vec<usize> = (0..40).map(|i| [1, 70, 200, 0, 129, 333, 64, 513][i % 8]).collect();
    let k: Vec<usize> = (0..40).map(|i| [1, 70, 900, 9, 129, 200, 640, 513][(i + 3) % 8]).collect();
    let specs = vec![
        spec(16, 4, 128, 128, Ragged::new(q.clone(), k.clone()), Layout::Bshd, DType::BF16)
            .with_mask(Mask::CausalBottomRight),
        spec(8, 8, 64, 64, Ragged::new(q.clone(), k.clone()), Layout::Bshd, DType::F16).with_mask(Mask::None),
        spec(8, 1, 256, 256, Ragged::new(q, k), Layout::Bhsd, DType::BF16).with_mask(Mask::CausalTopLeft),
    ];
    run_all(specs, 34_000);
}

/// NaN in the value rows just past a sequence (the next sequence's first keys, which the sequence's last key
/// tile loads: TMA reads packed rows, so what lies past a sequence is the next one's data, not zeros) stays
/// out of the sequence's rows; in the next sequence it reaches the rows that see that key, as in the
/// reference.
#[test]
fn nan_in_the_next_sequences_values_stays_out() {
    let Some(gpu) = hopper_with_ragged() else { return };
    let (q, k) = lengths();
    let mut failures = Vec::new();
    for (n, mask) in MASKS.into_iter().enumerate() {
        let spec = spec(2, 1, 64, 64, Ragged::new(q.clone(), k.clone()), Layout::Bshd, DType::BF16).with_mask(mask);
        let mut inputs = HostInputs::random(&spec, 35_000 + n as u64).expect("inputs");
        let mut v = inputs.v.to_f32_vec();
        // Sequence 3's first key (sequence 2 has one key and loads a whole tile from it) and sequence 4's
        // (sequence 3 has 200 keys: its second key tile reaches into sequence 4).
        for b in [3, 4] {
            let seq = spec.seq(b);
            v[spec.kv_offset(Operand::V, None, &seq, b, 0, 0)] = f32::NAN;
        }
        inputs.v = HostBuffer::from_f32(spec.dtype, &v);
        failures.extend(check_on(&gpu, &spec, &inputs, Kernel::Fa3, Kernel::Fa3));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// No row past a sequence's end is written: each prefix of one packed batch (its first j sequences, whose Q,
/// K and V rows are the batch's first rows) runs on the batch's buffers with O poisoned, and the rows past
/// the prefix's last sequence (the next sequence's, which the last work tile's 128 rows cover) must still be
/// poison; the prefix's own rows match the reference. A caller's stream (`forward_on_stream`).
#[test]
fn rows_past_each_sequence_are_never_written() {
    let Some(gpu) = hopper_with_ragged() else { return };
    let (q, k) = (vec![70, 1, 130, 0, 33, 200, 3], vec![70, 1, 200, 5, 20, 150, 0]);
    let full = spec(4, 2, 64, 64, Ragged::new(q.clone(), k.clone()), Layout::Bshd, DType::BF16);
    let inputs = HostInputs::random(&full, 36_000).expect("inputs");
    let stream = gpu.device().context().new_stream().expect("a stream");
    let up = |b: &HostBuffer| match b {
        HostBuffer::BF16(v) => stream.clone_htod(v).expect("upload"),
        _ => unreachable!("bf16 spec"),
    };
    let (dq, dk, dv) = (up(&inputs.q), up(&inputs.k), up(&inputs.v));
    let o_len = full.required_len(Operand::O).expect("len");
    let mut failures = Vec::new();
    for j in 1..=q.len() {
        for mask in MASKS {
            let prefix = spec(4, 2, 64, 64, Ragged::new(q[..j].to_vec(), k[..j].to_vec()), Layout::Bshd, DType::BF16)
                .with_mask(mask);
            let mut o = stream.clone_htod(&vec![half::bf16::NAN; o_len]).expect("poisoned output");
            let ran = gpu.forward_on_stream(
                &stream,
                &prefix,
                &opts(Kernel::Fa3, false),
                &dq,
                &dk,
                &dv,
                None,
                &mut o,
                None,
                None,
            );
            let label = format!("prefix of {j} sequences, {mask:?}");
            match ran {
                Ok(Kernel::Fa3) => {}
                other => {
                    failures.push(format!("{label}: {other:?}"));
                    continue;
                }
            }
            let host = stream.clone_dtoh(&o).expect("download");
            let own = prefix.required_len(Operand::O).expect("len");
            if let Some(at) = host[own..].iter().position(|x| !x.is_nan()) {
                failures.push(format!("{label}: element {} past the prefix's rows was written", own + at));
            }
            let cut = |b: &HostBuffer, op: Operand| match b {
                HostBuffer::BF16(v) => HostBuffer::BF16(v[..prefix.required_len(op).expect("len")].to_vec()),
                _ => unreachable!("bf16 spec"),
            };
            let mine = HostInputs {
                q: cut(&inputs.q, Operand::Q),
                k: cut(&inputs.k, Operand::K),
                v: cut(&inputs.v, Operand::V),
                mask: None,
                block_table: None,
            };
            let out = HostOutput { o: HostBuffer::BF16(host[..own].to_vec()), lse: None };
            match check_output(&prefix, &mine, &out, F32Math::Exact, None) {
                Ok(r) if r.pass => {}
                other => failures.push(format!("{label}: {other:?}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `auto` runs ragged prefill with packed K/V on fa3 (paged caches stay on fa2); pages
/// no key tile's boxes fit (7 slots) are refused by fa3 asked for by name, with who takes them.
#[test]
fn auto_takes_fa3_for_ragged_prefill_and_fa3_refuses_what_it_lacks() {
    let Some(gpu) = hopper_with_ragged() else { return };
    let (q, k) = long_lengths();
    let prefill = spec(8, 2, 128, 128, Ragged::new(q.clone(), k.clone()), Layout::Bshd, DType::BF16)
        .with_mask(Mask::CausalBottomRight);
    let inputs = HostInputs::random(&prefill, 37_000).expect("inputs");
    assert_eq!(check_on(&gpu, &prefill, &inputs, Kernel::Auto, Kernel::Fa3), None);
    let paged = spec(8, 2, 128, 128, Ragged::new(q.clone(), k.clone()).paged(16, 0), Layout::Bshd, DType::BF16);
    let inputs = HostInputs::random(&paged, 37_001).expect("inputs");
    assert_eq!(check_on(&gpu, &paged, &inputs, Kernel::Auto, Kernel::Fa2), None);
    let odd = spec(8, 2, 128, 128, Ragged::new(q, k).paged(7, 0), Layout::Bshd, DType::BF16);
    let inputs = HostInputs::random(&odd, 37_002).expect("inputs");
    match gpu.run_host(&odd, &opts(Kernel::Fa3, true), &inputs) {
        Err(SdpaError::Unsupported { what, .. }) => {
            assert!(what.contains("page size") && what.contains("fa2") && what.contains("splitkv"), "{what}")
        }
        other => panic!("pages of 7 on fa3: {:?}", other.map(|r| r.kernel)),
    }
}

/// Small calls for compute-sanitizer (`bench/studies/fa3/ragged10/run.sh` runs this test alone under
/// memcheck, racecheck and synccheck with `SDPA_FA3_GRID=2,1`: two persistent blocks walking the work tiles
/// of several sequences each): classes 64, 128 and 256, causal of both alignments, no mask and a window with
/// softcap and ALiBi, a paged cache of 16-slot pages, sequences of 0, 1 and 130 rows, each checked against
/// the reference.
#[test]
fn small_ragged_calls_for_the_sanitizer() {
    let r = || Ragged::new(vec![30, 0, 1, 130, 5], vec![30, 7, 1, 200, 0]);
    let specs = [
        spec(2, 1, 64, 64, r(), Layout::Bshd, DType::BF16).with_mask(Mask::CausalBottomRight),
        spec(2, 2, 128, 128, r(), Layout::Bhsd, DType::F16).with_mask(Mask::CausalTopLeft),
        spec(2, 1, 256, 256, r(), Layout::Bshd, DType::BF16).with_mask(Mask::None),
        spec(2, 1, 128, 128, r(), Layout::Bshd, DType::BF16)
            .with_mask(Mask::CausalBottomRight)
            .with_window(Window::left(20))
            .with_softcap(30.0)
            .with_alibi(Alibi::Standard),
        spec(2, 1, 128, 128, r().paged(16, 2), Layout::Bshd, DType::BF16).with_mask(Mask::CausalBottomRight),
    ];
    let inputs = inputs_of(&specs, 38_000);
    let Some(gpu) = hopper_with_ragged() else { return };
    let failures: Vec<String> =
        specs.iter().zip(&inputs).filter_map(|(s, i)| check_on(&gpu, s, i, Kernel::Fa3, Kernel::Fa3)).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
