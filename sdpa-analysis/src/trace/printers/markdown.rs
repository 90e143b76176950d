//! The findings markdown (`--md FILE`, and the TraceLens contract's `sdpa_fwd_findings.md`).

use super::{opt, pct};
use crate::render::markdown as md;
use crate::trace::report::{AttentionOp, TraceReport};
use std::fmt::Write;

/// Columns of the attention-op table (markdown and the HTML page).
pub const OPS_HEAD: [&str; 17] = [
    "kind",
    "pass",
    "backend",
    "module",
    "B,Hq,Hkv,Sq,Sk,D",
    "layout",
    "dtype",
    "mask",
    "calls",
    "total µs",
    "mean µs",
    "TFLOP/s",
    "TB/s",
    "efficiency",
    "work",
    "expected band",
    "bound",
];

/// One op's cells, as [`OPS_HEAD`] names them.
pub fn op_cells(o: &AttentionOp) -> Vec<String> {
    let band = o
        .expected_band
        .as_ref()
        .map(|b| format!("{:.0}-{:.0} % ({})", b.low * 100.0, b.high * 100.0, o.band_status.unwrap_or("?")))
        .unwrap_or_else(|| "-".into());
    vec![
        o.kind.name().to_string(),
        o.phase.name().to_string(),
        o.backend.name().to_string(),
        o.module.clone(),
        o.shape_label(),
        o.layout_label(),
        o.dtype.as_deref().unwrap_or("-").to_string(),
        o.mask_and_variants(),
        o.count.to_string(),
        format!("{:.1}", o.total_us),
        format!("{:.1}", o.mean_us),
        o.bounded(opt(o.tflops, 1)),
        o.bounded(opt(o.tbps, 2)),
        o.bounded(o.efficiency.map(pct).unwrap_or_else(|| "-".into())),
        o.work.name().to_string(),
        band,
        o.bound.map(|b| format!("{b:?}").to_lowercase()).unwrap_or_else(|| "-".into()),
    ]
}

/// Renders the findings document.
pub fn render(r: &TraceReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Attention findings\n");
    let _ = writeln!(s, "Input: {}\n", r.inputs.iter().map(|i| format!("`{i}`")).collect::<Vec<_>>().join(", "));
    let dev = r.device.spec.clone().or_else(|| r.device.name.clone()).unwrap_or_else(|| "unknown".into());
    let _ = writeln!(s, "Device: {dev} (from {}).\n", r.device.source);
    let sm = &r.summary;
    let _ = writeln!(s, "## Summary\n");
    let _ = writeln!(
        s,
        "- GPU time: {:.1} µs; attention: {:.1} µs ({}), fused {:.1} µs, unfused {:.1} µs, {} calls.",
        sm.total_gpu_time_us,
        sm.attention_time_us,
        pct(sm.attention_share),
        sm.fused_time_us,
        sm.unfused_time_us,
        sm.attention_calls
    );
    let _ = writeln!(s, "- Fused attention kernels in use: {}.", if sm.fused_kernels_in_use { "yes" } else { "no" });
    if sm.cache_write_time_us > 0.0 {
        let names: Vec<String> =
            sm.cache_write_kernels.iter().map(|k| format!("`{}` {:.1} µs", k.name, k.total_us)).collect();
        let _ = writeln!(
            s,
            "- Attention-adjacent: KV cache writes {:.1} µs ({}), not counted as attention.",
            sm.cache_write_time_us,
            names.join(", ")
        );
    }
    for m in &r.missing {
        let _ = writeln!(s, "- Missing: {m}");
    }
    for x in &r.suspect {
        let _ = writeln!(s, "- Suspect: {}", x.line());
    }
    let _ = writeln!(s, "\n## Attention ops\n");
    if r.attention_ops.is_empty() {
        let _ = writeln!(s, "None found.");
    } else {
        md::table(&mut s, &OPS_HEAD, &r.attention_ops.iter().map(op_cells).collect::<Vec<_>>());
    }
    let implemented: Vec<_> = r.attention_ops.iter().filter(|o| o.implementation.is_some()).collect();
    if !implemented.is_empty() {
        let _ = writeln!(s, "\nImplementations (read from the kernel names):\n");
        for o in implemented {
            if let Some(i) = &o.implementation {
                let _ = writeln!(s, "- {}: **{}**, from `{}`", super::op_words(o), i.label(), i.kernel);
            }
        }
    }
    let bounded: Vec<_> = r.attention_ops.iter().filter(|o| o.work_why.is_some()).collect();
    if !bounded.is_empty() {
        let _ = writeln!(s, "\nWork of varlen and paged ops (`>=`: a lower bound, `<=`: an upper bound):\n");
        for o in bounded {
            let _ = writeln!(
                s,
                "- {} ({}): {}: {}",
                o.layout_label(),
                o.backend.name(),
                o.work.name(),
                o.work_why.as_deref().unwrap_or("")
            );
        }
    }
    let judged = super::judgement::lines(r);
    if !judged.is_empty() {
        let _ = writeln!(s, "\n## Judgement\n\n- {}", judged.join("\n- "));
    }
    if let Some(rk) = &r.ranks {
        let _ = writeln!(s, "\n## Ranks\n");
        let _ = writeln!(s, "```\n{}```", super::ranks_lines(rk));
    }
    let _ = writeln!(s, "\n## Findings\n");
    for (i, f) in r.findings.iter().enumerate() {
        let path = match f.path {
            "A" => "Path A (fuse / migrate)",
            "B" => "Path B (kernel level)",
            _ => "context",
        };
        let _ = writeln!(s, "### {}. [{}] {}\n", i + 1, f.severity.name(), f.title);
        let _ = writeln!(s, "{path}. {}\n", f.detail);
        if let Some(sp) = &f.expected_speedup {
            let _ = writeln!(s, "Expected speedup: {:.1}-{:.1}x ({}).\n", sp.low, sp.high, sp.source);
        }
        if let Some(why) = &f.replay_note {
            let _ = writeln!(s, "Replay: none, {why}.\n");
        }
        if let Some(rp) = &f.replay {
            if let Some(note) = &rp.note {
                let _ = writeln!(s, "Replay note: {note}.\n");
            }
            let spec = serde_json::to_string(&rp.spec).unwrap_or_default();
            let _ = writeln!(
                s,
                "Replay on our backends:\n\n```sh\n{}\n```\n\nSpec (`sdpa bench --spec FILE`):\n\n```json\n{}\n```\n",
                rp.command, spec
            );
        }
    }
    s
}
