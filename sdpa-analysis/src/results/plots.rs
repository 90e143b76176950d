//! Hand-written SVG plots (no dependency, no script): TFLOPS against sequence length or head dim, and the
//! roofline.
//! Every plot is a standalone `<svg>` element on the shared canvas ([`crate::render::svg`]).

use super::model::{RooflinePlot, SeqPlot, XAxis};
pub use crate::render::esc;
pub use crate::render::svg::{color, len_label};
use crate::render::svg::{nice_step, num_label, Canvas};
use std::fmt::Write;

const W: f64 = 720.0;
const H: f64 = 380.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 34.0;
const BOTTOM: f64 = 48.0;

/// The canvas of every plot of the benchmark report.
const CANVAS: Canvas = Canvas { w: W, h: H, left: LEFT, right: RIGHT, top: TOP, bottom: BOTTOM };

/// TFLOPS (linear) against sequence length or head dim (log2); `index_of` gives each series' report-wide
/// colour index.
pub fn seq_plot(p: &SeqPlot, index_of: &dyn Fn(&str) -> usize) -> String {
    let mut out = String::new();
    let (what, axis, at): (&str, &str, &str) = match p.x {
        XAxis::SeqLen => ("sequence length", "sequence length (Sk)", "Sk"),
        XAxis::HeadDim => ("head dim", "head dim (D)", "D"),
    };
    let x_label = |x: f64| match p.x {
        XAxis::SeqLen => len_label(x),
        XAxis::HeadDim => format!("{x:.0}"),
    };
    CANVAS.open(&mut out, "plot seq-plot", &p.title, &format!("TFLOPS against {what}: {}", p.title));
    let xs: Vec<f64> = {
        let mut v: Vec<f64> = p.series.iter().flat_map(|(_, pts)| pts.iter().map(|q| q.0)).collect();
        v.sort_by(f64::total_cmp);
        v.dedup();
        v
    };
    let ymax_data = p.series.iter().flat_map(|(_, pts)| pts.iter().map(|q| q.1)).fold(0.0f64, f64::max);
    let (xmin, xmax) = (xs.first().copied().unwrap_or(1.0).max(1.0), xs.last().copied().unwrap_or(2.0).max(1.0));
    let (lx0, lx1) = (xmin.log2(), if xmax > xmin { xmax.log2() } else { xmin.log2() + 1.0 });
    let step = nice_step(if ymax_data > 0.0 { ymax_data * 1.08 } else { 1.0 }, 5.0);
    let ymax = ((if ymax_data > 0.0 { ymax_data * 1.08 } else { 1.0 }) / step).ceil() * step;
    let pad = 18.0;
    let sx = |x: f64| LEFT + pad + (x.max(1.0).log2() - lx0) / (lx1 - lx0) * (W - RIGHT - LEFT - 2.0 * pad);
    let sy = |y: f64| (H - BOTTOM) - y / ymax * (H - BOTTOM - TOP);
    // Grid and ticks.
    let mut y = 0.0;
    while y <= ymax + step * 1e-9 {
        let py = sy(y);
        CANVAS.y_grid(&mut out, py, &num_label(y));
        y += step;
    }
    let stride = xs.len().div_ceil(12).max(1);
    for x in xs.iter().step_by(stride) {
        let px = sx(*x);
        CANVAS.x_grid(&mut out, px, &x_label(*x));
    }
    CANVAS.frame(&mut out, axis, "TFLOP/s");
    let mut entries = Vec::new();
    for (name, pts) in &p.series {
        let col = color(index_of(name));
        // The legend names the variants too: a windowed line is never read as a plain one.
        entries.push((if p.variants.is_empty() { name.clone() } else { format!("{name} · {}", p.variants) }, col));
        let path: Vec<String> = pts.iter().map(|(x, y)| format!("{:.2},{:.2}", sx(*x), sy(*y))).collect();
        let _ = write!(
            out,
            r#"<g class="series" data-series="{}"><polyline fill="none" stroke="{col}" stroke-width="2.2" points="{}"/>"#,
            esc(name),
            path.join(" ")
        );
        for (x, y) in pts {
            let _ = write!(
                out,
                r#"<circle class="point" cx="{:.2}" cy="{:.2}" r="3.5" fill="{col}"><title>{} at {at}={}: {:.3} TFLOP/s</title></circle>"#,
                sx(*x),
                sy(*y),
                esc(name),
                x_label(*x),
                y
            );
        }
        out.push_str("</g>");
    }
    CANVAS.legend(&mut out, &entries);
    out.push_str("</svg>");
    out
}

/// Achieved TFLOPS against arithmetic intensity, log-log, with the compute ceilings and the bandwidth roof.
pub fn roofline_plot(p: &RooflinePlot, index_of: &dyn Fn(&str) -> usize) -> String {
    let mut out = String::new();
    CANVAS.open(&mut out, "plot roofline", &p.title, &format!("roofline: {}", p.title));
    let ai: Vec<f64> = p.points.iter().map(|q| q.1).collect();
    let tf: Vec<f64> = p.points.iter().map(|q| q.2).collect();
    let peak_max = p.ceilings.iter().map(|c| c.1).fold(0.0f64, f64::max);
    let ridge_max = p.gbps.map_or(0.0, |bw| p.ceilings.iter().map(|c| c.1 * 1e3 / bw).fold(0.0f64, f64::max));
    let amin = ai.iter().copied().fold(f64::INFINITY, f64::min);
    let amax = ai.iter().copied().fold(0.0f64, f64::max).max(ridge_max);
    let tmin = tf.iter().copied().fold(f64::INFINITY, f64::min);
    let tmax = tf.iter().copied().fold(0.0f64, f64::max).max(peak_max);
    let (amin, amax) = if amin.is_finite() { (amin, amax) } else { (1.0, 100.0) };
    let (tmin, tmax) = if tmin.is_finite() { (tmin, tmax) } else { (0.1, 1.0) };
    let (lx0, lx1) = ((amin / 2.0).log10().floor(), (amax * 2.0).log10().ceil());
    let (ly0, ly1) = ((tmin / 2.0).log10().floor(), (tmax * 1.5).log10().ceil());
    let sx = |x: f64| LEFT + (x.log10() - lx0) / (lx1 - lx0) * (W - RIGHT - LEFT);
    let sy = |y: f64| (H - BOTTOM) - (y.log10() - ly0) / (ly1 - ly0) * (H - BOTTOM - TOP);
    for e in lx0 as i32..=lx1 as i32 {
        let v = 10f64.powi(e);
        let px = sx(v);
        CANVAS.x_grid(&mut out, px, &num_label(v));
    }
    for e in ly0 as i32..=ly1 as i32 {
        let v = 10f64.powi(e);
        let py = sy(v);
        CANVAS.y_grid(&mut out, py, &num_label(v));
    }
    CANVAS.frame(&mut out, "arithmetic intensity (FLOP / minimal byte)", "TFLOP/s");
    // Roofs: min(peak, intensity · bandwidth) over the x range.
    let (xa, xb) = (10f64.powf(lx0), 10f64.powf(lx1));
    for (label, peak) in &p.ceilings {
        let mut pts = Vec::new();
        if let Some(bw) = p.gbps {
            let tb = bw / 1e3; // TB/s: TFLOP/s per FLOP/byte.
            let ridge = peak / tb;
            let start = xa.max(10f64.powf(ly0) / tb);
            if ridge > start {
                pts.push((start, start * tb));
            }
            pts.push((ridge.clamp(xa, xb), peak.min(ridge.clamp(xa, xb) * tb)));
        } else {
            pts.push((xa, *peak));
        }
        pts.push((xb, *peak));
        let path: Vec<String> = pts.iter().map(|(x, y)| format!("{:.2},{:.2}", sx(*x), sy(*y))).collect();
        let _ = write!(
            out,
            r##"<g class="roof"><polyline fill="none" stroke="#666" stroke-dasharray="6 3" stroke-width="1.5" points="{}"/><text x="{}" y="{}" text-anchor="end" fill="#444">{}</text></g>"##,
            path.join(" "),
            W - RIGHT - 4.0,
            sy(*peak) - 5.0,
            esc(&format!("{label}: {} TFLOP/s", num_label(*peak)))
        );
    }
    let mut entries: Vec<(String, &'static str)> = Vec::new();
    for (series, x, y, label) in &p.points {
        let col = color(index_of(series));
        if !entries.iter().any(|e| &e.0 == series) {
            entries.push((series.clone(), col));
        }
        let _ = write!(
            out,
            r#"<circle class="point" data-series="{}" cx="{:.2}" cy="{:.2}" r="4" fill="{col}" fill-opacity="0.85"><title>{}</title></circle>"#,
            esc(series),
            sx(*x),
            sy(*y),
            esc(label)
        );
    }
    CANVAS.legend(&mut out, &entries);
    out.push_str("</svg>");
    out
}
