//! The SVG canvas of every plot: a [`Canvas`] (size and margins) opens a standalone `<svg>` with a `viewBox`
//! (so it scales in a page and opens on its own), draws the plot frame with its axis labels and the legend;
//! tick labels ([`len_label`], [`num_label`], [`nice_step`]) and the colour-blind-friendly palette
//! ([`color`]) are shared. Hand-written, no dependency, no script; all text through [`super::esc`].

use super::esc;
use std::fmt::Write;

/// Colour-blind-friendly palette; a series keeps its colour in every plot of a report.
const PALETTE: [&str; 10] =
    ["#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#999999", "#f0e442", "#882255"];

/// Colour of the `i`-th series of a report.
pub fn color(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
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

/// A tick label with about two significant digits: `0.05`, `0.013`, `2.5`, `350`, `4.0e-5`.
pub fn num_label(v: f64) -> String {
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

/// A "nice" step (1, 2 or 5 times a power of ten) for about `n` ticks over `[0, max]`.
pub fn nice_step(max: f64, n: f64) -> f64 {
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

/// A plot's size and margins, in SVG user units; the plot area is inside the margins, the legend in the right
/// margin.
#[derive(Debug, Clone, Copy)]
pub struct Canvas {
    /// Width.
    pub w: f64,
    /// Height.
    pub h: f64,
    /// Left margin (y tick labels and the y axis label).
    pub left: f64,
    /// Right margin (the legend).
    pub right: f64,
    /// Top margin (the title).
    pub top: f64,
    /// Bottom margin (x tick labels and the x axis label).
    pub bottom: f64,
}

impl Canvas {
    /// Opens the `<svg>` (class, accessible label) on a white ground, with the title centred on top.
    pub fn open(&self, out: &mut String, class: &str, title: &str, aria: &str) {
        let (w, h) = (self.w, self.h);
        let _ = write!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" class="{}" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{}" font-family="system-ui, sans-serif" font-size="12">"#,
            esc(class),
            esc(aria)
        );
        let _ = write!(out, r##"<rect x="0" y="0" width="{w}" height="{h}" fill="#ffffff"/>"##);
        // Long titles get a smaller font so they stay inside the picture.
        let size = match title.chars().count() {
            0..=70 => 13.0,
            71..=90 => 11.0,
            _ => 9.5,
        };
        let _ = write!(
            out,
            r#"<text x="{}" y="20" text-anchor="middle" font-size="{size}" font-weight="600">{}</text>"#,
            w / 2.0,
            esc(title)
        );
    }

    /// The plot area's border and the two axis labels.
    pub fn frame(&self, out: &mut String, x_label: &str, y_label: &str) {
        let (x0, x1, y0, y1) = (self.left, self.w - self.right, self.h - self.bottom, self.top);
        let _ = write!(
            out,
            r##"<rect x="{x0}" y="{y1}" width="{}" height="{}" fill="none" stroke="#444"/>"##,
            x1 - x0,
            y0 - y1
        );
        let _ = write!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            (x0 + x1) / 2.0,
            self.h - 10.0,
            esc(x_label)
        );
        let _ = write!(
            out,
            r#"<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">{}</text>"#,
            (y0 + y1) / 2.0,
            (y0 + y1) / 2.0,
            esc(y_label)
        );
    }

    /// A vertical grid line at `px` across the plot area, labelled under it.
    pub fn x_grid(&self, out: &mut String, px: f64, label: &str) {
        let _ = write!(
            out,
            r##"<line x1="{px:.2}" y1="{}" x2="{px:.2}" y2="{}" stroke="#e4e4e4"/><text x="{px:.2}" y="{}" text-anchor="middle">{}</text>"##,
            self.top,
            self.h - self.bottom,
            self.h - self.bottom + 16.0,
            esc(label)
        );
    }

    /// A horizontal grid line at `py` across the plot area, labelled left of it.
    pub fn y_grid(&self, out: &mut String, py: f64, label: &str) {
        let _ = write!(
            out,
            r##"<line x1="{}" y1="{py:.2}" x2="{}" y2="{py:.2}" stroke="#e4e4e4"/><text x="{}" y="{:.2}" text-anchor="end">{}</text>"##,
            self.left,
            self.w - self.right,
            self.left - 6.0,
            py + 4.0,
            esc(label)
        );
    }

    /// A legend of (name, colour) lines with a dot, top to bottom in the right margin.
    pub fn legend(&self, out: &mut String, entries: &[(String, &str)]) {
        let x = self.w - self.right + 14.0;
        for (i, (name, col)) in entries.iter().enumerate() {
            let y = self.top + 8.0 + 18.0 * i as f64;
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
