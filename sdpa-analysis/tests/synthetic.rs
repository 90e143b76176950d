//! Small hand-built traces for cases the recorded fixtures do not cover, chosen where TraceLens is known to
//! go wrong (ANCHORS.md): causal attention with Sq != Sk (TraceLens raises and drops the op), 4-byte
//! elements (TraceLens assumes 2), SDPA falling back to the math path, flash-attn's BSHD layout, and
//! decoding judged by bandwidth.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::{analyze, op_with_kernel};
use sdpa_analysis::trace::attention::{AttnBackend, Kind, Phase};
use sdpa_analysis::trace::findings::Severity;
use sdpa_core::cost::pairs_per_head;
use sdpa_core::Mask;

#[test]
fn flash_attn_bshd_causal_with_sq_ne_sk_is_costed_exactly() {
    // flash_attn::_flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, ...): BSHD, causal is
    // bottom-right. B=2, Sq=512, Sk=2048, Hq=16, Hkv=4, D=128.
    let args = r#"{"Input Dims": [[2, 512, 16, 128], [2, 2048, 4, 128], [2, 2048, 4, 128], [], [], [], [], []],
        "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar"],
        "Concrete Inputs": ["", "", "", "0.0", "0.08838834764831845", "True", "-1", "-1"]}"#;
    let r = analyze(
        "fa-br",
        &op_with_kernel("flash_attn::_flash_attn_forward", args, "void flash::flash_fwd_kernel<>", 100.0),
    );
    let op = &r.attention_ops[0];
    assert_eq!((op.kind, op.phase, op.backend), (Kind::Fused, Phase::Fwd, AttnBackend::FlashAttn));
    assert_eq!(
        (op.b, op.hq, op.hkv, op.sq, op.sk, op.d),
        (Some(2), Some(16), Some(4), Some(512), Some(2048), Some(128))
    );
    assert_eq!(op.mask, "causal-br");
    let pairs = pairs_per_head(512, 2048, &Mask::CausalBottomRight) as f64;
    assert_eq!(op.flops, Some(2.0 * 32.0 * pairs * 256.0));
    assert!(op.q_bshd_strides, "flash-attn takes BSHD: the replay uses that layout");
    let replay = r.findings.iter().find_map(|f| f.replay.as_ref()).unwrap();
    assert_eq!(replay.spec.masks, ["causal-br"]);
    assert_eq!(replay.spec.layouts, [sdpa_core::Layout::Bshd]);
}

#[test]
fn fp32_bytes_use_four_byte_elements() {
    let args = r#"{"Input Dims": [[1, 8, 1024, 64], [1, 8, 1024, 64], [1, 8, 1024, 64], [], [], [], [], []],
        "Input type": ["float", "float", "float", "", "Scalar", "Scalar", "Scalar", "Scalar"],
        "Concrete Inputs": ["", "", "", "", "0.", "False", "", "False"]}"#;
    let r = analyze(
        "fp32",
        &op_with_kernel("aten::scaled_dot_product_attention", args, "fmha_cutlassF_f32_aligned_64x64_rf_sm80", 400.0),
    );
    let op = &r.attention_ops[0];
    assert_eq!(op.backend, AttnBackend::Efficient, "from the kernel name");
    assert_eq!(op.dtype.as_deref(), Some("f32"));
    assert_eq!(op.bytes, Some(4.0 * 8.0 * 1024.0 * 64.0 * 4.0));
    // fp32 is judged against the fp32 (non-tensor-core) peak: 66.9 TFLOP/s on H100 SXM.
    let tflops = 4.0 * 8.0 * 1024.0 * 1024.0 * 64.0 / 400e-6 / 1e12;
    assert!((op.efficiency.unwrap() - tflops / 66.9).abs() < 1e-9);
}

#[test]
fn sdpa_math_fallback_is_path_a_and_not_counted_twice() {
    // SDPA -> _scaled_dot_product_attention_math -> bmm, softmax, bmm: fp32 with GQA (Hq=32, Hkv=8).
    let qk = r#"{"Input Dims": [[1, 32, 4096, 128], [1, 32, 128, 4096]], "Input type": ["float", "float"]}"#;
    let sm = r#"{"Input Dims": [[1, 32, 4096, 4096], [], []], "Input type": ["float", "Scalar", "Scalar"], "Concrete Inputs": ["", "-1", ""]}"#;
    let pv = r#"{"Input Dims": [[1, 32, 4096, 4096], [1, 32, 4096, 128]], "Input type": ["float", "float"]}"#;
    let sdpa = r#"{"Input Dims": [[1, 32, 4096, 128], [1, 8, 4096, 128], [1, 8, 4096, 128], [], [], [], [], []],
        "Input type": ["float", "float", "float", "", "Scalar", "Scalar", "Scalar", "Scalar"],
        "Concrete Inputs": ["", "", "", "", "0.", "True", "", "True"]}"#;
    let ev = format!(
        r#"{{"ph": "X", "cat": "cpu_op", "name": "aten::scaled_dot_product_attention", "pid": 1, "tid": 1, "ts": 100, "dur": 100, "args": {sdpa}}},
           {{"ph": "X", "cat": "cpu_op", "name": "aten::_scaled_dot_product_attention_math", "pid": 1, "tid": 1, "ts": 101, "dur": 98, "args": {sdpa}}},
           {{"ph": "X", "cat": "cpu_op", "name": "aten::matmul", "pid": 1, "tid": 1, "ts": 110, "dur": 10, "args": {qk}}},
           {{"ph": "X", "cat": "cpu_op", "name": "aten::_softmax", "pid": 1, "tid": 1, "ts": 130, "dur": 10, "args": {sm}}},
           {{"ph": "X", "cat": "cpu_op", "name": "aten::matmul", "pid": 1, "tid": 1, "ts": 150, "dur": 10, "args": {pv}}},
           {{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 111, "dur": 1, "args": {{"correlation": 1}}}},
           {{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 131, "dur": 1, "args": {{"correlation": 2}}}},
           {{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 151, "dur": 1, "args": {{"correlation": 3}}}},
           {{"ph": "X", "cat": "kernel", "name": "sgemm", "pid": 0, "tid": 7, "ts": 300, "dur": 4000, "args": {{"correlation": 1}}}},
           {{"ph": "X", "cat": "kernel", "name": "cunn_SoftMaxForward", "pid": 0, "tid": 7, "ts": 4400, "dur": 5000, "args": {{"correlation": 2}}}},
           {{"ph": "X", "cat": "kernel", "name": "sgemm", "pid": 0, "tid": 7, "ts": 9500, "dur": 4300, "args": {{"correlation": 3}}}}"#
    );
    let r = analyze("math", &ev);
    assert_eq!(r.attention_ops.len(), 1, "the bmm-softmax-bmm inside SDPA is not a second, unfused call");
    let op = &r.attention_ops[0];
    assert_eq!((op.kind, op.backend), (Kind::Fused, AttnBackend::Math));
    assert_eq!((op.hq, op.hkv), (Some(32), Some(8)));
    assert_eq!(op.total_us, 13300.0);
    let f = r.findings.iter().find(|f| f.path == "A").unwrap();
    assert!(f.title.contains("math"), "{}", f.title);
    assert!(f.detail.contains("fp32 with GQA"), "{}", f.detail);
}

#[test]
fn decoding_is_judged_by_bandwidth_and_short_prefill_is_not_flagged() {
    // Decode: B=8, Hq=Hkv=32, Sq=1, Sk=4096, D=128 in 190 µs (cuDNN on H100 in ANCHORS.md): within band.
    let dec = r#"{"Input Dims": [[8, 32, 1, 128], [8, 32, 4096, 128], [8, 32, 4096, 128], [], [], [], [], []],
        "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "", "Scalar", "Scalar", "Scalar", "Scalar"],
        "Concrete Inputs": ["", "", "", "", "0.", "False", "", "False"]}"#;
    let r = analyze(
        "decode",
        &op_with_kernel(
            "aten::scaled_dot_product_attention",
            dec,
            "cudnn_generated_fort_native_sdpa_sm90_flash_fprop",
            190.0,
        ),
    );
    let op = &r.attention_ops[0];
    assert!(op.decode);
    assert_eq!(op.bound, Some(sdpa_core::Bound::Memory));
    assert_eq!(op.band_status, Some("within"));
    assert!(!r.findings.iter().any(|f| f.path == "B"));

    // Prefill at S=128 (B=1, H=1, D=64) in 8.1 µs: 1 % of peak, expected at N < 512, reported as info.
    let short = r#"{"Input Dims": [[1, 1, 128, 64], [1, 1, 128, 64], [1, 1, 128, 64], [], [], [], [], []],
        "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "", "Scalar", "Scalar", "Scalar", "Scalar"],
        "Concrete Inputs": ["", "", "", "", "0.", "False", "", "False"]}"#;
    let r = analyze(
        "short",
        &op_with_kernel("aten::scaled_dot_product_attention", short, "void pytorch_flash::flash_fwd_kernel<>", 8.1),
    );
    let f = r.findings.iter().find(|f| f.title.starts_with("Short sequences")).unwrap();
    assert_eq!((f.severity, f.path), (Severity::Info, "-"));
    assert!(!r.findings.iter().any(|f| f.path == "B"));
}

#[test]
fn unfused_backward_is_found_through_sequence_numbers() {
    // Forward chain on thread 1 (seq 10..13), its autograd nodes on thread 2 with the same numbers, and an
    // unrelated AddmmBackward0 (seq 99) that must not count.
    let qk = r#""Input Dims": [[2, 4, 256, 64], [2, 4, 64, 256]], "Input type": ["c10::Half", "c10::Half"]"#;
    let sc = r#""Input Dims": [[2, 4, 256, 256], []], "Input type": ["c10::Half", "double"]"#;
    let sm = r#""Input Dims": [[2, 4, 256, 256], [], []], "Input type": ["c10::Half", "Scalar", ""]"#;
    let pv = r#""Input Dims": [[2, 4, 256, 256], [2, 4, 256, 64]], "Input type": ["c10::Half", "c10::Half"]"#;
    let mut ev = Vec::new();
    let mut corr = 0;
    let mut op = |ev: &mut Vec<String>, name: &str, tid: u32, ts: f64, seq: i64, args: &str, kernel_us: f64| {
        corr += 1;
        ev.push(format!(
            r#"{{"ph": "X", "cat": "cpu_op", "name": "{name}", "pid": 1, "tid": {tid}, "ts": {ts}, "dur": 8, "args": {{"Sequence number": {seq}{}{args}}}}}"#,
            if args.is_empty() { "" } else { ", " }
        ));
        if kernel_us > 0.0 {
            ev.push(format!(
                r#"{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": {tid}, "ts": {}, "dur": 1, "args": {{"correlation": {corr}}}}},
                   {{"ph": "X", "cat": "kernel", "name": "k{corr}", "pid": 0, "tid": 7, "ts": {}, "dur": {kernel_us}, "args": {{"correlation": {corr}}}}}"#,
                ts + 1.0,
                1000.0 + ts
            ));
        }
    };
    op(&mut ev, "aten::matmul", 1, 100.0, 10, qk, 10.0);
    op(&mut ev, "aten::mul", 1, 110.0, 11, sc, 2.0);
    op(&mut ev, "aten::softmax", 1, 120.0, 12, sm, 3.0);
    op(&mut ev, "aten::matmul", 1, 130.0, 13, pv, 10.0);
    op(&mut ev, "BmmBackward0", 2, 500.0, 13, "", 20.0);
    op(&mut ev, "SoftmaxBackward0", 2, 510.0, 12, "", 6.0);
    op(&mut ev, "MulBackward0", 2, 520.0, 11, "", 4.0);
    op(&mut ev, "BmmBackward0", 2, 530.0, 10, "", 20.0);
    op(&mut ev, "AddmmBackward0", 2, 540.0, 99, "", 50.0);
    let r = analyze("eager-bwd", &ev.join(",\n"));
    let fwd = r.attention_ops.iter().find(|o| o.phase == Phase::Fwd).unwrap();
    let bwd = r.attention_ops.iter().find(|o| o.phase == Phase::Bwd).unwrap();
    assert_eq!((fwd.kind, bwd.kind), (Kind::Unfused, Kind::Unfused));
    assert_eq!(fwd.total_us, 25.0);
    assert_eq!(bwd.total_us, 50.0, "the four backward nodes, not AddmmBackward0");
    assert_eq!(bwd.parts.len(), 4);
    assert_eq!((bwd.b, bwd.hq, bwd.sq, bwd.d), (Some(2), Some(4), Some(256), Some(64)));
    assert_eq!(r.summary.unfused_time_us, 75.0);
}
