//! End-to-end reports on the real traces: the JSON contract, GPU-time accounting (checked against sums
//! taken with python over the same files), the perf model and the findings.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use sdpa_analysis::{analyze_path, Options, TraceReport};
use sdpa_core::BenchRecord;
use serde_json::Value;
use std::path::PathBuf;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

fn report(name: &str) -> TraceReport {
    analyze_path(&data(name), &Options::default()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs().max(1e-9)
}

#[test]
fn json_has_the_contract_fields() {
    let r = report("qwen2_sdpa_bf16_S2048.json.gz");
    let v: Value = serde_json::to_value(&r).unwrap();
    assert!(v["device"]["key"] == "h100-sxm", "deviceProperties 'NVIDIA H100 80GB HBM3' matched");
    for k in ["total_gpu_time_us", "attention_time_us", "attention_share"] {
        assert!(v["summary"][k].is_number(), "summary.{k}");
    }
    let op = &v["attention_ops"][0];
    for k in [
        "kind",
        "phase",
        "backend",
        "module",
        "b",
        "hq",
        "hkv",
        "sq",
        "sk",
        "d",
        "dtype",
        "causal",
        "count",
        "total_us",
        "mean_us",
        "tflops",
        "tbps",
        "efficiency",
        "expected_band",
        "bound",
    ] {
        assert!(!op[k].is_null(), "attention_ops[0].{k} present: {op}");
    }
    assert_eq!(op["kind"], "fused");
    assert_eq!(op["phase"], "fwd");
    assert_eq!(op["backend"], "cudnn");
    assert_eq!(op["dtype"], "bf16");
    assert_eq!(op["causal"], true);
    assert_eq!(op["hkv"], 2);
    for f in v["findings"].as_array().unwrap() {
        for k in ["severity", "path", "title", "detail"] {
            assert!(f[k].is_string(), "finding.{k}");
        }
        assert!(f.get("replay").is_some());
    }
}

#[test]
fn gpu_time_matches_the_trace() {
    // Sums of kernel + memcpy + memset durations and of the attention kernels, taken with python's json
    // module over the same files (attention: cuDNN sdpa kernels and their cudnn::fusion helpers; the
    // reports add the memsets launched inside the SDPA calls).
    for (file, total, att_kernels) in [
        ("llama_sdpa_train_bf16_S1024.json.gz", 3306.356, 104.095),
        ("qwen2_sdpa_bf16_S2048.json.gz", 1607.564, 152.194),
        ("bert_eager_fp16_S128.json.gz", 997.609, 0.0),
    ] {
        let r = report(file);
        assert!(close(r.summary.total_gpu_time_us, total, 1e-6), "{file}: {}", r.summary.total_gpu_time_us);
        if att_kernels > 0.0 {
            let fused = r.summary.fused_time_us;
            assert!(fused >= att_kernels && fused < att_kernels + 5.0, "{file}: fused {fused}");
            assert_eq!(r.summary.unfused_time_us, 0.0);
        }
    }
}

#[test]
fn perf_model_uses_exact_causal_flops_and_real_bytes() {
    let r = report("qwen2_sdpa_bf16_S2048.json.gz");
    let op = &r.attention_ops[0];
    // B=2, Hq=14, causal S=2048: 2·B·Hq·S(S+1)/2·(D+Dv) FLOPs; bytes with Hkv=2 at 2 bytes.
    let flops = 2.0 * 28.0 * (2048.0 * 2049.0 / 2.0) * 128.0;
    assert_eq!(op.flops, Some(flops));
    let bytes = 2.0 * (14.0 * 2048.0 * 128.0 + 2.0 * 2048.0 * 128.0) * 2.0;
    assert_eq!(op.bytes, Some(bytes));
    let tflops = flops / (op.mean_us * 1e-6) / 1e12;
    assert!(close(op.tflops.unwrap(), tflops, 1e-9));
    // Efficiency against the H100 SXM bf16 dense peak (989.4), compute-bound at this length.
    assert!(close(op.efficiency.unwrap(), tflops / 989.4, 1e-6));
    assert_eq!(op.bound, Some(sdpa_core::Bound::Compute));
    let band = op.expected_band.as_ref().unwrap();
    assert_eq!((band.low, band.high), (0.40, 0.60), "N = 2048 row of the seed table");
    assert_eq!(op.scale, Some(0.125), "from Concrete Inputs");
}

#[test]
fn unfused_attention_is_path_a_with_a_replay() {
    let r = report("mistral_eager_bf16_S1024_nostack.json.gz");
    let f = r.findings.iter().find(|f| f.path == "A").expect("a Path A finding");
    assert_eq!(f.severity, sdpa_analysis::trace::findings::Severity::High, "56 % of GPU time");
    let sp = f.expected_speedup.as_ref().unwrap();
    assert_eq!((sp.low, sp.high), (3.0, 10.0));
    assert!(sp.source.contains("seed range"), "labelled as the seed's range: {}", sp.source);
    assert!(f.detail.contains("enable_gqa"), "GQA advice: {}", f.detail);
    let rp = f.replay.as_ref().unwrap();
    assert_eq!(
        rp.command,
        "sdpa bench --backend cuda --kernel unfused,fa2 --dtype bf16 --shape 2,16,8,1024,1024,64 --mask additive"
    );
    assert_eq!(rp.spec.shapes[0].hkv, 8);
    // The trace has no stacks: the report says what that costs.
    assert!(r.missing.iter().any(|m| m.contains("without Python stacks")), "{:?}", r.missing);
}

#[test]
fn measured_ratio_replaces_the_seed_range() {
    let rec = |kernel: &str, ms: f64| -> BenchRecord {
        serde_json::from_value(serde_json::json!({
            "backend": "cuda", "kernel": kernel, "device": "NVIDIA H100 80GB HBM3", "dtype": "f16",
            "shape": {"b": 32, "hq": 12, "hkv": 12, "sq": 128, "sk": 128, "d": 64, "dv": 64},
            "mask": "none", "time_ms": {"median": ms, "min": ms, "max": ms}, "tflops": 0.0, "gbps": 0.0
        }))
        .unwrap()
    };
    let opts =
        Options { bench: vec![rec("unfused", 0.060), rec("fa2", 0.020), rec("fa1", 0.030)], ..Options::default() };
    let r = analyze_path(&data("bert_eager_fp16_S128.json.gz"), &opts).unwrap();
    let f = r.findings.iter().find(|f| f.path == "A").unwrap();
    let sp = f.expected_speedup.as_ref().unwrap();
    assert!(close(sp.low, 3.0, 1e-9) && sp.source.starts_with("measured"), "{sp:?}");
    assert!(sp.source.contains("fa2"), "the fastest fused kernel: {}", sp.source);
}

#[test]
fn cudnn_is_reported_as_flash_not_as_a_migration_target() {
    let r = report("llama_sdpa_train_bf16_S1024.json.gz");
    assert!(r.summary.fused_kernels_in_use);
    assert!(r.findings.iter().any(|f| f.title.starts_with("Flash attention is in use")));
    assert!(!r.findings.iter().any(|f| f.path == "A"), "nothing to migrate");
    // Backward ops are modelled too (TraceLens lists them separately without a module).
    let bwd = r.attention_ops.iter().find(|o| o.phase == sdpa_analysis::trace::attention::Phase::Bwd).unwrap();
    assert_eq!(bwd.module, "LlamaForCausalLM/LlamaModel/LlamaDecoderLayer/LlamaAttention");
    assert_eq!(bwd.count, 2);
}

#[test]
fn device_override_changes_the_roofline() {
    let base = report("qwen2_sdpa_bf16_S2048.json.gz");
    let a100 = analyze_path(
        &data("qwen2_sdpa_bf16_S2048.json.gz"),
        &Options { device: Some("a100-80gb".into()), ..Options::default() },
    )
    .unwrap();
    assert_eq!(a100.device.key.as_deref(), Some("a100-80gb"));
    assert_eq!(a100.device.source, "override");
    let (e0, e1) = (base.attention_ops[0].efficiency.unwrap(), a100.attention_ops[0].efficiency.unwrap());
    assert!(close(e1 / e0, 989.4 / 312.0, 1e-6), "{e0} {e1}");
}

#[test]
fn renderers_cover_every_op() {
    let r = report("llama_sdpa_train_bf16_S1024.json.gz");
    let csv = sdpa_analysis::trace::printers::csv::render(&r);
    assert_eq!(csv.lines().count(), 1 + r.attention_ops.len());
    assert!(csv.lines().nth(1).unwrap().starts_with("fused,bwd,cudnn,true,"));
    let md = sdpa_analysis::trace::printers::markdown::render(&r);
    assert!(md.contains("| fused | fwd | cudnn |") && md.contains("sdpa bench --backend cuda"));
    let txt = sdpa_analysis::trace::printers::text::render(&r);
    assert!(txt.contains("LlamaAttention") && txt.contains("findings:"));
}

#[test]
fn path_b_quotes_benchmark_records_for_the_same_shape() {
    // Records on qwen2's shape: the finding lists them fastest first, with TFLOP/s from the same FLOPs.
    let rec = |backend: &str, kernel: &str, ms: f64| -> BenchRecord {
        serde_json::from_value(serde_json::json!({
            "backend": backend, "kernel": kernel, "device": "NVIDIA H100 80GB HBM3", "dtype": "bf16",
            "shape": {"b": 2, "hq": 14, "hkv": 2, "sq": 2048, "sk": 2048, "d": 64, "dv": 64},
            "mask": "causal", "time_ms": {"median": ms, "min": ms, "max": ms}, "tflops": 0.0, "gbps": 0.0
        }))
        .unwrap()
    };
    let bench = vec![rec("cuda", "fa2", 0.060), rec("pytorch", "cudnn", 0.040), rec("cuda", "fa2", 0.1)];
    let r = analyze_path(&data("qwen2_sdpa_bf16_S2048.json.gz"), &Options { bench, ..Options::default() }).unwrap();
    // cuDNN at 29.5 % of peak on this shape is near the frontier (issue 27): the info finding that says so
    // quotes the records too.
    let f = r.findings.iter().find(|f| f.op_index == Some(0) && f.title.contains("near the frontier")).unwrap();
    assert!(!r.findings.iter().any(|f| f.path == "B"), "not flagged below a band");
    let at = |s: &str| f.detail.find(s).unwrap_or_else(|| panic!("{s} in {}", f.detail));
    assert!(at("pytorch/cudnn 40.0 µs") < at("cuda/fa2 60.0 µs"), "fastest first");
}

#[test]
fn bench_results_load_every_format_sdpa_bench_writes() {
    // `sdpa bench` writes a bench file (an object with `records` and `skipped`); `sdpa run --json` one record;
    // older tools a plain array. The analyzer reads all of them through `sdpa report`'s reader.
    let rec = serde_json::json!({
        "backend": "cuda", "kernel": "unfused", "device": "NVIDIA H100 80GB HBM3", "dtype": "f16",
        "shape": {"b": 32, "hq": 12, "hkv": 12, "sq": 128, "sk": 128, "d": 64, "dv": 64},
        "mask": "none", "time_ms": {"median": 0.06, "min": 0.05, "max": 0.07}, "tflops": 1.0, "gbps": 1.0
    });
    let dir = std::env::temp_dir().join(format!("sdpa-analysis-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bench.json");
    let bench_file = serde_json::json!({"format": "sdpa-bench-v1", "records": [rec.clone()], "skipped": []});
    std::fs::write(&file, bench_file.to_string()).unwrap();
    let array = dir.join("array.json");
    std::fs::write(&array, serde_json::json!([rec.clone(), rec.clone()]).to_string()).unwrap();
    let one = dir.join("one.json");
    std::fs::write(&one, rec.to_string()).unwrap();
    let recs = sdpa_analysis::results::evidence::load(&[&file, &array, &one]).unwrap();
    assert_eq!(recs.len(), 4);
    assert!(recs.iter().all(|r| r.kernel == "unfused" && r.time_ms.median == 0.06));

    // A damaged file is an error that names the file, not a panic and not an empty result.
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{\"records\": [{\"backend\": ").unwrap();
    let err = sdpa_analysis::results::evidence::load(&[&bad]).unwrap_err().to_string();
    assert!(err.contains("bad.json"), "{err}");
    let missing = sdpa_analysis::results::evidence::load(&[dir.join("nope.json")]).unwrap_err().to_string();
    assert!(missing.contains("nope.json"), "{missing}");
    std::fs::remove_dir_all(&dir).ok();
}
