//! The analysis as one self-contained HTML page (`sdpa analyze --html FILE`): the summary, the attention ops,
//! a per-layer timeline and efficiency against sequence length with the expected bands ([`super::charts`]),
//! and the findings with their replay commands and specs. With `--diff`, [`diff`] renders the comparison and
//! both timelines. Styles inline, no script, no external resource; every string from a trace is escaped
//! (trace strings are untrusted), through the same helpers as `sdpa report`'s page ([`crate::render`]).

use super::charts;
use super::diff::{matched_rows, totals_rows, unmatched_rows, MATCHED_HEAD, TOTALS_HEAD, UNMATCHED_HEAD};
use super::markdown::{op_cells, OPS_HEAD};
use super::pct;
use crate::render::esc;
use crate::render::html::{close_page, open_page, table};
use crate::trace::diff::TraceDiff;
use crate::trace::report::TraceReport;
use std::fmt::Write;

const EXTRA_CSS: &str = ".finding{border-left:4px solid #999;padding:2px 12px;margin:14px 0}\
.finding.high{border-color:#b00020}.finding.medium{border-color:#e69f00}.finding.low{border-color:#56b4e9}\
.finding h3{margin:4px 0}pre{background:#f6f6f6;padding:6px 10px;overflow-x:auto;font-size:12px}\
ul.facts{font-size:13px}table.summary td,table.matched td,table.appeared td,table.disappeared td{text-align:left;white-space:normal}.figure-note{color:#555;font-size:12px}";

fn device_words(r: &TraceReport) -> String {
    match (&r.device.name, &r.device.spec) {
        (Some(n), Some(spec)) if r.device.source == "override" => format!("{spec} (override; trace says {n})"),
        (_, Some(spec)) => format!("{spec} (from the {})", r.device.source),
        (Some(n), None) => format!("{n} (not in the hardware table: no efficiency)"),
        (None, None) => "unknown".into(),
    }
}

/// The input files for a title: all of them up to three, else the first and how many more (a directory of
/// many ranks; the summary lists them all).
fn inputs_words(inputs: &[String]) -> String {
    match inputs {
        [first, _, _, _, ..] => format!("{first} and {} more files", inputs.len() - 1),
        _ => inputs.join(", "),
    }
}

fn summary_rows(r: &TraceReport) -> Vec<Vec<String>> {
    let s = &r.summary;
    let mut rows = vec![
        vec!["inputs".into(), r.inputs.join(", ")],
        vec!["GPU time".into(), format!("{:.1} µs", s.total_gpu_time_us)],
        vec!["attention".into(), format!("{:.1} µs ({} of GPU time)", s.attention_time_us, pct(s.attention_share))],
        vec!["fused / unfused".into(), format!("{:.1} µs / {:.1} µs", s.fused_time_us, s.unfused_time_us)],
        vec!["attention calls".into(), s.attention_calls.to_string()],
        vec!["fused kernels in use".into(), if s.fused_kernels_in_use { "yes" } else { "no" }.into()],
    ];
    if s.cache_write_time_us > 0.0 {
        let names: Vec<&str> = s.cache_write_kernels.iter().map(|k| k.name.as_str()).collect();
        rows.push(vec![
            "KV cache writes (not attention)".into(),
            format!("{:.1} µs ({})", s.cache_write_time_us, names.join(", ")),
        ]);
    }
    rows
}

fn facts(out: &mut String, r: &TraceReport) {
    let items: Vec<String> = r
        .unreadable
        .iter()
        .map(|u| format!("Unreadable (left out): {u}"))
        .chain(r.missing.iter().map(|m| format!("Missing: {m}")))
        .chain(r.suspect.iter().map(|x| format!("Suspect: {}", x.line())))
        .collect();
    if !items.is_empty() {
        out.push_str("<ul class=\"facts\">");
        for i in items {
            let _ = write!(out, "<li>{}</li>", esc(&i));
        }
        out.push_str("</ul>\n");
    }
}

fn figure(out: &mut String, class: &str, svg: Option<String>, note: &str) {
    if let Some(svg) = svg {
        let _ = writeln!(
            out,
            "<figure class=\"{class}\">{svg}<figcaption class=\"figure-note\">{}</figcaption></figure>",
            esc(note)
        );
    }
}

const TIMELINE_NOTE: &str = "One row per layer (module instance), in the order the layers first ran. Each attention \
call is a bar placed at its op's start on the CPU clock (the trace orders calls exactly there) and as long as the \
GPU time of the kernels it launched. Hover a bar for its op.";

const EFFICIENCY_NOTE: &str = "Each op's efficiency (roofline time / measured GPU time per call) at its key length; \
the shaded bar behind it is the band the op is judged against (hover it for its source). Ops without a device, \
shape or time are not drawn.";

fn timeline_figure(out: &mut String, r: &TraceReport, title: &str, span_us: Option<f64>) {
    figure(out, "timeline", charts::timeline(r, title, span_us), TIMELINE_NOTE);
    if r.timeline.left_out > 0 {
        let _ = writeln!(
            out,
            "<p class=\"note\">{} further calls are not drawn (the timeline keeps the first {}).</p>",
            r.timeline.left_out,
            r.timeline.spans.len()
        );
    }
}

/// What the markdown says under its ops table, as lists: the implementation each op's kernels name, the
/// judgement lines (frontier, backward balance, decode bytes and gaps) and the ranks section.
fn judged_sections(out: &mut String, r: &TraceReport) {
    let implemented: Vec<String> = r
        .attention_ops
        .iter()
        .filter_map(|o| o.implementation.as_ref().map(|i| (o, i)))
        .map(|(o, i)| {
            format!(
                "{}: <strong>{}</strong>, from <code>{}</code>",
                esc(&super::op_words(o)),
                esc(&i.label()),
                esc(&i.kernel)
            )
        })
        .collect();
    if !implemented.is_empty() {
        out.push_str("<h3>Implementations (read from the kernel names)</h3>\n");
        list(out, &implemented);
    }
    let judged: Vec<String> = super::judgement::lines(r).iter().map(|l| esc(l)).collect();
    if !judged.is_empty() {
        out.push_str("<h2>Judgement</h2>\n");
        list(out, &judged);
    }
    if let Some(rk) = &r.ranks {
        out.push_str("<h2>Ranks</h2>\n");
        let _ = writeln!(out, "<pre>{}</pre>", esc(&super::ranks_lines(rk)));
    }
}

/// A bulleted list of items that are already HTML.
fn list(out: &mut String, items: &[String]) {
    out.push_str("<ul>\n");
    for i in items {
        let _ = writeln!(out, "<li>{i}</li>");
    }
    out.push_str("</ul>\n");
}

/// The page of one analysis.
pub fn report(r: &TraceReport) -> String {
    let mut out = String::new();
    let title = format!("Attention in {}", inputs_words(&r.inputs));
    open_page(&mut out, &title, EXTRA_CSS);
    let _ = writeln!(out, "<h1>{}</h1>", esc(&title));
    let _ = writeln!(out, "<p class=\"note\">Device: {}.</p>", esc(&device_words(r)));
    out.push_str("<h2>Summary</h2>\n");
    table(&mut out, "summary", &["what".into(), "value".into()], &summary_rows(r), None);
    facts(&mut out, r);
    out.push_str("<h2>Attention ops</h2>\n");
    if r.attention_ops.is_empty() {
        out.push_str("<p>None found.</p>\n");
    } else {
        let head: Vec<String> = ["#"].iter().chain(OPS_HEAD.iter()).map(|s| s.to_string()).collect();
        let rows: Vec<Vec<String>> = r
            .attention_ops
            .iter()
            .enumerate()
            .map(|(i, o)| std::iter::once((i + 1).to_string()).chain(op_cells(o)).collect())
            .collect();
        table(&mut out, "ops", &head, &rows, None);
    }
    judged_sections(&mut out, r);
    if !r.timeline.is_empty() || r.attention_ops.iter().any(|o| o.efficiency.is_some()) {
        out.push_str("<h2>Timeline and efficiency</h2>\n");
    }
    timeline_figure(&mut out, r, "attention calls by layer", None);
    figure(
        &mut out,
        "efficiency",
        charts::efficiency(r, "efficiency against key length, with the expected bands"),
        EFFICIENCY_NOTE,
    );
    out.push_str("<h2>Findings</h2>\n");
    if r.findings.is_empty() {
        out.push_str("<p>None.</p>\n");
    }
    for (i, f) in r.findings.iter().enumerate() {
        let path = match f.path {
            "A" => "Path A (fuse / migrate)",
            "B" => "Path B (kernel level)",
            _ => "context",
        };
        let _ = write!(
            out,
            "<div class=\"finding {}\"><h3>{}. [{}] {}</h3><p>{}. {}</p>",
            f.severity.name(),
            i + 1,
            f.severity.name(),
            esc(&f.title),
            path,
            esc(&f.detail)
        );
        if let Some(op) = f.op_index {
            let _ = write!(out, "<p class=\"note\">About op {} of the table.</p>", op + 1);
        }
        if let Some(sp) = &f.expected_speedup {
            let _ = write!(out, "<p>Expected speedup: {:.1}-{:.1}x ({}).</p>", sp.low, sp.high, esc(&sp.source));
        }
        if let Some(why) = &f.replay_note {
            let _ = write!(out, "<p>Replay: none, {}.</p>", esc(why));
        }
        if let Some(rp) = &f.replay {
            if let Some(note) = &rp.note {
                let _ = write!(out, "<p class=\"note\">Replay note: {}.</p>", esc(note));
            }
            let spec = serde_json::to_string_pretty(&rp.spec).unwrap_or_default();
            let _ = write!(
                out,
                "<p>Replay on our backends:</p><pre class=\"replay\"><code>{}</code></pre><details><summary>spec for <code>sdpa bench --spec FILE</code></summary><pre><code>{}</code></pre></details>",
                esc(&rp.command),
                esc(&spec)
            );
        }
        out.push_str("</div>\n");
    }
    close_page(&mut out);
    out
}

/// The page of a comparison: the totals, matched ops with their deltas, what appeared and disappeared, and
/// the timelines of both sides.
pub fn diff(d: &TraceDiff, before: &TraceReport, after: &TraceReport) -> String {
    let mut out = String::new();
    let title = "Attention before and after";
    open_page(&mut out, title, EXTRA_CSS);
    let _ = writeln!(out, "<h1>{title}</h1>\n<p>{}.</p>", esc(&super::diff::headline(d)));
    let head = |h: &[&str]| h.iter().map(|s| s.to_string()).collect::<Vec<String>>();
    table(&mut out, "totals", &head(&TOTALS_HEAD), &totals_rows(d), None);
    if !d.notes.is_empty() {
        out.push_str("<ul class=\"facts\">");
        for n in &d.notes {
            let _ = write!(out, "<li>{}</li>", esc(n));
        }
        out.push_str("</ul>\n");
    }
    out.push_str("<h2>Matched ops</h2>\n");
    if d.matched.is_empty() {
        out.push_str("<p>None: no op of one input has the module, pass, shape and dtype of an op of the other.</p>\n");
    } else {
        table(&mut out, "matched", &head(&MATCHED_HEAD), &matched_rows(d), None);
        let notes: Vec<String> = d
            .matched
            .iter()
            .flat_map(|m| m.notes.iter().map(move |n| format!("{} {} {}: {n}", m.module, m.phase.name(), m.shape)))
            .collect();
        if !notes.is_empty() {
            out.push_str("<ul class=\"facts\">");
            for n in notes {
                let _ = write!(out, "<li>{}</li>", esc(&n));
            }
            out.push_str("</ul>\n");
        }
    }
    for (name, class, list) in [
        ("Appeared (after only)", "appeared", &d.appeared),
        ("Disappeared (before only)", "disappeared", &d.disappeared),
    ] {
        if !list.is_empty() {
            let _ = writeln!(out, "<h2>{name}</h2>");
            table(&mut out, class, &head(&UNMATCHED_HEAD), &unmatched_rows(list), None);
        }
    }
    if !(before.timeline.is_empty() && after.timeline.is_empty()) {
        out.push_str("<h2>Timelines</h2>\n");
    }
    // One time scale for both, so the bars compare by eye.
    let span = Some(before.timeline.end_us().max(after.timeline.end_us()));
    timeline_figure(&mut out, before, &format!("before: {}", inputs_words(&before.inputs)), span);
    timeline_figure(&mut out, after, &format!("after: {}", inputs_words(&after.inputs)), span);
    close_page(&mut out);
    out
}
