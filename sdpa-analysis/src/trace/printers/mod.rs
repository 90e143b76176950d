//! Printers for a [`super::report::TraceReport`]: a terminal summary, the findings markdown, one CSV row per
//! attention op and a self-contained HTML page ([`html`], its figures in [`charts`]); and for a
//! [`super::diff::TraceDiff`] the text and markdown of [`diff`]. JSON is `serde_json` on the report or diff.

pub mod charts;
pub mod csv;
pub mod diff;
pub mod html;
pub mod markdown;
pub mod text;

/// `12.3 %` from a fraction.
pub(crate) fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

/// An optional float with `digits`, or `-`.
pub(crate) fn opt(x: Option<f64>, digits: usize) -> String {
    x.map(|v| format!("{v:.digits$}")).unwrap_or_else(|| "-".into())
}
