//! The SVG figures of the analysis page, drawn on the shared canvas ([`crate::render::svg`]):
//!
//! - [`timeline`]: one row per layer, every attention call a bar at its op's start (CPU clock) as long as its
//!   GPU time ([`crate::trace::timeline`]); fused-kernel calls blue, unfused chains and SDPA's math fallback
//!   orange, backward bars lighter with an outline (classes `span fused|unfused fwd|bwd`).
//! - [`efficiency`]: each op's efficiency against its key length (log2 axis), with the band it is judged
//!   against drawn behind it (its own `expected_band`: low to high, the label in the tooltip; class `band`);
//!   forward ops as circles, backward as squares.
//!
//! Every string from the trace (module paths, kernel and op names) is escaped.

use crate::render::esc;
use crate::render::svg::{len_label, nice_step, num_label, Canvas};
use crate::trace::attention::{Kind, Phase};
use crate::trace::report::{AttentionOp, TraceReport};
use std::fmt::Write;

const FUSED: &str = "#0072b2";
const UNFUSED: &str = "#d55e00";
const BAND: &str = "#009e73";
const ROW_H: f64 = 18.0;
/// Least distance between two x tick labels, px.
const MIN_TICK_GAP: f64 = 36.0;
/// Longest row label drawn; the full path is in the label's tooltip.
const LABEL_CHARS: usize = 44;

/// True when the op ran a flash-style fused kernel.
fn fused(o: &AttentionOp) -> bool {
    o.kind == Kind::Fused && o.fused_kernel
}

/// `fused fwd`, `unfused bwd`: the classes (and legend words) of an op's marks.
fn classes(o: &AttentionOp) -> String {
    format!("{} {}", if fused(o) { "fused" } else { "unfused" }, o.phase.name())
}

fn colour(o: &AttentionOp) -> &'static str {
    if fused(o) {
        FUSED
    } else {
        UNFUSED
    }
}

/// `fused cudnn fwd 2,8,8,1024,1024,64 bf16 causal`.
fn describe(o: &AttentionOp) -> String {
    format!(
        "{} {} {} {} {} {}",
        o.kind.name(),
        o.backend.name(),
        o.phase.name(),
        o.shape_label(),
        o.dtype.as_deref().unwrap_or("-"),
        o.mask_and_variants()
    )
}

fn shorten(s: &str, n: usize) -> String {
    let count = s.chars().count();
    if count <= n {
        s.to_string()
    } else {
        format!("…{}", s.chars().skip(count - (n - 1)).collect::<String>())
    }
}

/// The four marks of the legend: fused / unfused, forward / backward.
fn legend(out: &mut String, x: f64, y: f64, bars: bool) {
    let entries = [
        (FUSED, Phase::Fwd, "fused kernel, fwd"),
        (FUSED, Phase::Bwd, "fused kernel, bwd"),
        (UNFUSED, Phase::Fwd, "unfused / math, fwd"),
        (UNFUSED, Phase::Bwd, "unfused / math, bwd"),
    ];
    for (i, (col, phase, name)) in entries.iter().enumerate() {
        let yy = y + 18.0 * i as f64;
        let mark = match (bars, phase) {
            (true, Phase::Fwd) => format!(r#"<rect x="{x}" y="{}" width="16" height="10" fill="{col}"/>"#, yy - 5.0),
            (true, Phase::Bwd) => format!(
                r#"<rect x="{x}" y="{}" width="16" height="10" fill="{col}" fill-opacity="0.35" stroke="{col}"/>"#,
                yy - 5.0
            ),
            (false, Phase::Fwd) => format!(r#"<circle cx="{}" cy="{yy}" r="4.5" fill="{col}"/>"#, x + 8.0),
            (false, Phase::Bwd) => {
                format!(r#"<rect x="{}" y="{}" width="9" height="9" fill="{col}"/>"#, x + 3.5, yy - 4.5)
            }
        };
        let _ =
            write!(out, r#"<g class="legend-entry">{mark}<text x="{}" y="{}">{name}</text></g>"#, x + 22.0, yy + 4.0);
    }
}

/// Ticks of a linear axis over `[0, max]`: (value, step).
fn ticks(max: f64) -> (f64, f64) {
    let max = if max > 0.0 { max } else { 1.0 };
    let step = nice_step(max, 6.0);
    ((max / step).ceil() * step, step)
}

/// The per-layer timeline of a report's calls, or `None` when the report has none placed in time. The time
/// axis runs to `span_us` when given (two timelines on one scale), else to the last call's end.
pub fn timeline(r: &TraceReport, title: &str, span_us: Option<f64>) -> Option<String> {
    let t = &r.timeline;
    if t.is_empty() {
        return None;
    }
    let c = Canvas {
        w: 1100.0,
        h: 34.0 + 20.0 + ROW_H * t.rows.len() as f64 + 52.0,
        left: 300.0,
        right: 170.0,
        top: 54.0,
        bottom: 52.0,
    };
    let end = span_us.unwrap_or(0.0).max(t.end_us());
    // Milliseconds once the span is long enough that microseconds make unreadable ticks.
    let (unit, div) = if end >= 10_000.0 { ("ms", 1000.0) } else { ("µs", 1.0) };
    let (xmax, step) = ticks(end / div);
    let sx = |us: f64| c.left + (us / div) / xmax * (c.w - c.left - c.right);
    let mut out = String::new();
    c.open(&mut out, "plot timeline", title, &format!("attention calls by layer over time: {title}"));
    let mut x = 0.0;
    while x <= xmax + step * 1e-9 {
        let px = c.left + x / xmax * (c.w - c.left - c.right);
        c.x_grid(&mut out, px, &num_label(x));
        x += step;
    }
    for (i, row) in t.rows.iter().enumerate() {
        let y = c.top + ROW_H * i as f64;
        if i % 2 == 1 {
            let _ = write!(
                out,
                r##"<rect x="{}" y="{y}" width="{}" height="{ROW_H}" fill="#f6f6f6"/>"##,
                c.left,
                c.w - c.left - c.right
            );
        }
        let _ = write!(
            out,
            r#"<text class="row-label" x="{}" y="{}" text-anchor="end" font-size="11"><title>{}</title>{}</text>"#,
            c.left - 6.0,
            y + ROW_H * 0.7,
            esc(row),
            esc(&shorten(row, LABEL_CHARS))
        );
    }
    c.frame(
        &mut out,
        &format!("op start on the CPU clock ({unit} after the first attention call); bar length = GPU time"),
        "",
    );
    for s in &t.spans {
        let Some(o) = r.attention_ops.get(s.op) else { continue };
        let col = colour(o);
        let (x0, x1) = (sx(s.start_us), sx(s.start_us + s.gpu_us));
        let y = c.top + ROW_H * s.row as f64 + 3.0;
        let style = match o.phase {
            Phase::Fwd => format!(r#"fill="{col}""#),
            Phase::Bwd => format!(r#"fill="{col}" fill-opacity="0.35" stroke="{col}""#),
        };
        let _ = write!(
            out,
            r#"<rect class="span {}" data-op="{}" x="{x0:.2}" y="{y:.1}" width="{:.2}" height="{}" {style}><title>{} · op {}: {} · start {:.1} µs · GPU {:.1} µs</title></rect>"#,
            classes(o),
            s.op,
            (x1 - x0).max(1.5),
            ROW_H - 6.0,
            esc(t.rows.get(s.row).map(String::as_str).unwrap_or("")),
            s.op + 1,
            esc(&describe(o)),
            s.start_us,
            s.gpu_us
        );
    }
    legend(&mut out, c.w - c.right + 12.0, c.top + 8.0, true);
    out.push_str("</svg>");
    Some(out)
}

/// Efficiency against key length with each op's expected band, or `None` when no op has an efficiency.
pub fn efficiency(r: &TraceReport, title: &str) -> Option<String> {
    let ops: Vec<(usize, &AttentionOp, usize, f64)> = r
        .attention_ops
        .iter()
        .enumerate()
        .filter_map(|(i, o)| Some((i, o, o.sk?, o.efficiency?)))
        .filter(|&(_, _, sk, e)| sk > 0 && e.is_finite())
        .collect();
    if ops.is_empty() {
        return None;
    }
    let c = Canvas { w: 900.0, h: 420.0, left: 64.0, right: 190.0, top: 34.0, bottom: 48.0 };
    let top_value =
        ops.iter().map(|&(_, o, _, e)| e.max(o.expected_band.as_ref().map_or(0.0, |b| b.high))).fold(0.0f64, f64::max);
    let (ymax, step) = ticks(top_value * 100.0 * 1.08);
    let mut xs: Vec<f64> = ops.iter().map(|&(_, _, sk, _)| sk as f64).collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    let (lx0, lx1) = match (xs.first(), xs.last()) {
        (Some(a), Some(b)) if b > a => (a.log2() - 0.5, b.log2() + 0.5),
        (Some(a), _) => (a.log2() - 1.0, a.log2() + 1.0),
        _ => (0.0, 1.0),
    };
    let sx = |x: f64| c.left + (x.log2() - lx0) / (lx1 - lx0) * (c.w - c.left - c.right);
    let sy = |pct: f64| (c.h - c.bottom) - pct / ymax * (c.h - c.bottom - c.top);
    let mut out = String::new();
    c.open(&mut out, "plot efficiency", title, &format!("efficiency against sequence length: {title}"));
    let mut y = 0.0;
    while y <= ymax + step * 1e-9 {
        let py = sy(y);
        c.y_grid(&mut out, py, &num_label(y));
        y += step;
    }
    // Lengths a few keys apart (a decode loop's growing cache) share one tick: labels never overlap.
    let mut last_tick = f64::NEG_INFINITY;
    for x in &xs {
        let px = sx(*x);
        if px - last_tick >= MIN_TICK_GAP {
            c.x_grid(&mut out, px, &len_label(*x));
            last_tick = px;
        }
    }
    c.frame(&mut out, "key length (Sk, log scale)", "efficiency (% of the roofline)");
    // Bands first, behind the points; the same band at the same length is drawn once.
    // The same band where another copy of it already stands (within a bar's width) is not drawn again, so
    // overlapping copies do not darken it.
    let mut drawn: Vec<(f64, &crate::trace::perf::Band)> = Vec::new();
    for &(_, o, sk, _) in &ops {
        let Some(b) = &o.expected_band else { continue };
        let (px, top, bottom) = (sx(sk as f64), sy(b.high * 100.0), sy(b.low * 100.0));
        if drawn.iter().any(|(x, d)| (x - px).abs() < 12.0 && *d == b) {
            continue;
        }
        drawn.push((px, b));
        let _ = write!(
            out,
            r#"<rect class="band" data-low="{}" data-high="{}" x="{:.2}" y="{top:.2}" width="24" height="{:.2}" fill="{BAND}" fill-opacity="0.18" stroke="{BAND}" stroke-opacity="0.6"><title>expected {:.0}-{:.0} % at Sk = {}: {}</title></rect>"#,
            b.low,
            b.high,
            px - 12.0,
            (bottom - top).max(1.0),
            b.low * 100.0,
            b.high * 100.0,
            sk,
            esc(&b.label)
        );
    }
    for &(i, o, sk, e) in &ops {
        // Forward left of the length's line, backward right of it, so the two passes of one shape both show.
        let dx = if o.phase == Phase::Fwd { -5.0 } else { 5.0 };
        let (px, py) = (sx(sk as f64) + dx, sy(e * 100.0));
        let col = colour(o);
        let tip = format!(
            "op {}: {} · {:.1} % {}{}",
            i + 1,
            describe(o),
            e * 100.0,
            o.band_status.map(|s| format!("({s} the band)")).unwrap_or_default(),
            if o.work.sign().is_empty() { String::new() } else { format!(" · work {}", o.work.name()) }
        );
        let mark = match o.phase {
            Phase::Fwd => format!(
                r#"<circle class="point {}" data-op="{i}" cx="{px:.2}" cy="{py:.2}" r="4.5" fill="{col}">"#,
                classes(o)
            ),
            Phase::Bwd => format!(
                r#"<rect class="point {}" data-op="{i}" x="{:.2}" y="{:.2}" width="9" height="9" fill="{col}">"#,
                classes(o),
                px - 4.5,
                py - 4.5
            ),
        };
        let close = if o.phase == Phase::Fwd { "</circle>" } else { "</rect>" };
        let _ = write!(out, "{mark}<title>{}</title>{close}", esc(&tip));
    }
    legend(&mut out, c.w - c.right + 14.0, c.top + 8.0, false);
    let y = c.top + 8.0 + 18.0 * 4.0;
    let _ = write!(
        out,
        r#"<g class="legend-entry"><rect x="{}" y="{}" width="16" height="12" fill="{BAND}" fill-opacity="0.18" stroke="{BAND}"/><text x="{}" y="{}">expected band</text></g>"#,
        c.w - c.right + 14.0,
        y - 6.0,
        c.w - c.right + 36.0,
        y + 4.0
    );
    out.push_str("</svg>");
    Some(out)
}
