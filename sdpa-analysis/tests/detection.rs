//! Attention detection on the real H100 traces in `tests/data/` (recorded from small transformer models;
//! file names say model, attention implementation, dtype and sequence length). Expected values were read
//! from the traces themselves (python's json module over the events), not from our own output.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use sdpa_analysis::trace::attention::{detect, AttentionCall, AttnBackend, Kind, MaskInfo, Phase};
use sdpa_analysis::trace::kineto::parse_file;
use sdpa_analysis::trace::tree::OpTree;
use sdpa_core::Shape;
use std::path::PathBuf;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

fn calls(name: &str) -> Vec<AttentionCall> {
    let trace = parse_file(&data(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let tree = OpTree::build(&trace);
    assert_eq!(tree.links.unlinked, 0, "{name}: every GPU activity links to an op");
    detect(&tree)
}

/// What one group of attention calls in a trace must look like.
struct Expect {
    kind: Kind,
    phase: Phase,
    backend: AttnBackend,
    count: usize,
    shape: Shape,
    dtype: &'static str,
    mask: MaskInfo,
    /// Innermost module of each call, in time order (empty when the trace has no module frames).
    modules: &'static [&'static str],
}

fn check(file: &str, expected: &[Expect]) {
    let all = calls(file);
    let mut seen = 0;
    for e in expected {
        let group: Vec<&AttentionCall> = all.iter().filter(|c| c.kind == e.kind && c.phase == e.phase).collect();
        assert_eq!(group.len(), e.count, "{file}: number of {:?} {:?} calls", e.kind, e.phase);
        for (i, c) in group.iter().enumerate() {
            assert_eq!(c.backend, e.backend, "{file} call {i}");
            assert_eq!(c.shape, Some(e.shape), "{file} call {i}");
            assert_eq!(c.dtype.as_deref(), Some(e.dtype), "{file} call {i}");
            assert_eq!(c.mask, e.mask, "{file} call {i}");
            assert!(c.gpu_us > 0.0, "{file} call {i}: kernel time found");
            if !e.modules.is_empty() {
                assert_eq!(c.module.last().map(String::as_str), Some(e.modules[i]), "{file} call {i}: module");
            } else {
                assert!(c.module.is_empty(), "{file}: no module frames in this trace");
            }
        }
        seen += group.len();
    }
    assert_eq!(seen, all.len(), "{file}: no other attention calls");
}

#[test]
fn llama_sdpa_training_has_cudnn_forward_and_backward_per_layer() {
    // 2 decoder layers, B=2, 8 heads (no GQA), S=1024, D=64, bf16, is_causal=True, cuDNN on H100.
    let shape = Shape::new(2, 8, 1024, 1024, 64);
    check(
        "llama_sdpa_train_bf16_S1024.json.gz",
        &[
            Expect {
                kind: Kind::Fused,
                phase: Phase::Fwd,
                backend: AttnBackend::Cudnn,
                count: 2,
                shape,
                dtype: "c10::BFloat16",
                mask: MaskInfo::CausalTopLeft,
                modules: &["LlamaAttention_0", "LlamaAttention_1"],
            },
            // Backward runs on the autograd thread in reverse layer order; its module comes from the
            // forward call with the same sequence number.
            Expect {
                kind: Kind::Fused,
                phase: Phase::Bwd,
                backend: AttnBackend::Cudnn,
                count: 2,
                shape,
                dtype: "c10::BFloat16",
                mask: MaskInfo::CausalTopLeft,
                modules: &["LlamaAttention_1", "LlamaAttention_0"],
            },
        ],
    );
}

#[test]
fn qwen2_sdpa_inference_reads_gqa_from_k() {
    // 3 layers, B=2, Hq=14, Hkv=2 (enable_gqa=True), S=2048, D=64, bf16, causal, cuDNN.
    let shape = Shape { b: 2, hq: 14, hkv: 2, sq: 2048, sk: 2048, d: 64, dv: 64 };
    check(
        "qwen2_sdpa_bf16_S2048.json.gz",
        &[Expect {
            kind: Kind::Fused,
            phase: Phase::Fwd,
            backend: AttnBackend::Cudnn,
            count: 3,
            shape,
            dtype: "c10::BFloat16",
            mask: MaskInfo::CausalTopLeft,
            modules: &["Qwen2Attention_0", "Qwen2Attention_1", "Qwen2Attention_2"],
        }],
    );
}

#[test]
fn bert_eager_attention_is_found_unfused_per_layer() {
    // 4 layers of matmul -> mul -> softmax -> dropout -> matmul, B=32, 12 heads, S=128, D=64, fp16, no mask.
    check(
        "bert_eager_fp16_S128.json.gz",
        &[Expect {
            kind: Kind::Unfused,
            phase: Phase::Fwd,
            backend: AttnBackend::Eager,
            count: 4,
            shape: Shape::new(32, 12, 128, 128, 64),
            dtype: "c10::Half",
            mask: MaskInfo::None,
            modules: &["BertSelfAttention_0", "BertSelfAttention_1", "BertSelfAttention_2", "BertSelfAttention_3"],
        }],
    );
}

#[test]
fn mistral_eager_without_stacks_still_finds_gqa_and_the_mask() {
    // 3 layers, recorded without stacks or modules. K/V are repeat_kv-expanded from 8 to 16 heads; an
    // additive [2, 1, 1024, 1024] mask is added before a softmax that upcasts to f32.
    check(
        "mistral_eager_bf16_S1024_nostack.json.gz",
        &[Expect {
            kind: Kind::Unfused,
            phase: Phase::Fwd,
            backend: AttnBackend::Eager,
            count: 3,
            shape: Shape { b: 2, hq: 16, hkv: 8, sq: 1024, sk: 1024, d: 64, dv: 64 },
            dtype: "c10::BFloat16",
            mask: MaskInfo::Explicit { values: "additive".into(), dims: vec![2, 1, 1024, 1024] },
            modules: &[],
        }],
    );
    for c in calls("mistral_eager_bf16_S1024_nostack.json.gz") {
        let roles: Vec<&str> = c.parts.iter().map(|p| p.role).collect();
        for r in ["qk", "scale", "mask", "softmax", "cast", "pv"] {
            assert!(roles.contains(&r), "part {r} in {roles:?}");
        }
        assert!(c.notes.iter().any(|n| n.contains("f32")), "{:?}", c.notes);
        // The chain's parts account for all of its kernel time.
        let parts: f64 = c.parts.iter().map(|p| p.gpu_us).sum();
        assert!((parts - c.gpu_us).abs() < 1e-6 * c.gpu_us.max(1.0), "{parts} vs {}", c.gpu_us);
    }
}

#[test]
fn fused_kernel_time_is_the_cudnn_kernels_of_the_call() {
    // llama forward: the cuDNN fprop kernel (13.09 µs mean in the trace) plus a ~0.75 µs memset.
    let fwd: Vec<AttentionCall> =
        calls("llama_sdpa_train_bf16_S1024.json.gz").into_iter().filter(|c| c.phase == Phase::Fwd).collect();
    for c in &fwd {
        let main = c.kernels.iter().find(|(k, _)| k.contains("sdpa_sm90_flash_fprop")).map(|k| k.1);
        assert!(main.is_some_and(|t| (12.5..14.0).contains(&t)), "{:?}", c.kernels);
        assert!(c.kernels.iter().any(|(k, _)| k.starts_with("Memset")));
        assert_eq!(c.grid_blocks, Some(128));
        // Q is a [B, S, H, D] tensor transposed to BHSD (strides 524288, 64, 512, 1).
        assert!(c.q_bshd_strides);
    }
}
