//! Printers: markdown (with plots as separate SVG files) and one self-contained HTML page (plots inline,
//! styles inline, no script, no external resource).

use super::backward::PYTORCH_BACKWARDS;
use super::model::{shape_label, Group, ResultsReport, Row, XAxis};
use super::plots::{roofline_plot, seq_plot};
use crate::render::html::{close_page, open_page, table};
use crate::render::markdown as md;
use crate::render::{esc, svg::color};
use sdpa_core::record::Skipped;
use sdpa_core::{BenchRecord, Bound};
use std::collections::BTreeMap;
use std::fmt::Write;

fn fmt_ms(ms: f64) -> String {
    if ms >= 100.0 {
        format!("{ms:.1}")
    } else if ms >= 1.0 {
        format!("{ms:.3}")
    } else {
        format!("{ms:.4}")
    }
}

fn fmt_tflops(t: f64) -> String {
    if t >= 100.0 {
        format!("{t:.0}")
    } else if t >= 1.0 {
        format!("{t:.1}")
    } else if t >= 1e-3 {
        format!("{t:.3}")
    } else {
        format!("{t:.2e}")
    }
}

fn fmt_pct(x: Option<f64>) -> String {
    x.map_or("-".into(), |e| format!("{:.1} %", e * 100.0))
}

fn fmt_speedup(x: Option<f64>) -> String {
    x.map_or("-".into(), |s| format!("{s:.2}x"))
}

fn fmt_bound(b: Option<Bound>) -> &'static str {
    match b {
        Some(Bound::Compute) => "compute",
        Some(Bound::Memory) => "memory",
        None => "-",
    }
}

fn fmt_check(r: &Row) -> String {
    match &r.rec.check {
        None => "not checked".into(),
        Some(c) => format!(
            "{} (rel {:.1e} ≤ {:.0e}{})",
            if c.pass { "pass" } else { "FAIL" },
            c.rel_err,
            c.tolerance,
            if c.rows_checked > 0 { format!(", {} rows", c.rows_checked) } else { String::new() }
        ),
    }
}

/// Cells of one detail-table row, shared by both printers.
fn detail_cells(r: &Row) -> Vec<String> {
    let t = &r.rec.time_ms;
    vec![
        r.rec.backend.clone(),
        kernel_cell(&r.rec),
        fmt_ms(t.median),
        format!("{}–{}", fmt_ms(t.min), fmt_ms(t.max)),
        if t.reps > 0 { t.reps.to_string() } else { "-".into() },
        fmt_tflops(r.tflops),
        format!("{:.1}", r.gbps),
        fmt_pct(r.efficiency),
        fmt_bound(r.bound).to_string(),
        fmt_speedup(r.speedup),
        fmt_check(r),
    ]
}

/// The kernel as run: `auto → fa2` when the backend chose, with the f32 math mode when it is not exact.
fn kernel_cell(rec: &BenchRecord) -> String {
    let mut k = rec.kernel.clone();
    if let Some(chose) = rec.auto_chose.as_deref().filter(|c| *c != rec.kernel) {
        k = format!("{k} → {chose}");
    }
    if let Some(m) = rec.f32_math.as_deref().filter(|m| *m != "exact") {
        k = format!("{k} ({m})");
    }
    k
}

const DETAIL_HEAD: [&str; 11] = [
    "backend",
    "kernel",
    "median ms",
    "min–max ms",
    "reps",
    "TFLOP/s",
    "GB/s",
    "efficiency",
    "bound",
    "speedup",
    "check",
];

/// Skipped configurations collapsed by (backend, kernel, reason).
/// (backend, kernel, reason) -> (count, any failed, a few examples).
type SkipTally = BTreeMap<(String, String, String), (usize, bool, Vec<String>)>;

fn skipped_summary(sk: &[Skipped]) -> Vec<(String, String, usize, bool, String)> {
    let mut m = SkipTally::new();
    for s in sk {
        let e = m.entry((s.backend.clone(), s.kernel.clone(), s.reason.clone())).or_default();
        e.0 += 1;
        e.1 |= s.failed;
        if e.2.len() < 3 {
            let v = s.variants.label(s.variants.diagonal);
            let v = if v.is_empty() { v } else { format!(" [{v}]") };
            e.2.push(format!("{} {}{v} {}", s.dtype, s.mask, shape_label(&s.shape)));
        }
    }
    m.into_iter()
        .map(|((b, k, reason), (n, failed, ex))| {
            let more = if n > ex.len() { format!("; {} more", n - ex.len()) } else { String::new() };
            (format!("{b}:{k}"), reason, n, failed, format!("{}{more}", ex.join("; ")))
        })
        .collect()
}

/// True when some record timed a backward: the tables then name each row's pass.
fn has_backward(r: &ResultsReport) -> bool {
    r.groups.iter().any(|g| g.pass != sdpa_core::Pass::Fwd)
}

/// Speedup summary table: per platform, (pass,) dtype and series, the median, min and max ratio to the baseline.
fn ratio_table(r: &ResultsReport) -> (Vec<String>, Vec<Vec<String>>) {
    let passes = has_backward(r);
    let head = [
        "platform",
        "pass",
        "dtype",
        "variants",
        "backend:kernel",
        "against",
        "configurations",
        "median",
        "min",
        "max",
    ]
    .iter()
    .filter(|h| passes || **h != "pass")
    .map(|s| s.to_string())
    .collect();
    let rows = r
        .speedup_summary()
        .into_iter()
        .map(|s| {
            let pass = passes.then(|| s.pass.to_string());
            [s.platform]
                .into_iter()
                .chain(pass)
                .chain([
                    s.dtype.to_string(),
                    if s.variants.is_empty() { "-".into() } else { s.variants },
                    s.series,
                    s.baseline,
                    s.configurations.to_string(),
                    format!("{:.3}x", s.median),
                    format!("{:.3}x", s.min),
                    format!("{:.3}x", s.max),
                ])
                .collect()
        })
        .collect();
    (head, rows)
}

/// Summary pivot: one row per group, one column per series (TFLOPS, with the speedup when there is one).
fn summary(r: &ResultsReport) -> (Vec<String>, Vec<Vec<String>>) {
    let passes = has_backward(r);
    let mut head: Vec<String> = ["platform", "pass", "dtype", "mask", "variants", "B", "Hq", "Hkv", "Sq", "Sk", "D"]
        .iter()
        .filter(|h| passes || **h != "pass")
        .map(|s| s.to_string())
        .collect();
    head.extend(r.series.iter().cloned());
    head.push("baseline".into());
    let rows = r
        .groups
        .iter()
        .map(|g| {
            let s = g.shape;
            let mut cells = vec![g.platform.clone()];
            if passes {
                cells.push(g.pass.to_string());
            }
            cells.extend([
                g.dtype.to_string(),
                g.mask.clone(),
                if g.variants_label.is_empty() { "-".into() } else { g.variants_label.clone() },
                s.b.to_string(),
                s.hq.to_string(),
                s.hkv.to_string(),
                s.sq.to_string(),
                s.sk.to_string(),
                if s.dv == s.d { s.d.to_string() } else { format!("{}/{}", s.d, s.dv) },
            ]);
            for name in &r.series {
                let best = g.rows.iter().filter(|x| &x.series == name).max_by(|a, b| a.tflops.total_cmp(&b.tflops));
                cells.push(best.map_or("-".into(), |x| {
                    let fail = if x.rec.check.as_ref().is_some_and(|c| !c.pass) { " FAIL" } else { "" };
                    match x.speedup {
                        Some(sp) => format!("{} ({sp:.2}x){fail}", fmt_tflops(x.tflops)),
                        None => format!("{}{fail}", fmt_tflops(x.tflops)),
                    }
                }));
            }
            cells.push(g.baseline.as_ref().map_or("-".into(), |b| b.0.clone()));
            cells
        })
        .collect();
    (head, rows)
}

/// Calls with variants against the same series without them: the time ratio (a window's saving, a
/// softcap's or ALiBi's cost) and the speedup against the same-variant baseline.
fn variants_table(r: &ResultsReport) -> (Vec<String>, Vec<Vec<String>>) {
    let head = ["configuration", "backend:kernel", "median ms", "plain ms", "time / plain", "speedup (same variants)"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let rows = r
        .variant_ratios()
        .into_iter()
        .filter_map(|v| {
            let g = r.groups.get(v.group)?;
            let against = g.baseline.as_ref().map_or(String::new(), |b| format!(" vs {}", b.0));
            Some(vec![
                g.title(),
                v.series,
                fmt_ms(v.median_ms),
                fmt_ms(v.plain_ms),
                format!("{:.3}x", v.time_ratio),
                v.speedup.map_or("-".into(), |s| format!("{s:.2}x{against}")),
            ])
        })
        .collect();
    (head, rows)
}

/// Ragged records against their dense equal-work call, the best PyTorch record of the same batch, the same
/// lengths packed, and the measured copy bandwidth.
fn serving_table(r: &ResultsReport) -> (Vec<String>, Vec<Vec<String>>) {
    let head = [
        "configuration",
        "backend:kernel",
        "median ms",
        "TFLOP/s",
        "GB/s",
        "vs dense (same work)",
        "vs best PyTorch",
        "paged vs packed",
        "GB/s / measured peak",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let rows = r
        .serving_rows()
        .into_iter()
        .filter_map(|v| {
            let g = r.groups.get(v.group)?;
            Some(vec![
                g.title(),
                v.series,
                fmt_ms(v.median_ms),
                fmt_tflops(v.tflops),
                format!("{:.1}", v.gbps),
                v.vs_dense.map_or("-".into(), |(x, what)| format!("{x:.3}x ({what})")),
                v.vs_pytorch.map_or("-".into(), |(x, k)| format!("{x:.2}x ({k})")),
                v.vs_packed.map_or("-".into(), |x| format!("{x:.3}x")),
                fmt_pct(v.of_peak_bw),
            ])
        })
        .collect();
    (head, rows)
}

/// Our backward and forward + backward records against PyTorch's of the same configuration and file, with the
/// gradients' check.
fn backward_table(r: &ResultsReport) -> (Vec<String>, Vec<Vec<String>>) {
    let mut head: Vec<String> =
        ["configuration", "pass", "backend:kernel", "median ms", "TFLOP/s"].iter().map(|s| s.to_string()).collect();
    head.extend(PYTORCH_BACKWARDS.iter().map(|(_, label)| format!("vs PyTorch {label}")));
    head.extend(
        ["vs best PyTorch", "gradients (worst of dQ, dK, dV)", "deterministic", "peak memory"]
            .iter()
            .map(|s| s.to_string()),
    );
    let rows = r
        .backward_rows()
        .into_iter()
        .filter_map(|v| {
            let g = r.groups.get(v.group)?;
            let mut cells = vec![g.title(), v.pass.to_string(), v.series, fmt_ms(v.median_ms), fmt_tflops(v.tflops)];
            cells.extend(v.vs.iter().map(|x| x.map_or("-".into(), |x| format!("{x:.2}x"))));
            cells.push(v.vs_best.map_or("-".into(), |(x, k)| format!("{x:.2}x ({k})")));
            cells.push(v.check.map_or("not checked".into(), |c| {
                format!("{} (rel {:.1e} ≤ {:.0e})", if c.pass { "pass" } else { "FAIL" }, c.rel_err, c.tolerance)
            }));
            cells.push(match v.deterministic {
                Some(true) => "yes".into(),
                Some(false) => "no".into(),
                None => "-".into(),
            });
            cells.push(v.peak_mem_bytes.map_or("-".into(), |b| format!("{:.1} MiB", b as f64 / 1048576.0)));
            Some(cells)
        })
        .collect();
    (head, rows)
}

/// The bar per grid: the median and smallest ratio to each PyTorch backward.
fn backward_summary_table(r: &ResultsReport) -> (Vec<String>, Vec<Vec<String>>) {
    let head = ["platform", "pass", "dtype", "backend:kernel", "against", "configurations", "median", "min"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let rows = r
        .backward_summary()
        .into_iter()
        .map(|s| {
            vec![
                s.platform,
                s.pass.to_string(),
                s.dtype.to_string(),
                s.series,
                s.against,
                s.configurations.to_string(),
                format!("{:.3}x", s.median),
                format!("{:.3}x", s.min),
            ]
        })
        .collect();
    (head, rows)
}

fn sources_table(r: &ResultsReport) -> (Vec<String>, Vec<Vec<String>>) {
    let head =
        ["file", "records", "skipped", "machine", "commit", "date", "command"].iter().map(|s| s.to_string()).collect();
    let rows = r
        .sources
        .iter()
        .map(|s| {
            let o = |x: &Option<String>| x.clone().unwrap_or_else(|| "-".into());
            vec![
                s.name.clone(),
                s.records.to_string(),
                s.skipped.to_string(),
                o(&s.machine),
                o(&s.commit),
                o(&s.date),
                o(&s.command),
            ]
        })
        .collect();
    (head, rows)
}

const NOTES: &str = "TFLOP/s = FLOPs of the two matrix products (causal masks and sliding windows count only the \
pairs they leave) / median time; GB/s = minimal bytes (Q, K, V read once, O written once) / median time; both recomputed from each record's \
shape, mask, dtype and median with sdpa-core's cost model. Speedup = the baseline's median / this median (above 1 \
is faster), measured within the same configuration.";

const BACKWARD_NOTE: &str = "Our backward (bwd: the backward alone, given the forward's O and LSE; fwd+bwd: both \
in one timed step) against PyTorch's on the same configuration, measured in the same file: PyTorch's median over \
ours, above 1 ours is faster (PyTorch flash on the CPU is its fused CPU kernel). TFLOP/s count the pass's work: \
the backward 2·pairs·(3D + 2Dv) FLOPs (2.5x the forward at D = Dv), fwd+bwd the sum. The check is the worst of \
dQ, dK and dV against the f64 reference. Peak memory: how far the first forward and backward raised the \
memory in use (host backends and PyTorch on the CPU: the resident set; PyTorch on CUDA: its allocator's peak).";

const VARIANTS_NOTE: &str = "Each call with a window, softcap or ALiBi against the same backend and kernel on the \
same configuration without them, measured in the same run: time / plain below 1 is a window's saving, above 1 what \
the variant costs. The speedup compares with the baseline that ran the same variants (PyTorch's FlexAttention or \
masked SDPA).";

const SERVING_NOTE: &str = "Each ragged (varlen or paged) record, its TFLOP/s and GB/s over the batch's own work and \
bytes. vs dense: its TFLOP/s over the fastest dense call of the same backend, kernel, heads and FLOPs (within 1 %; \
for decoding also the same bytes), named by its shape and layout. vs best PyTorch: the fastest PyTorch record of the \
same batch (varlen_attn, nested tensors, FlexAttention with a document mask...) over our median, above 1 ours is \
faster. paged vs packed: TFLOP/s over the same lengths without pages. GB/s / measured peak: against the copy \
bandwidth measured in the same run (or given with --peak-gbps).";

/// Paths of the SVG files the markdown links to, relative to the markdown file, with their contents.
pub fn svg_files(r: &ResultsReport) -> Vec<(String, String)> {
    let idx = |s: &str| r.series.iter().position(|x| x == s).unwrap_or(0);
    let mut v = Vec::new();
    for (i, p) in r.seq_plots.iter().enumerate() {
        let what = match p.x {
            XAxis::SeqLen => "seqlen",
            XAxis::HeadDim => "headdim",
        };
        v.push((format!("plots/tflops-vs-{what}-{}.svg", i + 1), seq_plot(p, &idx)));
    }
    for (i, p) in r.rooflines.iter().enumerate() {
        v.push((format!("plots/roofline-{}.svg", i + 1), roofline_plot(p, &idx)));
    }
    v
}

/// The markdown report; `with_plots` links the files of [`svg_files`] (written next to it by the caller).
pub fn markdown(r: &ResultsReport, with_plots: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# {}\n", r.title);
    let (h, rows) = sources_table(r);
    md::table(&mut out, &h, &rows);
    let _ = writeln!(out, "{NOTES} {}.\n", r.peak_note);
    if r.groups.is_empty() {
        out.push_str("No measured records.\n\n");
    } else {
        let (h, rows) = ratio_table(r);
        if !rows.is_empty() {
            out.push_str("## Speedup against the baseline (ratios of medians measured in the same run)\n\n");
            md::table(&mut out, &h, &rows);
        }
        out.push_str("## Summary (TFLOP/s; speedup against the baseline in brackets)\n\n");
        let (h, rows) = summary(r);
        md::table(&mut out, &h, &rows);
        let (h, rows) = variants_table(r);
        if !rows.is_empty() {
            let _ = writeln!(out, "## Variants against plain attention\n\n{VARIANTS_NOTE}\n");
            md::table(&mut out, &h, &rows);
        }
        let (h, rows) = serving_table(r);
        if !rows.is_empty() {
            let _ = writeln!(out, "## Serving layouts\n\n{SERVING_NOTE}\n");
            md::table(&mut out, &h, &rows);
        }
        let (h, rows) = backward_table(r);
        if !rows.is_empty() {
            let _ = writeln!(out, "## Backward\n\n{BACKWARD_NOTE}\n");
            let (sh, srows) = backward_summary_table(r);
            if !srows.is_empty() {
                md::table(&mut out, &sh, &srows);
            }
            md::table(&mut out, &h, &rows);
        }
    }
    if with_plots && !(r.seq_plots.is_empty() && r.rooflines.is_empty()) {
        out.push_str("## Plots\n\n");
        for ((path, _), title) in svg_files(r).iter().zip(
            r.seq_plots
                .iter()
                .map(|p| match p.x {
                    XAxis::SeqLen => format!("TFLOP/s vs sequence length: {}", p.title),
                    XAxis::HeadDim => format!("TFLOP/s vs head dim: {}", p.title),
                })
                .chain(r.rooflines.iter().map(|p| p.title.clone())),
        ) {
            let _ = writeln!(out, "![{}]({path})\n", md::cell(&title));
        }
    }
    if !r.groups.is_empty() {
        out.push_str("## Per configuration\n\n");
        for g in &r.groups {
            let _ = writeln!(out, "### {}\n", g.title());
            if let Some(dev) = devices(g) {
                let _ = writeln!(out, "Device: {dev}. Speedup against {}.\n", baseline_words(g));
            }
            let head: Vec<String> = DETAIL_HEAD.iter().map(|s| s.to_string()).collect();
            let rows: Vec<Vec<String>> = g.rows.iter().map(detail_cells).collect();
            md::table(&mut out, &head, &rows);
        }
    }
    if !r.skipped.is_empty() {
        out.push_str("## Not run\n\n");
        let head: Vec<String> =
            ["backend:kernel", "reason", "configurations", "examples"].iter().map(|s| s.to_string()).collect();
        let rows: Vec<Vec<String>> = skipped_summary(&r.skipped)
            .into_iter()
            .map(|(bk, reason, n, failed, ex)| {
                vec![bk, if failed { format!("FAILED: {reason}") } else { reason }, n.to_string(), ex]
            })
            .collect();
        md::table(&mut out, &head, &rows);
    }
    out
}

fn devices(g: &Group) -> Option<String> {
    let mut d: Vec<&str> = g.rows.iter().map(|r| r.rec.device.as_str()).collect();
    d.sort_unstable();
    d.dedup();
    (!d.is_empty()).then(|| d.join(", "))
}

fn baseline_words(g: &Group) -> String {
    g.baseline.as_ref().map_or("no baseline (none of the chosen baselines ran on this configuration)".into(), |b| {
        format!("{} ({} ms)", b.0, fmt_ms(b.1))
    })
}

/// The self-contained HTML page.
pub fn html(r: &ResultsReport) -> String {
    let idx = |s: &str| r.series.iter().position(|x| x == s).unwrap_or(0);
    let mut out = String::new();
    open_page(&mut out, &r.title, "");
    let _ = writeln!(out, "<h1>{}</h1>", esc(&r.title));
    let (h, rows) = sources_table(r);
    table(&mut out, "sources", &h, &rows, None);
    let _ = writeln!(out, "<p class=\"note\">{} {}.</p>", esc(NOTES), esc(&r.peak_note));
    if r.groups.is_empty() {
        out.push_str("<p>No measured records.</p>\n");
    } else {
        let (h, rows) = ratio_table(r);
        if !rows.is_empty() {
            out.push_str("<h2>Speedup against the baseline</h2><p class=\"note\">Ratios of medians measured in the same run.</p>\n");
            table(&mut out, "ratios", &h, &rows, None);
        }
        out.push_str("<h2>Summary</h2><p class=\"note\">TFLOP/s; speedup against the baseline in brackets.</p>\n");
        let (h, rows) = summary(r);
        table(&mut out, "summary", &h, &rows, None);
        let (h, rows) = variants_table(r);
        if !rows.is_empty() {
            let _ =
                writeln!(out, "<h2>Variants against plain attention</h2><p class=\"note\">{}</p>", esc(VARIANTS_NOTE));
            table(&mut out, "variants", &h, &rows, None);
        }
        let (h, rows) = serving_table(r);
        if !rows.is_empty() {
            let _ = writeln!(out, "<h2>Serving layouts</h2><p class=\"note\">{}</p>", esc(SERVING_NOTE));
            table(&mut out, "serving", &h, &rows, None);
        }
        let (h, rows) = backward_table(r);
        if !rows.is_empty() {
            let _ = writeln!(out, "<h2>Backward</h2><p class=\"note\">{}</p>", esc(BACKWARD_NOTE));
            let (sh, srows) = backward_summary_table(r);
            if !srows.is_empty() {
                table(&mut out, "backward-summary", &sh, &srows, None);
            }
            table(&mut out, "backward", &h, &rows, Some(h.len() - 3));
        }
    }
    if !(r.seq_plots.is_empty() && r.rooflines.is_empty()) {
        out.push_str("<h2>Plots</h2>\n<div class=\"plots\">\n");
        for p in &r.seq_plots {
            let _ = writeln!(out, "<figure class=\"seq\">{}</figure>", seq_plot(p, &idx));
        }
        for p in &r.rooflines {
            let _ = writeln!(out, "<figure class=\"roof\">{}</figure>", roofline_plot(p, &idx));
        }
        out.push_str("</div>\n");
    }
    if !r.groups.is_empty() {
        out.push_str("<h2>Per configuration</h2>\n");
        for g in &r.groups {
            let _ = writeln!(out, "<h3>{}</h3>", esc(&g.title()));
            if let Some(dev) = devices(g) {
                let _ = writeln!(
                    out,
                    "<p class=\"note\">Device: {}. Speedup against {}.</p>",
                    esc(&dev),
                    esc(&baseline_words(g))
                );
            }
            let head: Vec<String> = DETAIL_HEAD.iter().map(|s| s.to_string()).collect();
            let rows: Vec<Vec<String>> = g.rows.iter().map(detail_cells).collect();
            table(&mut out, "detail", &head, &rows, Some(DETAIL_HEAD.len() - 1));
        }
    }
    if !r.skipped.is_empty() {
        out.push_str("<h2>Not run</h2>\n");
        let head: Vec<String> =
            ["backend:kernel", "reason", "configurations", "examples"].iter().map(|s| s.to_string()).collect();
        let rows: Vec<Vec<String>> = skipped_summary(&r.skipped)
            .into_iter()
            .map(|(bk, reason, n, failed, ex)| {
                vec![bk, if failed { format!("FAILED: {reason}") } else { reason }, n.to_string(), ex]
            })
            .collect();
        table(&mut out, "skipped", &head, &rows, None);
    }
    let legend: Vec<String> = r
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| format!("<span class=\"swatch\" style=\"background:{}\"></span>{}", color(i), esc(s)))
        .collect();
    let _ = writeln!(out, "<p class=\"note\">Series: {}</p>", legend.join(" &nbsp; "));
    close_page(&mut out);
    out
}
