//! Printers for a [`TraceDiff`] (`sdpa analyze --diff`): the terminal summary ([`text`]) and markdown
//! ([`markdown`], `--md FILE`); JSON is `serde_json` on the diff itself. The table rows are shared with the
//! HTML page ([`matched_rows`], [`unmatched_rows`]).

use super::pct;
use crate::render::markdown as md;
use crate::trace::diff::{Side, TraceDiff, Unmatched};
use std::fmt::Write;

/// `+12.3` / `-4.0` (µs), with a sign always.
pub(crate) fn signed(x: f64, digits: usize) -> String {
    format!("{x:+.digits$}")
}

/// An efficiency delta in percentage points: `+12.3 pp`.
pub(crate) fn points(x: Option<f64>) -> String {
    x.map(|d| format!("{:+.1} pp", d * 100.0)).unwrap_or_else(|| "-".into())
}

fn eff(x: Option<f64>) -> String {
    x.map(pct).unwrap_or_else(|| "-".into())
}

/// Head of the matched-ops table.
pub const MATCHED_HEAD: [&str; 13] = [
    "module",
    "pass",
    "B,Hq,Hkv,Sq,Sk,D",
    "dtype",
    "before",
    "after",
    "calls",
    "before µs",
    "after µs",
    "delta µs",
    "speedup/call",
    "efficiency",
    "change",
];

/// One row per match, cells as [`MATCHED_HEAD`] names them.
pub fn matched_rows(d: &TraceDiff) -> Vec<Vec<String>> {
    d.matched
        .iter()
        .map(|m| {
            let side =
                |s: &crate::trace::diff::OpSet| format!("{} ({})", s.implementations.join(" + "), s.masks.join(", "));
            vec![
                m.module.clone(),
                m.phase.name().to_string(),
                m.shape.clone(),
                m.dtype.clone().unwrap_or_else(|| "-".into()),
                side(&m.before),
                side(&m.after),
                format!("{} -> {}", m.before.count, m.after.count),
                format!("{:.1}", m.before.total_us),
                format!("{:.1}", m.after.total_us),
                signed(m.time_delta_us, 1),
                m.speedup.map(|s| format!("{s:.2}x")).unwrap_or_else(|| "-".into()),
                format!("{} -> {} ({})", eff(m.before.efficiency), eff(m.after.efficiency), points(m.efficiency_delta)),
                m.change.label().to_string(),
            ]
        })
        .collect()
}

/// Head of the appeared / disappeared tables.
pub const UNMATCHED_HEAD: [&str; 9] =
    ["module", "pass", "implementation", "B,Hq,Hkv,Sq,Sk,D", "dtype", "mask", "calls", "total µs", "meaning"];

/// One row per unmatched op, cells as [`UNMATCHED_HEAD`] names them.
pub fn unmatched_rows(list: &[Unmatched]) -> Vec<Vec<String>> {
    list.iter()
        .map(|u| {
            vec![
                u.module.clone(),
                u.phase.name().to_string(),
                u.implementation.clone(),
                u.shape.clone(),
                u.dtype.clone().unwrap_or_else(|| "-".into()),
                u.mask.clone(),
                u.count.to_string(),
                format!("{:.1}", u.total_us),
                u.meaning.clone(),
            ]
        })
        .collect()
}

/// Head of the totals table.
pub const TOTALS_HEAD: [&str; 8] =
    ["", "inputs", "device", "GPU µs", "attention µs", "share", "fused / unfused µs", "efficiency (time-weighted)"];

/// The before and after rows of the totals table.
pub fn totals_rows(d: &TraceDiff) -> Vec<Vec<String>> {
    let row = |name: &str, s: &Side| {
        vec![
            name.to_string(),
            s.inputs.join(", "),
            s.device.clone().unwrap_or_else(|| "unknown".into()),
            format!("{:.1}", s.total_gpu_time_us),
            format!("{:.1}", s.attention_time_us),
            pct(s.attention_share),
            format!("{:.1} / {:.1}", s.fused_time_us, s.unfused_time_us),
            eff(s.efficiency),
        ]
    };
    vec![row("before", &d.before), row("after", &d.after)]
}

/// One line: `attention 1459.4 -> 154.6 µs (-1304.8 µs, 9.44x); GPU ...`.
pub fn headline(d: &TraceDiff) -> String {
    let speed = d.attention_speedup.map(|s| format!(", {s:.2}x")).unwrap_or_default();
    format!(
        "attention {:.1} -> {:.1} µs ({} µs{speed}); GPU time {:.1} -> {:.1} µs ({} µs); {} matched, {} appeared, \
         {} disappeared; Path A realised {}, regressed {}",
        d.before.attention_time_us,
        d.after.attention_time_us,
        signed(d.attention_delta_us, 1),
        d.before.total_gpu_time_us,
        d.after.total_gpu_time_us,
        signed(d.gpu_delta_us, 1),
        d.matched.len(),
        d.appeared.len(),
        d.disappeared.len(),
        d.path_a_realised,
        d.regressed
    )
}

/// The terminal summary.
pub fn text(d: &TraceDiff) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "sdpa analyze --diff");
    let _ = writeln!(s, "before: {}", d.before.inputs.join(", "));
    let _ = writeln!(s, "after:  {}", d.after.inputs.join(", "));
    let _ = writeln!(s, "{}", headline(d));
    let _ = writeln!(s, "efficiency (time-weighted): {} -> {}", eff(d.before.efficiency), eff(d.after.efficiency));
    for n in &d.notes {
        let _ = writeln!(s, "note: {n}");
    }
    let block = |s: &mut String, title: &str, head: &[&str], rows: Vec<Vec<String>>| {
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(s, "\n{title}:");
        for r in rows {
            let cells: Vec<String> = head.iter().zip(&r).map(|(h, c)| format!("{h}: {c}")).collect();
            let _ = writeln!(s, "  {}", cells.join(" | "));
        }
    };
    block(&mut s, "matched", &MATCHED_HEAD, matched_rows(d));
    for m in d.matched.iter().filter(|m| !m.notes.is_empty()) {
        for n in &m.notes {
            let _ = writeln!(s, "  note ({} {} {}): {n}", m.module, m.phase.name(), m.shape);
        }
    }
    block(&mut s, "appeared (after only)", &UNMATCHED_HEAD, unmatched_rows(&d.appeared));
    block(&mut s, "disappeared (before only)", &UNMATCHED_HEAD, unmatched_rows(&d.disappeared));
    s
}

/// The markdown document.
pub fn markdown(d: &TraceDiff) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Attention before and after\n");
    let _ = writeln!(s, "{}.\n", md::cell(&headline(d)));
    md::table(&mut s, &TOTALS_HEAD, &totals_rows(d));
    for n in &d.notes {
        let _ = writeln!(s, "- Note: {}", md::cell(n));
    }
    if !d.notes.is_empty() {
        s.push('\n');
    }
    let _ = writeln!(s, "## Matched ops\n");
    if d.matched.is_empty() {
        let _ = writeln!(s, "None: no op of one input has the module, pass, shape and dtype of an op of the other.\n");
    } else {
        md::table(&mut s, &MATCHED_HEAD, &matched_rows(d));
        for m in &d.matched {
            for n in &m.notes {
                let _ = writeln!(s, "- {} {} {}: {}", md::cell(&m.module), m.phase.name(), m.shape, md::cell(n));
            }
        }
        if d.matched.iter().any(|m| !m.notes.is_empty()) {
            s.push('\n');
        }
    }
    for (title, list) in [("Appeared (after only)", &d.appeared), ("Disappeared (before only)", &d.disappeared)] {
        if !list.is_empty() {
            let _ = writeln!(s, "## {title}\n");
            md::table(&mut s, &UNMATCHED_HEAD, &unmatched_rows(list));
        }
    }
    s
}
