//! `sdpa analyze --diff`: the real before/after pair (the same 4-block model, eager attention then SDPA,
//! recorded with stacks on an H100: `tests/fixtures/record_diff.py`, ground truth in `diff_pair.meta.json`),
//! and synthetic changes made from real reports (a regression, slower calls, a different shape, a new op, an
//! unknown shape), each checked against what the two reports say.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use sdpa_analysis::trace::attention::{AttnBackend, Kind, Phase};
use sdpa_analysis::trace::diff::{analyze_both, Change, TraceDiff};
use sdpa_analysis::trace::printers;
use sdpa_analysis::{analyze_path, Options, TraceReport};
use serde_json::Value;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

fn pair() -> (TraceReport, TraceReport) {
    let o = Options::default();
    analyze_both(
        &fixture("diff_before_eager_bf16_S1024.json.gz"),
        &fixture("diff_after_sdpa_bf16_S1024.json.gz"),
        [&o, &o],
    )
    .unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs().max(1.0)
}

#[test]
fn the_real_pair_matches_four_layers_by_module_and_realises_path_a() {
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(fixture("diff_pair.meta.json")).unwrap()).unwrap();
    let n = |k: &str| meta[k].as_u64().unwrap();
    let (before, after) = pair();
    let d = TraceDiff::new(&before, &after);

    // One attention op per side, the same module and shape, nothing left over.
    assert_eq!(d.matched.len(), 1, "{d:#?}");
    assert!(d.appeared.is_empty() && d.disappeared.is_empty(), "{d:#?}");
    let m = &d.matched[0];
    assert_eq!(m.module, meta["module"].as_str().unwrap());
    assert_eq!(m.phase, Phase::Fwd);
    let shape =
        format!("{},{},{},{},{},{}", n("batch"), n("heads_q"), n("heads_kv"), n("seq"), n("seq"), n("head_dim"));
    assert_eq!(m.shape, shape);
    assert_eq!(m.dtype.as_deref(), Some("bf16"));
    // Every block's attention on both sides: four layer instances, one call each.
    let blocks = n("blocks") as usize;
    for side in [&m.before, &m.after] {
        assert_eq!(side.count, blocks, "{side:#?}");
        let mut layers = side.layers.clone();
        layers.sort();
        let want: Vec<String> = (0..blocks).map(|i| format!("Attention_{i}")).collect();
        assert_eq!(layers, want);
    }
    // Eager chain before, a fused kernel (cuDNN on the H100) after: Path A realised.
    assert_eq!(m.before.implementations, ["unfused eager"]);
    assert!(!m.before.fused);
    assert!(m.after.fused, "{:?}", m.after.implementations);
    assert_eq!(after.attention_ops[0].kind, Kind::Fused);
    assert_eq!(m.change, Change::Fused);
    assert_eq!(d.path_a_realised, 1);
    assert_eq!(d.regressed, 0);
    // The eager model's additive mask against is_causal: matched without the mask, and said so.
    assert!(m.mask_changed);
    assert!(m.before.masks[0].starts_with("explicit-additive"), "{:?}", m.before.masks);
    assert_eq!(m.after.masks, ["causal"]);
    assert!(m.notes.iter().any(|n| n.contains("masks differ")), "{:?}", m.notes);

    // The deltas are what the two reports say.
    let (tb, ta) = (before.summary.attention_time_us, after.summary.attention_time_us);
    assert!(tb > 0.0 && ta > 0.0 && ta < tb);
    assert!(close(m.before.total_us, tb) && close(m.after.total_us, ta));
    assert!(close(m.time_delta_us, ta - tb));
    assert!(close(d.attention_delta_us, ta - tb));
    assert!(close(d.accounted_delta_us(), ta - tb));
    assert!(close(d.gpu_delta_us, after.summary.total_gpu_time_us - before.summary.total_gpu_time_us));
    assert!(close(m.speedup.unwrap(), before.attention_ops[0].mean_us / after.attention_ops[0].mean_us));
    assert!(close(d.attention_speedup.unwrap(), tb / ta));
    let (eb, ea) = (before.attention_ops[0].efficiency.unwrap(), after.attention_ops[0].efficiency.unwrap());
    assert!(close(m.efficiency_delta.unwrap(), ea - eb));
    assert!(close(d.before.efficiency.unwrap(), eb) && close(d.after.efficiency.unwrap(), ea));

    // The printers carry the same facts.
    let text = printers::diff::text(&d);
    assert!(text.contains("Path A realised (now fused)") && text.contains(&shape), "{text}");
    assert!(text.contains(&format!("{:+.1}", ta - tb)), "{text}");
    let md = printers::diff::markdown(&d);
    assert!(md.contains("| Model/Block/Attention | fwd |"), "{md}");
    let json: Value = serde_json::to_value(&d).unwrap();
    assert_eq!(json["matched"][0]["change"], "fused");
    assert_eq!(json["path_a_realised"], 1);
}

#[test]
fn the_pair_reversed_is_a_regression() {
    let (before, after) = pair();
    let d = TraceDiff::new(&after, &before);
    assert_eq!(d.matched.len(), 1);
    assert_eq!(d.matched[0].change, Change::Unfused);
    assert_eq!(d.regressed, 1);
    assert_eq!(d.path_a_realised, 0);
    assert!(d.matched[0].time_delta_us > 0.0);
    assert!(d.matched[0].speedup.unwrap() < 1.0);
}

#[test]
fn a_report_against_itself_changes_nothing() {
    let r = analyze_path(&data("llama_sdpa_train_bf16_S1024.json.gz"), &Options::default()).unwrap();
    let d = TraceDiff::new(&r, &r);
    // Forward and backward stay apart: two matches.
    assert_eq!(d.matched.len(), 2);
    let phases: Vec<Phase> = d.matched.iter().map(|m| m.phase).collect();
    assert!(phases.contains(&Phase::Fwd) && phases.contains(&Phase::Bwd));
    for m in &d.matched {
        assert_eq!(m.change, Change::Unchanged);
        assert_eq!(m.time_delta_us, 0.0);
        assert!(!m.mask_changed);
    }
    assert_eq!(d.attention_delta_us, 0.0);
    assert!(d.appeared.is_empty() && d.disappeared.is_empty());
}

#[test]
fn slower_calls_and_another_backend_are_named() {
    let r = analyze_path(&data("qwen2_sdpa_bf16_S2048.json.gz"), &Options::default()).unwrap();
    let mut slow = r.clone();
    let op = &mut slow.attention_ops[0];
    op.total_us *= 2.0;
    op.mean_us *= 2.0;
    slow.summary.attention_time_us += r.attention_ops[0].total_us;
    let d = TraceDiff::new(&r, &slow);
    assert_eq!(d.matched[0].change, Change::Slower);
    assert!(close(d.matched[0].speedup.unwrap(), 0.5));
    assert!(close(d.attention_delta_us, r.attention_ops[0].total_us));
    assert!(close(d.accounted_delta_us(), d.attention_delta_us));

    let mut flash = r.clone();
    flash.attention_ops[0].backend = AttnBackend::Flash;
    let d = TraceDiff::new(&r, &flash);
    assert_eq!(d.matched[0].change, Change::Backend);
    assert_eq!(d.matched[0].after.implementations, ["fused flash"]);
}

#[test]
fn a_different_shape_or_pass_is_never_matched() {
    let r = analyze_path(&data("qwen2_sdpa_bf16_S2048.json.gz"), &Options::default()).unwrap();
    let mut longer = r.clone();
    longer.attention_ops[0].sq = Some(4096);
    longer.attention_ops[0].sk = Some(4096);
    let d = TraceDiff::new(&r, &longer);
    assert!(d.matched.is_empty(), "{d:#?}");
    assert_eq!(d.appeared.len(), 1);
    assert_eq!(d.disappeared.len(), 1);
    assert_eq!(d.appeared[0].shape, "2,14,2,4096,4096,64");
    assert_eq!(d.appeared[0].meaning, "new fused attention");
    assert_eq!(d.disappeared[0].meaning, "fused attention gone");
    assert!(close(d.accounted_delta_us(), 0.0));

    let mut gqa = r.clone();
    gqa.attention_ops[0].hkv = Some(14);
    assert!(TraceDiff::new(&r, &gqa).matched.is_empty());
    let mut bwd = r.clone();
    bwd.attention_ops[0].phase = Phase::Bwd;
    assert!(TraceDiff::new(&r, &bwd).matched.is_empty());
    let mut other_module = r.clone();
    other_module.attention_ops[0].module = "Model/Other".into();
    assert!(TraceDiff::new(&r, &other_module).matched.is_empty());
}

#[test]
fn an_unfused_op_that_appears_is_a_regression_and_the_deltas_add_up() {
    let (before, after) = pair();
    let fused = analyze_path(&data("qwen2_sdpa_bf16_S2048.json.gz"), &Options::default()).unwrap();
    // After: the SDPA model plus the eager one's op under another module.
    let mut grown = after.clone();
    let mut eager = before.attention_ops[0].clone();
    eager.module = "Model/Extra/Attention".into();
    grown.summary.attention_time_us += eager.total_us;
    grown.attention_ops.push(eager);
    // Before: the eager model plus an op that is gone after.
    let mut shrunk = before.clone();
    shrunk.summary.attention_time_us += fused.attention_ops[0].total_us;
    shrunk.attention_ops.push(fused.attention_ops[0].clone());
    let d = TraceDiff::new(&shrunk, &grown);
    assert_eq!(d.matched.len(), 1);
    assert_eq!(d.appeared.len(), 1);
    assert!(!d.appeared[0].fused);
    assert!(d.appeared[0].meaning.starts_with("regressed"), "{}", d.appeared[0].meaning);
    assert_eq!(d.disappeared.len(), 1);
    assert_eq!(d.disappeared[0].implementation, "fused cudnn");
    assert_eq!(d.regressed, 1);
    assert_eq!(d.path_a_realised, 1);
    assert!(close(d.accounted_delta_us(), d.attention_delta_us), "{} {}", d.accounted_delta_us(), d.attention_delta_us);
    let md = printers::diff::markdown(&d);
    assert!(md.contains("## Appeared (after only)") && md.contains("## Disappeared (before only)"), "{md}");
}

#[test]
fn ops_without_a_shape_match_only_the_same_backend() {
    let r = analyze_path(&data("qwen2_sdpa_bf16_S2048.json.gz"), &Options::default()).unwrap();
    let mut unknown = r.clone();
    let op = &mut unknown.attention_ops[0];
    (op.b, op.hq, op.hkv, op.sq, op.sk, op.d, op.dv) = (None, None, None, None, None, None, None);
    let d = TraceDiff::new(&unknown, &unknown);
    assert_eq!(d.matched.len(), 1);
    assert!(d.notes.iter().any(|n| n.contains("no recorded shape")), "{:?}", d.notes);
    let mut other = unknown.clone();
    other.attention_ops[0].backend = AttnBackend::Flash;
    let d = TraceDiff::new(&unknown, &other);
    assert!(d.matched.is_empty());
}

#[test]
fn per_rank_directories_are_compared_as_wholes() {
    // Context parallelism on two ranks, load balancing on and off. Each ring step is a call on its local
    // shape: both runs have the causal diagonal step (8192 x 8192 per rank); the balanced (zigzag) run's other
    // steps are half-chunk calls (4096 x 8192 and 8192 x 4096, no mask), the unbalanced run's one full
    // 8192 x 8192 call on one rank. Those never match (other shapes): they disappear and appear, with the
    // same number of score pairs on each side.
    let o = Options::default();
    let (b, a) = analyze_both(&fixture("cp_balanced"), &fixture("cp_unbalanced"), [&o, &o]).unwrap();
    assert_eq!((b.inputs.len(), a.inputs.len()), (2, 2));
    let d = TraceDiff::new(&b, &a);
    assert_eq!(d.before.inputs, b.inputs);
    assert_eq!(d.matched.len(), 2, "{d:#?}");
    for m in &d.matched {
        assert_eq!(m.shape, "1,16,16,8192,8192,128");
        assert!(m.before.fused && m.after.fused);
        assert!(!matches!(m.change, Change::Fused | Change::Unfused));
        assert_eq!((m.before.count, m.after.count), (4, 4));
    }
    let pairs = |u: &sdpa_analysis::trace::diff::Unmatched| {
        let dims: Vec<u64> = u.shape.split(',').map(|x| x.parse().unwrap()).collect();
        dims[1] * dims[3] * dims[4] * u.count as u64
    };
    for phase in [Phase::Fwd, Phase::Bwd] {
        let gone: Vec<_> = d.disappeared.iter().filter(|u| u.phase == phase).collect();
        let new: Vec<_> = d.appeared.iter().filter(|u| u.phase == phase).collect();
        assert!(gone.iter().all(|u| u.mask == "none" && u.shape.contains(",4096,")), "{gone:#?}");
        assert!(new.iter().all(|u| u.mask == "none" && u.shape == "1,16,16,8192,8192,128"), "{new:#?}");
        assert_eq!(gone.iter().map(|u| pairs(u)).sum::<u64>(), new.iter().map(|u| pairs(u)).sum::<u64>());
        assert!(!gone.is_empty() && !new.is_empty());
    }
    assert_eq!((d.path_a_realised, d.regressed), (0, 0));
    let delta = a.summary.attention_time_us - b.summary.attention_time_us;
    assert!(close(d.attention_delta_us, delta) && close(d.accounted_delta_us(), delta));
}
