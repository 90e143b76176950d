//! Sliding windows, softcaps and ALiBi in traces (issue 22): FlexAttention and a Gemma-2-style eager layer in a
//! real H100 trace (`tests/fixtures/flex_bf16_S2048.json.gz`, recorded by `tests/fixtures/record_flex.py`,
//! whose `.meta.json` says what each layer ran), and flash-attn's windowed / softcap / ALiBi calls in small
//! hand-built traces. Expected values come from the recipe and from the trace read with python's json module,
//! FLOPs from closed forms written out here, not from our own output.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::{analyze, op_with_kernel};
use sdpa_analysis::trace::attention::{detect, AttentionCall, AttnBackend, Kind, MaskInfo, Phase};
use sdpa_analysis::trace::kineto::parse_file;
use sdpa_analysis::trace::tree::OpTree;
use sdpa_analysis::{analyze_path, Options};
use sdpa_core::{Diagonal, Shape, Window};
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

const TRACE: &str = "flex_bf16_S2048.json.gz";

/// The recipe's ground truth: the window and the layers it recorded.
fn meta() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixture("flex_bf16_S2048.meta.json")).unwrap()).unwrap()
}

fn calls() -> Vec<AttentionCall> {
    let trace = parse_file(&fixture(TRACE)).unwrap();
    let tree = OpTree::build(&trace);
    assert_eq!(tree.links.unlinked, 0, "every GPU activity links to an op");
    detect(&tree)
}

/// B=1, Hq=8, Hkv=4 (GQA), S=2048, D=128, as the recipe's `shape`.
fn shape() -> Shape {
    let m = meta();
    let s = &m["shape"];
    let n = |k: &str| s[k].as_u64().unwrap() as usize;
    Shape {
        b: n("batch"),
        hq: n("heads_q"),
        hkv: n("heads_kv"),
        sq: n("seq"),
        sk: n("seq"),
        d: n("head_dim"),
        dv: n("head_dim"),
    }
}

fn window_left() -> usize {
    meta()["window_left"].as_u64().unwrap() as usize
}

#[test]
fn the_recipe_recorded_every_layer() {
    let layers: Vec<String> =
        meta()["layers"].as_array().unwrap().iter().map(|l| l.as_str().unwrap().to_string()).collect();
    assert_eq!(
        layers,
        ["flex_causal", "flex_window_softcap", "sdpa_causal", "sdpa_window_mask", "eager_window_softcap"]
    );
    assert_eq!(shape(), Shape { b: 1, hq: 8, hkv: 4, sq: 2048, sk: 2048, d: 128, dv: 128 });
}

#[test]
fn flex_calls_are_found_forward_and_backward_with_their_masks() {
    let all = calls();
    let w = window_left();
    let flex = |phase| -> Vec<&AttentionCall> {
        all.iter().filter(|c| c.backend == AttnBackend::Flex && c.phase == phase).collect()
    };
    // Inference step and training step each run flex_causal then flex_window_softcap.
    let fwd = flex(Phase::Fwd);
    assert_eq!(fwd.len(), 4);
    for (i, c) in fwd.iter().enumerate() {
        assert_eq!(c.kind, Kind::Fused);
        assert_eq!(c.op, "triton_tem_fused_flex_attention_0");
        assert_eq!(c.shape, Some(shape()), "call {i}");
        assert_eq!(c.dtype.as_deref(), Some("c10::BFloat16"));
        assert_eq!(c.mask, MaskInfo::CausalTopLeft, "call {i}: q >= k in the create_block_mask ops");
        let window = if i % 2 == 1 { Some(Window::left(w)) } else { None };
        assert_eq!(c.variants.variants.window, window, "call {i}");
        if window.is_some() {
            assert_eq!(c.variants.variants.diagonal, Some(Diagonal::TopLeft));
        }
        assert!(c.notes.iter().any(|n| n.contains("score_mod")), "the softcap inside the kernel is not claimed");
        assert_eq!(c.kernels.len(), 1);
        assert!(c.gpu_us > 0.0);
    }
    // The backward runs in reverse layer order: windowed first. Each call holds its template kernel and the
    // dO·O reduction before it, and no Flex call is left without a shape.
    let bwd = flex(Phase::Bwd);
    assert_eq!(bwd.len(), 2);
    assert_eq!(bwd[0].variants.variants.window, Some(Window::left(w)));
    assert_eq!(bwd[1].variants.variants.window, None);
    for c in &bwd {
        assert_eq!(c.shape, Some(shape()));
        assert_eq!(c.mask, MaskInfo::CausalTopLeft, "the forward's mask, matched by sequence number");
        let names: Vec<&str> = c.kernels.iter().map(|k| k.0.as_str()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names.contains(&"triton_tem_fused_flex_attention_backward_1"));
        assert!(names.contains(&"triton_red_fused_flex_attention_backward_0"));
        let sum: f64 = c.kernels.iter().map(|k| k.1).sum();
        assert!((sum - c.gpu_us).abs() < 1e-9 * sum.max(1.0));
    }
    assert!(all.iter().all(|c| c.backend != AttnBackend::Flex || c.shape.is_some()));
    // The other layers are as before: cuDNN SDPA forward 4 (2 causal, 2 with the window as an explicit mask),
    // backward 2, and the eager layer's forward twice and backward once.
    let cudnn = all.iter().filter(|c| c.backend == AttnBackend::Cudnn).count();
    assert_eq!(cudnn, 6);
    let eager: Vec<&AttentionCall> = all.iter().filter(|c| c.kind == Kind::Unfused).collect();
    assert_eq!(eager.iter().map(|c| c.phase).collect::<Vec<_>>(), [Phase::Bwd, Phase::Fwd, Phase::Fwd]);
    assert_eq!(all.len(), 4 + 2 + 6 + 3);
}

#[test]
fn windowed_flex_is_costed_on_the_pairs_the_window_leaves() {
    let r = analyze_path(&fixture(TRACE), &Options::default()).unwrap();
    let w = window_left() as f64;
    let s = 2048.0;
    // Row i sees min(i + 1, W + 1) keys.
    let window_pairs = (w + 1.0) * s - w * (w + 1.0) / 2.0;
    let causal_pairs = s * (s + 1.0) / 2.0;
    let per_pair = 2.0 * 8.0 * 256.0; // 2 · B·Hq · (D + Dv)
    let op = |phase, windowed: bool| {
        r.attention_ops
            .iter()
            .find(|o| o.backend == AttnBackend::Flex && o.phase == phase && o.variants.contains("window") == windowed)
            .unwrap()
    };
    let fwd_w = op(Phase::Fwd, true);
    assert_eq!(fwd_w.variants, "window 256,0 tl");
    assert_eq!(fwd_w.mask, "causal");
    assert_eq!(fwd_w.flops, Some(per_pair * window_pairs));
    assert_eq!(op(Phase::Fwd, false).flops, Some(per_pair * causal_pairs));
    assert_eq!(op(Phase::Bwd, true).flops, Some(2.5 * per_pair * window_pairs));
    // Judged at the window's keys per row, not at Sk.
    let band = fwd_w.expected_band.as_ref().unwrap();
    assert!(band.label.contains("241 keys per row"), "{}", band.label);
    // The replay runs the same window on our kernels.
    let replay = r.findings.iter().filter_map(|f| f.replay.as_ref()).find(|p| p.command.contains("--window")).unwrap();
    assert!(replay.command.contains("--window 256,0"), "{}", replay.command);
    let json = serde_json::to_value(&r).unwrap();
    let ops = json["attention_ops"].as_array().unwrap();
    assert!(ops.iter().any(|o| o["variants"] == "window 256,0 tl" && o["backend"] == "flex"));
}

#[test]
fn gemma2_eager_attention_is_named_with_its_softcap_and_window() {
    let all = calls();
    let w = window_left();
    for c in all.iter().filter(|c| c.kind == Kind::Unfused) {
        assert_eq!(c.shape, Some(shape()), "K/V from 4 heads (repeat_kv)");
        // The mask tensor stays what the trace shows; the window is what built it.
        assert_eq!(c.mask, MaskInfo::Explicit { values: "additive".into(), dims: vec![1, 1, 2048, 2048] });
        assert_eq!(c.variants.variants.window, Some(Window::left(w)));
        assert_eq!(c.variants.variants.softcap, None, "the cap is a Python float: PyTorch records no value");
        assert!(c.variants.softcap_unrecorded);
        assert_eq!(c.variants.label(), "window 256,0 tl · softcap ?");
        if c.phase == Phase::Fwd {
            let roles: Vec<&str> = c.parts.iter().map(|p| p.role).collect();
            assert!(roles.contains(&"softcap") && roles.contains(&"softmax"), "{roles:?}");
            assert!(c.notes.iter().any(|n| n.contains("Gemma-2")), "{:?}", c.notes);
        }
    }
    let r = analyze_path(&fixture(TRACE), &Options::default()).unwrap();
    let f =
        r.findings.iter().find(|f| f.title.starts_with("Unfused Gemma-2-style (tanh softcap) attention in")).unwrap();
    assert!(f.detail.contains("FlexAttention") && f.detail.contains("softcap=cap"), "{}", f.detail);
    assert!(!f.detail.contains("is_causal=True"), "SDPA cannot take a softcap: no SDPA advice");
    let replay = f.replay.as_ref().unwrap();
    assert!(
        replay.command.ends_with("--mask none --window 256,0 --softcap 50 --diagonal tl"),
        "the window replaces the random mask; an unrecorded cap replays as Gemma 2's 50: {}",
        replay.command
    );
    assert_eq!(
        serde_json::to_value(&replay.spec.variants).unwrap(),
        serde_json::json!([{"window": {"left": 256, "right": 0}, "softcap": 50.0, "diagonal": "top-left"}])
    );
    // Costed on the window's pairs: what a fused windowed kernel would do.
    let op = &r.attention_ops[f.op_index.unwrap()];
    let pairs = 257.0 * 2048.0 - 256.0 * 257.0 / 2.0;
    assert_eq!(op.flops, Some(2.0 * 8.0 * pairs * 256.0));
}

#[test]
fn sdpa_given_a_window_mask_is_told_what_a_windowed_kernel_skips() {
    let all = calls();
    let masked: Vec<&AttentionCall> = all
        .iter()
        .filter(|c| {
            c.backend == AttnBackend::Cudnn && c.phase == Phase::Fwd && matches!(c.mask, MaskInfo::Explicit { .. })
        })
        .collect();
    assert_eq!(masked.len(), 2);
    for c in masked {
        // 2048² / (257·2048 − 256·257/2) = 8.5: the kernel computes every pair of the explicit mask.
        let n = c.notes.iter().find(|n| n.contains("built from positions")).unwrap();
        assert!(n.contains("8.5x") && n.contains("window_size=(256, 0)"), "{n}");
        assert!(c.variants.is_plain(), "the kernel ran no window: it is costed on all pairs");
    }
}

/// flash-attn's forward op: `(q, k, v, dropout_p, softmax_scale, causal, window_size_left, window_size_right,
/// softcap, alibi_slopes, return_softmax)`, BSHD.
fn fa_forward(causal: bool, window: (i64, i64), softcap: &str, alibi: bool) -> String {
    let a = if alibi { "[16]" } else { "[]" };
    let at = if alibi { "\"float\"" } else { "\"\"" };
    format!(
        r#"{{"Input Dims": [[1, 8192, 16, 128], [1, 8192, 8, 128], [1, 8192, 8, 128], [], [], [], [], [], [], {a}, []],
        "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", {at}, "Scalar"],
        "Concrete Inputs": ["", "", "", "0.0", "0.08838834764831845", "{}", "{}", "{}", "{softcap}", "", "False"]}}"#,
        if causal { "True" } else { "False" },
        window.0,
        window.1
    )
}

#[test]
fn flash_attn_window_and_softcap_come_from_its_arguments() {
    let r = analyze(
        "fa-window-softcap",
        &op_with_kernel(
            "flash_attn::_flash_attn_forward",
            &fa_forward(true, (4096, 0), "50.0", false),
            "void flash::flash_fwd_kernel<>",
            1000.0,
        ),
    );
    let op = &r.attention_ops[0];
    assert_eq!((op.backend, op.mask.as_str()), (AttnBackend::FlashAttn, "causal-br"));
    assert_eq!(op.variants, "window 4096,0 br · softcap 50");
    // Sq = Sk = 8192: row i sees min(i + 1, 4097) keys.
    let pairs = 4097.0 * 8192.0 - 4096.0 * 4097.0 / 2.0;
    assert_eq!(op.flops, Some(2.0 * 16.0 * pairs * 256.0));
    let replay = r.findings.iter().find_map(|f| f.replay.as_ref()).unwrap();
    assert!(
        replay.command.contains("--mask causal-br --layout bshd --window 4096,0 --softcap 50"),
        "{}",
        replay.command
    );
    assert_eq!(
        serde_json::to_value(&replay.spec.variants).unwrap(),
        serde_json::json!([{"window": {"left": 4096, "right": 0}, "softcap": 50.0, "diagonal": "bottom-right"}])
    );
}

#[test]
fn flash_attn_backward_carries_its_window_and_unbounded_sides_are_no_window() {
    // `(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal, window_size_left,
    // window_size_right, softcap, alibi_slopes, deterministic, rng_state)`.
    let t = |d: &str| format!("[1, 2048, {d}, 64]");
    let (q, kv) = (t("8"), t("8"));
    let args = format!(
        r#"{{"Input Dims": [{q}, {q}, {kv}, {kv}, {q}, [1, 8, 2048], {q}, {kv}, {kv}, [], [], [], [], [], [], [], [], [2]],
        "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "float", "c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "", "Scalar", "long int"],
        "Concrete Inputs": ["", "", "", "", "", "", "", "", "", "0.0", "0.125", "False", "128", "128", "0.0", "", "False", ""]}}"#
    );
    let r = analyze(
        "fa-bwd-window",
        &op_with_kernel(
            "flash_attn::_flash_attn_backward",
            &args,
            "void flash::flash_bwd_dq_dk_dv_loop_kernel<>",
            500.0,
        ),
    );
    let op = &r.attention_ops[0];
    assert_eq!((op.phase, op.mask.as_str()), (Phase::Bwd, "none"));
    assert_eq!(op.variants, "window 128,128 br", "a two-sided local window, no cap (0.0 is off)");
    // Row i sees keys i-128 ..= i+128 clamped to 0..2048.
    let pairs: f64 = (0..2048i64).map(|i| ((i + 128).min(2047) - (i - 128).max(0) + 1) as f64).sum();
    assert_eq!(op.flops, Some(2.5 * 2.0 * 8.0 * pairs * 128.0));
    let replay = r.findings.iter().find_map(|f| f.replay.as_ref()).unwrap();
    assert!(replay.command.ends_with("--window 128,128 --diagonal br"), "no causal mask names it: {}", replay.command);

    // (-1, -1) is FlashAttention's "no window".
    let r = analyze(
        "fa-no-window",
        &op_with_kernel(
            "flash_attn::_flash_attn_forward",
            &fa_forward(true, (-1, -1), "0.0", false),
            "void flash::flash_fwd_kernel<>",
            1000.0,
        ),
    );
    assert_eq!(r.attention_ops[0].variants, "");
    assert!(r.findings.iter().filter_map(|f| f.replay.as_ref()).all(|p| p.spec.variants.is_empty()));
}

#[test]
fn flash_attn_alibi_slopes_are_seen_but_not_their_values() {
    let r = analyze(
        "fa-alibi",
        &op_with_kernel(
            "flash_attn::_flash_attn_forward",
            &fa_forward(false, (-1, -1), "0.0", true),
            "void flash::flash_fwd_kernel<>",
            1000.0,
        ),
    );
    let op = &r.attention_ops[0];
    assert_eq!(op.variants, "alibi ?");
    assert_eq!(op.flops, Some(2.0 * 16.0 * 8192.0 * 8192.0 * 256.0), "ALiBi adds no pairs");
    let replay = r.findings.iter().find_map(|f| f.replay.as_ref()).unwrap();
    assert!(replay.command.ends_with("--mask none --layout bshd --alibi --diagonal br"), "{}", replay.command);
}

/// A Flex template kernel's op: Q, K, V, LSE, max, then the BlockMask's counts and indices, then the output.
const FLEX_ARGS: &str = r#"{"Input Dims": [[1, 8, 2048, 128], [1, 4, 2048, 128], [1, 4, 2048, 128], [1, 8, 2048], [1, 8, 2048], [1, 1, 16], [1, 1, 16, 16], [1, 1, 16], [1, 1, 16, 16], [1, 8, 2048, 128], [], [], []],
    "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "float", "float", "int", "int", "int", "int", "c10::BFloat16", "Scalar", "Scalar", "Scalar"],
    "Concrete Inputs": ["", "", "", "", "", "", "", "", "", "", "16", "1", "8"]}"#;

#[test]
fn a_block_mask_built_outside_the_trace_is_costed_as_an_upper_bound() {
    let r = analyze(
        "flex-reused-mask",
        &op_with_kernel("triton_tem_fused_flex_attention_0", FLEX_ARGS, "triton_tem_fused_flex_attention_0", 40.0),
    );
    let op = &r.attention_ops[0];
    assert_eq!((op.backend, op.phase, op.mask.as_str()), (AttnBackend::Flex, Phase::Fwd, "block-mask[1,1,16,16]"));
    assert_eq!(op.flops, Some(2.0 * 8.0 * 2048.0 * 2048.0 * 256.0));
    assert!(op.notes.iter().any(|n| n.contains("upper bound")), "{:?}", op.notes);
    assert!(op.fused_kernel);
}

#[test]
fn a_flex_kernel_with_no_launching_op_is_still_flex() {
    // A CUDA graph replay: the kernel alone.
    let ev = r#"{"ph": "X", "cat": "kernel", "name": "triton_tem_fused_flex_attention_backward_1", "pid": 0, "tid": 7, "ts": 200, "dur": 80, "args": {"correlation": 9}}"#;
    let r = analyze("flex-orphan", ev);
    let op = &r.attention_ops[0];
    assert_eq!((op.backend, op.phase), (AttnBackend::Flex, Phase::Bwd));
}

/// One CPU op at `ts` on the thread of [`op_with_kernel`]'s op, before it.
fn cpu_op(name: &str, ts: u32, dims: &str, types: &str, concrete: &str) -> String {
    format!(
        r#"{{"ph": "X", "cat": "cpu_op", "name": "{name}", "pid": 1, "tid": 1, "ts": {ts}, "dur": 5,
            "args": {{"Input Dims": {dims}, "Input type": {types}, "Concrete Inputs": {concrete}}}}},"#
    )
}

#[test]
fn transformers_sliding_window_mask_functions_are_read() {
    // transformers' masks: `kv_idx <= q_idx` (causal) and `kv_idx > q_idx - sliding_window` (a window of
    // W - 1 keys back), over the [Sq, Sk] grid, before the call.
    let long = r#"["long int", "long int"]"#;
    let causal = cpu_op("aten::le", 10, "[[2048], [2048, 1]]", long, r#"["", ""]"#);
    let sub = cpu_op("aten::sub", 20, "[[2048, 1], []]", r#"["long int", "Scalar"]"#, r#"["", "512", "1"]"#);
    let gt = cpu_op("aten::gt", 30, "[[2048], [2048, 1]]", long, r#"["", ""]"#);
    let flex =
        op_with_kernel("triton_tem_fused_flex_attention_0", FLEX_ARGS, "triton_tem_fused_flex_attention_0", 40.0);
    let r = analyze("flex-hf-window", &format!("{causal}{sub}{gt}{flex}"));
    let op = &r.attention_ops[0];
    assert_eq!((op.mask.as_str(), op.variants.as_str()), ("causal", "window 511,0 tl"));
    // A window constant with no causal comparison is not read as a window (its direction is unknown).
    let r = analyze("flex-window-only", &format!("{sub}{gt}{flex}"));
    assert_eq!((r.attention_ops[0].mask.as_str(), r.attention_ops[0].variants.as_str()), ("block-mask[1,1,16,16]", ""));
}

#[test]
fn an_eager_softcap_whose_cap_is_recorded_is_read() {
    // Gemma 2's `scores / cap`, `tanh`, `* cap` with the cap passed as a Scalar (recorded), no mask.
    let bf = r#""c10::BFloat16""#;
    let s = "[1, 2, 64, 64]";
    let ops = [
        cpu_op("aten::matmul", 10, "[[1, 2, 64, 16], [1, 2, 16, 64]]", &format!("[{bf}, {bf}]"), r#"["", ""]"#),
        cpu_op("aten::div", 20, &format!("[{s}, []]"), &format!(r#"[{bf}, "Scalar"]"#), r#"["", "30.0"]"#),
        cpu_op("aten::tanh", 30, &format!("[{s}]"), &format!("[{bf}]"), r#"[""]"#),
        cpu_op("aten::mul", 40, &format!("[{s}, []]"), &format!(r#"[{bf}, "Scalar"]"#), r#"["", "30.0"]"#),
        cpu_op(
            "aten::softmax",
            50,
            &format!("[{s}, [], []]"),
            &format!(r#"[{bf}, "Scalar", "Scalar"]"#),
            r#"["", "-1", ""]"#,
        ),
        cpu_op("aten::matmul", 60, &format!("[{s}, [1, 2, 64, 16]]"), &format!("[{bf}, {bf}]"), r#"["", ""]"#),
    ];
    let events = ops.concat();
    let trace = common::write_trace("eager-cap", events.trim_end_matches(','));
    let t = parse_file(&trace).unwrap();
    let calls = detect(&OpTree::build(&t));
    assert_eq!(calls.len(), 1);
    let c = &calls[0];
    assert_eq!((c.kind, c.mask.clone()), (Kind::Unfused, MaskInfo::None));
    assert_eq!(c.variants.variants.softcap, Some(30.0));
    assert!(!c.variants.softcap_unrecorded);
    assert_eq!(c.variants.label(), "softcap 30");
    assert_eq!(
        c.parts.iter().map(|p| p.role).collect::<Vec<_>>(),
        ["qk", "scale", "softcap", "scale", "softmax", "pv"]
    );
}
