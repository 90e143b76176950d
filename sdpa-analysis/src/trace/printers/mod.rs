//! Printers for a [`super::report::TraceReport`]: a terminal summary, the findings markdown and one CSV row per
//! attention op. JSON is `serde_json` on the report itself.

pub mod csv;
pub mod diff;
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
