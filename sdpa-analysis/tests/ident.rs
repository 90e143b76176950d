//! Which implementation ran, attention without an SDPA op, and many ranks, on the issue-27 H100 traces in
//! `tests/fixtures/` (recipes `record_training.py`, `record_decode.py`, `record_cp.py`, `record_flex.py`;
//! ground truth in the `.meta.json` beside them). Expected kernel times, counts and overlaps are computed here
//! from the trace events themselves (serde_json over the file), independently of the analyzer's code.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use sdpa_analysis::trace::attention::implementation::{of_kernels, ImplKind};
use sdpa_analysis::trace::attention::{detect, AttentionCall, AttnBackend, MaskInfo, Phase};
use sdpa_analysis::trace::kineto::parse_file;
use sdpa_analysis::trace::report::AttentionOp;
use sdpa_analysis::trace::tree::OpTree;
use sdpa_analysis::{analyze_path, Options, TraceReport};
use sdpa_core::Shape;
use std::io::Read;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn report(name: &str) -> TraceReport {
    analyze_path(&fixture(name), &Options::default()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The raw events of a fixture, for figures computed without the analyzer.
fn events(path: &std::path::Path) -> Vec<serde_json::Value> {
    let mut s = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap()).read_to_string(&mut s).unwrap();
    let v: serde_json::Value = serde_json::from_str(&s).unwrap();
    v["traceEvents"].as_array().unwrap().clone()
}

fn kernels(ev: &[serde_json::Value]) -> Vec<(String, f64, f64, i64)> {
    ev.iter()
        .filter(|e| e["cat"] == "kernel")
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["ts"].as_f64().unwrap(),
                e["dur"].as_f64().unwrap(),
                e["tid"].as_i64().unwrap(),
            )
        })
        .collect()
}

fn shape(b: usize, h: usize, s: usize, d: usize) -> Shape {
    Shape { b, hq: h, hkv: h, sq: s, sk: s, d, dv: d }
}

/// Each layer of the training step (record_function("layer<i>:<kind>")) ran the backend it was forced onto, and
/// its kernels name the implementation: PyTorch's FlashAttention-2 copy, its CUTLASS memory-efficient build,
/// cuDNN's sm90 wgmma kernels with their tiles; the direct `aten::_flash_attention_forward` (no SDPA op above
/// it) is found with its BSHD shape.
#[test]
fn training_layers_name_their_implementation() {
    let trace = parse_file(&fixture("train_backends_bf16_S2048.json.gz")).unwrap();
    let tree = OpTree::build(&trace);
    let calls = detect(&tree);
    let layer = |name: &str| {
        let op = trace.ops.iter().find(|o| trace.names.get(o.name) == name).unwrap_or_else(|| panic!("{name}"));
        (op.ts, op.ts + op.dur)
    };
    let fwd_in = |name: &str| -> &AttentionCall {
        let (a, b) = layer(name);
        let inside: Vec<&AttentionCall> =
            calls.iter().filter(|c| c.phase == Phase::Fwd && c.at.1 >= a && c.at.1 <= b).collect();
        assert_eq!(inside.len(), 1, "{name}: one forward attention call");
        inside[0]
    };
    // (layer, backend, shape, implementation, details the kernel name carries)
    let expected: [(&str, AttnBackend, Shape, ImplKind, &[&str]); 5] = [
        (
            "layer0:flash_d128",
            AttnBackend::Flash,
            shape(2, 16, 2048, 128),
            ImplKind::Fa2Pytorch,
            &["head dim 128", "tile 128x64"],
        ),
        (
            "layer1:efficient_d128",
            AttnBackend::Efficient,
            shape(2, 16, 2048, 128),
            ImplKind::MemEffPytorch,
            &["tile 64x128", "sm80"],
        ),
        (
            "layer2:cudnn_d128",
            AttnBackend::Cudnn,
            shape(2, 16, 2048, 128),
            ImplKind::Cudnn,
            &["sm90", "fprop", "wgmma", "tile 64x128x128"],
        ),
        (
            "layer3:flash_d64",
            AttnBackend::Flash,
            shape(2, 32, 2048, 64),
            ImplKind::Fa2Pytorch,
            &["head dim 64", "tile 128x128"],
        ),
        (
            "layer4:cudnn_d64",
            AttnBackend::Cudnn,
            shape(2, 32, 2048, 64),
            ImplKind::Cudnn,
            &["sm90", "fprop", "wgmma", "tile 64x128x64"],
        ),
    ];
    for (name, backend, s, kind, details) in expected {
        let c = fwd_in(name);
        assert_eq!(
            (c.backend, c.shape, c.op.as_str()),
            (backend, Some(s), "aten::scaled_dot_product_attention"),
            "{name}"
        );
        assert_eq!(c.mask, MaskInfo::CausalTopLeft, "{name}");
        let i = of_kernels(c.kernels.iter().map(|(k, us)| (k.as_str(), *us))).unwrap();
        assert_eq!(i.id, kind, "{name}: {}", i.kernel);
        for d in details {
            assert!(i.details.iter().any(|x| x == d), "{name}: {d} in {:?}", i.details);
        }
    }
    // The direct call: BSHD [2, 2048, 16, 128], is_causal=True, and no SDPA op anywhere in its layer's range.
    let direct = fwd_in("layer5:direct_flash");
    assert_eq!(direct.op, "aten::_flash_attention_forward");
    assert_eq!(
        (direct.backend, direct.shape, direct.q_bshd_strides),
        (AttnBackend::Flash, Some(shape(2, 16, 2048, 128)), true)
    );
    assert_eq!((direct.mask.clone(), direct.dtype.as_deref()), (MaskInfo::CausalTopLeft, Some("c10::BFloat16")));
    let (a, b) = layer("layer5:direct_flash");
    assert!(!trace
        .ops
        .iter()
        .any(|o| o.ts >= a && o.ts <= b && trace.names.get(o.name) == "aten::scaled_dot_product_attention"));
    let i = of_kernels(direct.kernels.iter().map(|(k, us)| (k.as_str(), *us))).unwrap();
    assert_eq!(i.id, ImplKind::Fa2Pytorch);

    // The report: 11 ops (5 forward through SDPA, the direct call as its own op, 5 backward), each fused op with
    // the implementation of its kernels; the backward ones say so.
    let r = report("train_backends_bf16_S2048.json.gz");
    assert_eq!(r.attention_ops.len(), 11);
    let direct_op: Vec<&AttentionOp> =
        r.attention_ops.iter().filter(|o| o.op == "aten::_flash_attention_forward").collect();
    assert_eq!(direct_op.len(), 1, "the direct call is not merged with layer0's SDPA call");
    assert_eq!((direct_op[0].count, direct_op[0].shape()), (1, Some(shape(2, 16, 2048, 128))));
    let bwd = |backend: AttnBackend, d: usize| {
        let o =
            r.attention_ops.iter().find(|o| o.phase == Phase::Bwd && o.backend == backend && o.d == Some(d)).unwrap();
        o.implementation.clone().unwrap()
    };
    let flash_bwd = bwd(AttnBackend::Flash, 128);
    assert_eq!(flash_bwd.id, ImplKind::Fa2Pytorch);
    assert!(flash_bwd.kernel.contains("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel"), "the main kernel, not dot_do_o");
    let eff_bwd = bwd(AttnBackend::Efficient, 128);
    assert_eq!(eff_bwd.id, ImplKind::MemEffPytorch);
    assert!(eff_bwd.kernel.starts_with("fmha_cutlassB_bf16_aligned_128x128_k128"));
    for d in [64, 128] {
        let c = bwd(AttnBackend::Cudnn, d);
        assert_eq!(c.id, ImplKind::Cudnn);
        assert!(c.details.contains(&"bprop".to_string()) && c.details.contains(&format!("tile 64x64x{d}")), "{c:?}");
    }
    for o in &r.attention_ops {
        let i = o.implementation.as_ref().unwrap();
        assert!(o.kernels.iter().any(|k| k.name == i.kernel), "read from one of the op's own kernels");
    }
    let csv = sdpa_analysis::trace::printers::csv::render(&r);
    assert!(csv.lines().next().unwrap().ends_with("implementation,implementation_details,implementation_kernel"));
    assert!(csv.contains("cuDNN SDPA,sm90; fprop; wgmma; tile 64x128x128,"));
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(
        (r.attention_ops[0].backend, r.attention_ops[0].phase),
        (AttnBackend::Efficient, Phase::Bwd),
        "the longest op"
    );
    assert_eq!(json["attention_ops"][0]["implementation"]["id"], "mem_eff_pytorch");
    assert!(
        sdpa_analysis::trace::printers::text::render(&r).contains("FlashAttention-2 (PyTorch's copy) · head dim 64")
    );
    assert!(
        sdpa_analysis::trace::printers::markdown::render(&r).contains("**CUTLASS memory-efficient (PyTorch's build)")
    );
    assert!(r.ranks.is_none(), "one trace without collectives has no ranks section");
}

/// FlexAttention's Triton templates and cuDNN in the flex fixture; the decode fixture's split-KV paths:
/// PyTorch's flash split-KV kernel with its combine, cuDNN's sm80 kernel with its reduction.
#[test]
fn flex_and_decode_fixtures_name_their_implementations() {
    let r = report("flex_bf16_S2048.json.gz");
    for o in r.attention_ops.iter().filter(|o| o.kind == sdpa_analysis::trace::attention::Kind::Fused) {
        let i = o.implementation.as_ref().unwrap();
        match o.backend {
            AttnBackend::Flex => {
                assert_eq!(i.id, ImplKind::Flex);
                assert!(i.kernel.starts_with("triton_tem_fused_flex_attention"), "{}", i.kernel);
            }
            AttnBackend::Cudnn => assert_eq!(i.id, ImplKind::Cudnn),
            b => panic!("unexpected backend {b:?}"),
        }
    }
    assert!(r
        .attention_ops
        .iter()
        .all(|o| o.kind == sdpa_analysis::trace::attention::Kind::Fused || o.implementation.is_none()));

    let r = report("decode_gqa_bf16.json.gz");
    let (mut flash, mut cudnn) = (0, 0);
    for o in &r.attention_ops {
        let i = o.implementation.as_ref().unwrap();
        match o.backend {
            AttnBackend::Flash => {
                assert_eq!(
                    (i.id, i.details.first().map(String::as_str)),
                    (ImplKind::Fa2Pytorch, Some("split-KV + combine"))
                );
                flash += o.count;
            }
            AttnBackend::Cudnn => {
                assert_eq!(i.id, ImplKind::Cudnn);
                assert!(
                    i.details.contains(&"sm80".to_string()) && i.details.contains(&"+ split-KV reduction".to_string())
                );
                cudnn += o.count;
            }
            b => panic!("unexpected backend {b:?}"),
        }
    }
    // 2 layers x 20 steps: one loop on flash, two (default and the fp8 cache) on cuDNN (decode_gqa_bf16.meta.json).
    assert_eq!((flash, cudnn), (16, 24));
}

/// What a context-parallel directory must report, from the raw events of each rank.
struct RankTruth {
    flash_us: f64,
    calls: usize,
    nccl_us: f64,
    nccl_under_flash_us: f64,
}

fn rank_truth(path: &std::path::Path) -> RankTruth {
    let k = kernels(&events(path));
    let flash: Vec<&(String, f64, f64, i64)> = k.iter().filter(|x| x.0.contains("pytorch_flash::")).collect();
    // One stream runs the attention kernels, so they never overlap one another and their overlaps with a NCCL
    // kernel add up without double counting.
    let mut spans: Vec<(f64, f64)> = flash.iter().map(|x| (x.1, x.1 + x.2)).collect();
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    assert!(spans.windows(2).all(|w| w[1].0 >= w[0].1 - 1e-3), "attention kernels are serial");
    let nccl: Vec<&(String, f64, f64, i64)> = k.iter().filter(|x| x.0.starts_with("ncclDevKernel_SendRecv")).collect();
    let under: f64 =
        nccl.iter().map(|n| spans.iter().map(|s| (s.1.min(n.1 + n.2) - s.0.max(n.1)).max(0.0)).sum::<f64>()).sum();
    let main = |x: &&&(String, f64, f64, i64)| {
        x.0.contains("flash_fwd_kernel") || x.0.contains("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel")
    };
    RankTruth {
        flash_us: flash.iter().map(|x| x.2).sum(),
        calls: flash.iter().filter(main).count(),
        nccl_us: nccl.iter().map(|x| x.2).sum(),
        nccl_under_flash_us: under,
    }
}

fn check_cp(case: &str, balanced: bool) -> TraceReport {
    let r = report(case);
    let ranks = r.ranks.as_ref().unwrap();
    assert_eq!(ranks.ranks.len(), 2);
    let mut flash = Vec::new();
    for (i, x) in ranks.ranks.iter().enumerate() {
        assert_eq!((x.rank, x.world_size), (Some(i as i64), Some(2)), "{case}: distributedInfo");
        let t = rank_truth(std::path::Path::new(&x.input));
        // Attention time: the flash kernels, plus the few small kernels (fills) the same ops launched.
        assert!(
            x.attention_us >= t.flash_us - 1e-6 && x.attention_us <= t.flash_us * 1.02,
            "{case} {i}: {} vs {}",
            x.attention_us,
            t.flash_us
        );
        assert_eq!(x.attention_calls, t.calls, "{case} {i}: one call per ring step and pass");
        assert!((x.attention_fwd_us + x.attention_bwd_us - x.attention_us).abs() < 1e-6);
        let c = x.comm.as_ref().unwrap();
        assert!((c.total_us - t.nccl_us).abs() < 1e-6, "{case} {i}: NCCL time");
        assert!(
            (c.under_attention_us - t.nccl_under_flash_us).abs() < 1e-3,
            "{case} {i}: {} vs {}",
            c.under_attention_us,
            t.nccl_under_flash_us
        );
        assert!((0.0..=1.0).contains(&c.under_attention) && c.under_attention <= c.under_compute);
        assert!((c.under_attention - c.under_attention_us / c.total_us).abs() < 1e-12);
        assert_eq!(c.collectives.len(), 1);
        assert_eq!(
            (c.collectives[0].collective.as_str(), c.collectives[0].op.as_str(), c.collectives[0].count),
            ("SendRecv", "_c10d_functional::all_to_all_single", 8)
        );
        flash.push(t.flash_us);
    }
    let expected = flash.iter().cloned().fold(0.0, f64::max) / (flash.iter().sum::<f64>() / 2.0);
    let got = ranks.attention_max_over_mean.unwrap();
    assert!((got - expected).abs() < 0.02 * expected, "{case}: imbalance {got} vs {expected}");
    // Each call is one ring step on the local chunks (8192 of the 16384 tokens, or half of them when balanced),
    // not the global problem the outer DTensor op records.
    for o in &r.attention_ops {
        assert!(
            o.sq.unwrap() <= 8192 && o.sk.unwrap() <= 8192 && o.hq == Some(16) && o.d == Some(128),
            "{case}: {}",
            o.shape_label()
        );
        assert!(
            o.notes.iter().any(|n| n.contains("context-parallel") && n.contains("1,16,16,16384,16384,128")),
            "{case}: {:?}",
            o.notes
        );
        assert_eq!(o.implementation.as_ref().unwrap().id, ImplKind::Fa2Pytorch);
    }
    assert_eq!(ranks.likely_cause.is_some(), !balanced, "{case}: {:?}", ranks.likely_cause);
    r
}

#[test]
fn context_parallel_balanced_ranks_are_even() {
    let r = check_cp("cp_balanced", true);
    let ranks = r.ranks.as_ref().unwrap();
    assert!(ranks.attention_max_over_mean.unwrap() < 1.10);
    // Load balancing gives each rank chunks r and 2N-1-r: steps of 8192x8192 (causal), 4096x8192 and 8192x4096.
    let mut shapes: Vec<(usize, usize, String)> = r
        .attention_ops
        .iter()
        .filter(|o| o.phase == Phase::Fwd)
        .map(|o| (o.sq.unwrap(), o.sk.unwrap(), o.mask.clone()))
        .collect();
    shapes.sort();
    assert_eq!(shapes, [(4096, 8192, "none".into()), (8192, 4096, "none".into()), (8192, 8192, "causal".into())]);
    let f = r.findings.iter().find(|f| f.title.starts_with("Attention is even across 2 ranks")).unwrap();
    assert_eq!(f.severity.name(), "info");
    assert!(r.findings.iter().any(|f| f.title.starts_with("Collectives: ")));
}

#[test]
fn context_parallel_unbalanced_ranks_name_the_contiguous_causal_split() {
    let r = check_cp("cp_unbalanced", false);
    let ranks = r.ranks.as_ref().unwrap();
    // Rank 0 skips the step whose keys all lie in its future: half the calls, and rank 1 does the most.
    assert_eq!((ranks.ranks[0].attention_calls, ranks.ranks[1].attention_calls), (4, 8));
    assert_eq!(ranks.busiest.as_deref(), Some("rank 1"));
    assert!(ranks.attention_max_over_mean.unwrap() > 1.3);
    let f = r.findings.iter().find(|f| f.title.starts_with("Attention is uneven across ranks")).unwrap();
    assert_eq!(f.severity.name(), "medium");
    assert!(f.detail.contains("zigzag") && f.detail.contains("rank 1"));
    // The idle rank waits in its NCCL kernels: its collective time is several times the busy rank's.
    let wait = |i: usize| ranks.ranks[i].comm.as_ref().unwrap().total_us;
    assert!(wait(0) > 3.0 * wait(1), "{} vs {}", wait(0), wait(1));
    let text = sdpa_analysis::trace::printers::text::render(&r);
    assert!(
        text.contains("ranks: 2; attention busiest/mean")
            && text.contains("SendRecv x8 (_c10d_functional::all_to_all_single)")
    );
    assert!(sdpa_analysis::trace::printers::markdown::render(&r).contains("## Ranks"));
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["ranks"]["ranks"][1]["rank"], 1);
}

/// A single rank file of the same run still reports its collectives and what attention hides of them.
#[test]
fn one_rank_file_reports_its_collectives() {
    let r = report("cp_unbalanced/rank1.json.gz");
    let ranks = r.ranks.as_ref().unwrap();
    assert_eq!(ranks.ranks.len(), 1);
    assert!(ranks.attention_max_over_mean.is_none() && ranks.likely_cause.is_none());
    assert!(ranks.ranks[0].comm.is_some());
}

/// Attention without `aten::scaled_dot_product_attention`: the flash-attn package's op over its own FA2 kernel,
/// FlashAttention-3's op over its hopper kernel (shape read from its arguments), and a FlashInfer kernel under
/// an op this reader has no signature for.
#[test]
fn direct_library_calls_are_attention() {
    let fa2 = common::op_with_kernel(
        "flash_attn::_flash_attn_forward",
        r#"{"Input Dims": [[2, 1024, 16, 128], [2, 1024, 16, 128], [2, 1024, 16, 128], [], [], [], [], [], [], [], []],
            "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "", "Scalar"],
            "Concrete Inputs": ["", "", "", "0.", "0.088", "True", "-1", "-1", "0.", "", "False"]}"#,
        "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, false, true, true, false, false>(flash::Flash_fwd_params)",
        300.0,
    );
    let r = common::analyze("direct_fa2", &fa2);
    let o = &r.attention_ops[0];
    assert_eq!(
        (o.backend, o.shape_label().as_str(), o.mask.as_str()),
        (AttnBackend::FlashAttn, "2,16,16,1024,1024,128", "causal-br")
    );
    assert_eq!(o.implementation.as_ref().unwrap().id, ImplKind::Fa2FlashAttn);
    assert!(!o.notes.iter().any(|n| n.contains("kernels look like")), "its kernels agree with the op: {:?}", o.notes);

    let mut dims = vec!["[2, 4096, 32, 128]", "[2, 4096, 8, 128]", "[2, 4096, 8, 128]"];
    dims.extend(std::iter::repeat_n("[]", 26));
    let mut concrete = vec![""; 29];
    concrete[23] = "0.088";
    concrete[24] = "True";
    concrete[25] = "-1";
    concrete[26] = "-1";
    concrete[28] = "0.";
    let types: Vec<&str> = (0..29).map(|i| if i < 3 { "c10::BFloat16" } else { "" }).collect();
    let q = |v: &[&str]| v.iter().map(|x| format!("\"{x}\"")).collect::<Vec<_>>().join(", ");
    let args = format!(
        r#"{{"Input Dims": [{}], "Input type": [{}], "Concrete Inputs": [{}]}}"#,
        dims.join(", "),
        q(&types),
        q(&concrete)
    );
    let fa3 = common::op_with_kernel(
        "flash_attn_3::_flash_attn_forward",
        &args,
        "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cute::tuple<cute::C<128>, cute::C<176>, cute::C<128> >, 128, cutlass::bfloat16_t, float, cutlass::arch::Sm90, true>, flash::CollectiveEpilogueFwd<>, flash::DynamicPersistentTileScheduler<> > > >(Params)",
        900.0,
    );
    let r = common::analyze("direct_fa3", &fa3);
    let o = &r.attention_ops[0];
    assert_eq!(
        (o.backend, o.shape_label().as_str(), o.mask.as_str()),
        (AttnBackend::FlashAttn, "2,32,8,4096,4096,128", "causal-br")
    );
    let i = o.implementation.as_ref().unwrap();
    assert_eq!((i.id, i.details.as_slice()), (ImplKind::Fa3, &["sm90".to_string()][..]));
    assert!(o.tflops.is_some(), "costed from the shape its arguments give");
    assert!(!o.notes.iter().any(|n| n.contains("kernels look like")), "{:?}", o.notes);

    let fi = common::op_with_kernel(
        "my_server::decode_step",
        r#"{}"#,
        "void flashinfer::BatchDecodeWithPagedKVCacheKernel<(flashinfer::PosEncodingMode)0, 2u, 4u, 8u, 16u, 1u, 8u, (flashinfer::PageStorage)0, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16, int>(flashinfer::BatchDecodeParams)",
        40.0,
    );
    let r = common::analyze("direct_flashinfer", &fi);
    let o = &r.attention_ops[0];
    assert_eq!((o.backend, o.op.as_str()), (AttnBackend::FlashInfer, "my_server::decode_step"));
    assert_eq!(o.implementation.as_ref().unwrap().id, ImplKind::FlashInfer);
    assert!((r.summary.attention_time_us - 40.0).abs() < 1e-9);

    // A kernel no rule knows under a fused op stays unknown, named by the kernel it was read from.
    let unknown =
        common::op_with_kernel("aten::scaled_dot_product_attention", r#"{}"#, "my_lab_attention_fwd_kernel", 50.0);
    let r = common::analyze("unknown_kernel", &unknown);
    let i = r.attention_ops[0].implementation.as_ref().unwrap();
    assert_eq!((i.id, i.name, i.kernel.as_str()), (ImplKind::Unknown, "unknown", "my_lab_attention_fwd_kernel"));
}

/// Kernel-only attention: the training fixture with its CPU ops and runtime calls taken out (what a trace
/// recorded with the CUDA activity alone holds). Every attention kernel is still attention, named by its
/// implementation, and attention time is exactly those kernels' time.
#[test]
fn kernel_only_trace_keeps_its_attention() {
    let ev = events(&fixture("train_backends_bf16_S2048.json.gz"));
    let gpu: Vec<serde_json::Value> =
        ev.into_iter().filter(|e| matches!(e["cat"].as_str(), Some("kernel" | "gpu_memcpy" | "gpu_memset"))).collect();
    let attention = |n: &str| {
        n.contains("pytorch_flash::")
            || n.starts_with("fmha_cutlass")
            || n.starts_with("cudnn_generated_fort_native_sdpa")
    };
    let expected: f64 = kernels(&gpu).iter().filter(|k| attention(&k.0)).map(|k| k.2).sum();
    let count = kernels(&gpu).iter().filter(|k| attention(&k.0)).count();
    let body: Vec<String> = gpu.iter().map(|e| e.to_string()).collect();
    let r = common::analyze("kernel_only", &body.join(","));
    assert!((r.summary.attention_time_us - expected).abs() < 1e-6, "{} vs {expected}", r.summary.attention_time_us);
    assert_eq!(r.summary.attention_calls, count, "one call per attention kernel");
    let mut ids: Vec<ImplKind> = r.attention_ops.iter().map(|o| o.implementation.as_ref().unwrap().id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids, [ImplKind::Fa2Pytorch, ImplKind::Cudnn, ImplKind::MemEffPytorch]);
    assert!(r.attention_ops.iter().all(|o| o.op == "(no launching op)" && o.shape().is_none()));
    assert!(r.missing.iter().any(|m| m.contains("no CPU ops")));
}

/// `distributedInfo` gives the rank, through the streaming scanner and the reference parser alike; a value of
/// another form loses the rank, never the trace.
#[test]
fn distributed_info_gives_the_rank() {
    use sdpa_analysis::trace::kineto::{parse_file_reference, DistributedInfo};
    let p = fixture("cp_unbalanced/rank1.json.gz");
    let want = Some(DistributedInfo { rank: Some(1), world_size: Some(2) });
    assert_eq!(parse_file(&p).unwrap().distributed, want);
    assert_eq!(parse_file_reference(&p).unwrap().distributed, want);
    let dir = std::env::temp_dir().join(format!("sdpa-ident-dist-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (i, v) in [r#""oops""#, r#"{"rank": "1", "world_size": 2}"#, "[1, 2]"].iter().enumerate() {
        let f = dir.join(format!("t{i}.json"));
        std::fs::write(
            &f,
            format!(r#"{{"distributedInfo": {v}, "traceEvents": [{{"ph": "X", "name": "x", "ts": 1}}]}}"#),
        )
        .unwrap();
        for parsed in [parse_file(&f).unwrap(), parse_file_reference(&f).unwrap()] {
            let d = parsed.distributed.unwrap();
            assert_eq!(d.rank, None, "{v}");
            assert_eq!(d.world_size, if i == 1 { Some(2) } else { None }, "{v}");
        }
    }
}
