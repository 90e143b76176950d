//! The TraceLens-style directory contract: read `category_data/sdpa_fwd_ops.csv` and
//! `metadata/sdpa_fwd_metadata.json` (real outputs of TraceLens on our fixture traces), write
//! `category_findings/sdpa_fwd_findings.md`, and get the same ops as from the trace itself.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::copy_dir;

use sdpa_analysis::trace::attention::AttnBackend;
use sdpa_analysis::trace::tracelens;
use sdpa_analysis::{analyze_path, Options};
use std::path::PathBuf;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

#[test]
fn contract_round_trip_matches_the_trace() {
    for (name, layers) in [("qwen2_sdpa_bf16_S2048", 3), ("llama_sdpa_train_bf16_S1024", 2)] {
        let dir = std::env::temp_dir().join(format!("sdpa-tl-{}-{name}", std::process::id()));
        copy_dir(&data("tracelens").join(name), &dir);
        let from_csv = tracelens::analyze_dir(&dir, &Options::default()).unwrap();
        assert_eq!(from_csv.device.key.as_deref(), Some("h100-sxm"), "platform H100_SXM");
        assert_eq!(from_csv.attention_ops.len(), 1, "{name}: one forward SDPA row");
        let op = &from_csv.attention_ops[0];
        // cuDNN's kernel is recognised (TraceLens files its time under "other").
        assert_eq!(op.backend, AttnBackend::Cudnn);
        assert!(op.fused_kernel);
        assert_eq!(op.count, layers);
        assert_eq!(op.causal, Some(true));

        let from_trace = analyze_path(&data(&format!("{name}.json.gz")), &Options::default()).unwrap();
        let t = from_trace.attention_ops.iter().find(|o| o.phase == op.phase).unwrap();
        assert_eq!((op.b, op.hq, op.hkv, op.sq, op.sk, op.d), (t.b, t.hq, t.hkv, t.sq, t.sk, t.d));
        assert_eq!(op.flops, t.flops, "same exact causal FLOPs");
        // TraceLens' kernel time covers the same kernels; allow for its rounding.
        assert!((op.total_us - t.total_us).abs() < 0.5, "{} vs {}", op.total_us, t.total_us);
        assert_eq!(
            op.module,
            "LlamaForCausalLM/LlamaModel/LlamaDecoderLayer/LlamaAttention"
                .replace("Llama", if name.starts_with("qwen") { "Qwen2" } else { "Llama" })
        );

        let out = tracelens::write_findings(&dir, &from_csv).unwrap();
        assert_eq!(out, dir.join("category_findings/sdpa_fwd_findings.md"));
        let md = std::fs::read_to_string(out).unwrap();
        assert!(md.contains("# Attention findings") && md.contains("sdpa bench --backend cuda"));
    }
}

#[test]
fn backward_category_takes_the_shape_from_perf_params() {
    // The bwd row is the autograd node (only the gradient's dims): shape and causal come from perf_params.
    let dir = data("tracelens").join("llama_sdpa_train_bf16_S1024");
    assert!(tracelens::has_category(&dir, "sdpa_bwd"));
    let r = tracelens::analyze_category(&dir, "sdpa_bwd", &Options::default()).unwrap();
    let op = &r.attention_ops[0];
    assert_eq!((op.phase, op.backend, op.count), (sdpa_analysis::trace::attention::Phase::Bwd, AttnBackend::Cudnn, 2));
    assert_eq!((op.b, op.hq, op.sq, op.d, op.causal), (Some(2), Some(8), Some(1024), Some(64), Some(true)));
    let from_trace = analyze_path(&data("llama_sdpa_train_bf16_S1024.json.gz"), &Options::default()).unwrap();
    let t = from_trace.attention_ops.iter().find(|o| o.phase == op.phase).unwrap();
    assert_eq!(op.flops, t.flops);
    assert!((op.total_us - t.total_us).abs() < 0.5, "{} vs {}", op.total_us, t.total_us);
}

#[test]
fn broken_contract_inputs_are_clear_errors() {
    let dir = std::env::temp_dir().join(format!("sdpa-tl-bad-{}", std::process::id()));
    let e = tracelens::analyze_dir(&dir, &Options::default()).unwrap_err().to_string();
    assert!(e.contains("sdpa_fwd_ops.csv"), "{e}");
    std::fs::create_dir_all(dir.join("category_data")).unwrap();
    std::fs::write(dir.join("category_data/sdpa_fwd_ops.csv"), "name,foo\naten::x,1\n").unwrap();
    let e = tracelens::analyze_dir(&dir, &Options::default()).unwrap_err().to_string();
    assert!(e.contains("Input Dims"), "{e}");
}
