//! Hand-written SVG plots (no dependency, no script): TFLOPS against sequence length or head dim, and the
//! roofline.
//! Every plot is a standalone `<svg>` element with a `viewBox`, so it scales in a page and opens on its own.

use super::model::{RooflinePlot, SeqPlot, XAxis};
use std::fmt::Write;

const W: f64 = 720.0;
const H: f64 = 380.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 34.0;
const BOTTOM: f64 = 48.0;

/// Colour-blind-friendly palette; a series keeps its colour in every plot of a report.
const PALETTE: [&str; 10] =
    ["#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#999999", "#f0e442", "#882255"];

/// Colour of the `i`-th series of the report.
pub fn color(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// Escapes text for XML and HTML.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// 512 -> "512", 1024 -> "1k", 16384 -> "16k", 32768 -> "32k", 1536 -> "1.5k".
pub fn len_label(x: f64) -> String {
    if x >= 1024.0 {
        let k = x / 1024.0;
        if (k - k.round()).abs() < 1e-9 {
            format!("{}k", k.round())
        } else {
            format!("{k:.1}k")
        }
    } else {
        format!("{x}")
    }
}

fn num_label(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a < 1e-3 {
        format!("{v:.1e}")
    } else {
        // Enough decimals for two significant digits, trailing zeros trimmed.
        let decimals = ((-a.log10()).floor() as i64 + 2).clamp(0, 6) as usize;
        let s = format!("{v:.decimals$}");
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    }
}

/// A "nice" step for about `n` ticks over `[0, max]`.
fn nice_step(max: f64, n: f64) -> f64 {
    let raw = max / n;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn open(out: &mut String, class: &str, title: &str, aria: &str) {
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" class="{class}" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{}" font-family="system-ui, sans-serif" font-size="12">"#,
        esc(aria)
    );
    let _ = write!(out, r##"<rect x="0" y="0" width="{W}" height="{H}" fill="#ffffff"/>"##);
    // Long titles get a smaller font so they stay inside the picture.
    let size = match title.chars().count() {
        0..=70 => 13.0,
        71..=90 => 11.0,
        _ => 9.5,
    };
    let _ = write!(
        out,
        r#"<text x="{}" y="20" text-anchor="middle" font-size="{size}" font-weight="600">{}</text>"#,
        W / 2.0,
        esc(title)
    );
}

fn frame(out: &mut String, x_label: &str, y_label: &str) {
    let (x0, x1, y0, y1) = (LEFT, W - RIGHT, H - BOTTOM, TOP);
    let _ = write!(
        out,
        r##"<rect x="{x0}" y="{y1}" width="{}" height="{}" fill="none" stroke="#444"/>"##,
        x1 - x0,
        y0 - y1
    );
    let _ =
        write!(out, r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#, (x0 + x1) / 2.0, H - 10.0, esc(x_label));
    let _ = write!(
        out,
        r#"<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">{}</text>"#,
        (y0 + y1) / 2.0,
        (y0 + y1) / 2.0,
        esc(y_label)
    );
}

fn legend(out: &mut String, entries: &[(String, &'static str)]) {
    let x = W - RIGHT + 14.0;
    for (i, (name, col)) in entries.iter().enumerate() {
        let y = TOP + 8.0 + 18.0 * i as f64;
        let _ = write!(
            out,
            r#"<g class="legend-entry"><line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{col}" stroke-width="3"/><circle cx="{}" cy="{y}" r="3.5" fill="{col}"/><text x="{}" y="{}">{}</text></g>"#,
            x + 22.0,
            x + 11.0,
            x + 28.0,
            y + 4.0,
            esc(name)
        );
    }
}

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
    open(&mut out, "plot seq-plot", &p.title, &format!("TFLOPS against {what}: {}", p.title));
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
        let _ = write!(
            out,
            r##"<line x1="{LEFT}" y1="{py}" x2="{}" y2="{py}" stroke="#e4e4e4"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            py + 4.0,
            num_label(y)
        );
        y += step;
    }
    let stride = xs.len().div_ceil(12).max(1);
    for x in xs.iter().step_by(stride) {
        let px = sx(*x);
        let _ = write!(
            out,
            r##"<line x1="{px}" y1="{TOP}" x2="{px}" y2="{}" stroke="#e4e4e4"/><text x="{px}" y="{}" text-anchor="middle">{}</text>"##,
            H - BOTTOM,
            H - BOTTOM + 16.0,
            x_label(*x)
        );
    }
    frame(&mut out, axis, "TFLOP/s");
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
    legend(&mut out, &entries);
    out.push_str("</svg>");
    out
}

/// Achieved TFLOPS against arithmetic intensity, log-log, with the compute ceilings and the bandwidth roof.
pub fn roofline_plot(p: &RooflinePlot, index_of: &dyn Fn(&str) -> usize) -> String {
    let mut out = String::new();
    open(&mut out, "plot roofline", &p.title, &format!("roofline: {}", p.title));
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
        let _ = write!(
            out,
            r##"<line x1="{px}" y1="{TOP}" x2="{px}" y2="{}" stroke="#e4e4e4"/><text x="{px}" y="{}" text-anchor="middle">{}</text>"##,
            H - BOTTOM,
            H - BOTTOM + 16.0,
            num_label(v)
        );
    }
    for e in ly0 as i32..=ly1 as i32 {
        let v = 10f64.powi(e);
        let py = sy(v);
        let _ = write!(
            out,
            r##"<line x1="{LEFT}" y1="{py}" x2="{}" y2="{py}" stroke="#e4e4e4"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            W - RIGHT,
            LEFT - 6.0,
            py + 4.0,
            num_label(v)
        );
    }
    frame(&mut out, "arithmetic intensity (FLOP / minimal byte)", "TFLOP/s");
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
    legend(&mut out, &entries);
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_read_like_the_seed_tables() {
        assert_eq!(len_label(512.0), "512");
        assert_eq!(len_label(16384.0), "16k");
        assert_eq!(len_label(1536.0), "1.5k");
        assert_eq!(esc("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
        assert_eq!(nice_step(7.3, 5.0), 2.0);
        assert_eq!(num_label(0.05), "0.05");
        assert_eq!(num_label(0.0125), "0.013");
        assert_eq!(num_label(2.5), "2.5");
        assert_eq!(num_label(4e-5), "4.0e-5");
    }
}
