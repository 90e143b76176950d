//! Markdown tables: cells with `|` escaped and newlines folded, so a string from a trace or a result file
//! cannot break a table.

use std::fmt::Write;

/// A cell's text, safe inside a table row.
pub fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// A table with a header row and a blank line after it.
pub fn table<H: AsRef<str>>(out: &mut String, head: &[H], rows: &[Vec<String>]) {
    let _ = writeln!(out, "| {} |", head.iter().map(|h| cell(h.as_ref())).collect::<Vec<_>>().join(" | "));
    let _ = writeln!(out, "|{}", " --- |".repeat(head.len()));
    for r in rows {
        let _ = writeln!(out, "| {} |", r.iter().map(|c| cell(c)).collect::<Vec<_>>().join(" | "));
    }
    out.push('\n');
}
