//! HTML pieces of the self-contained pages: text escaping (every string that came from a file or a trace goes
//! through [`esc`]), one table printer, the shared style sheet and the page's opening and closing tags. No
//! script and no external resource: a page opens from disk anywhere.

use std::fmt::Write;

/// Escapes text for XML and HTML (element text and attribute values alike).
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

/// The style sheet both pages use.
pub const CSS: &str = "body{font-family:system-ui,sans-serif;margin:24px auto;max-width:1200px;padding:0 16px;color:#222}\
.wide{overflow-x:auto}table{border-collapse:collapse;margin:8px 0 20px;font-size:13px}\
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right;white-space:nowrap}\
th{background:#f2f2f2}td:first-child,th:first-child{text-align:left}.fail{color:#b00020;font-weight:600}\
.pass{color:#116611}figure{margin:12px 0 24px}figure svg{max-width:100%;height:auto;border:1px solid #ddd}\
.note{color:#555;font-size:13px;max-width:900px}.plots{display:flex;flex-wrap:wrap;gap:8px}\
.plots figure{flex:1 1 560px;max-width:720px;margin:0}table.sources td,table.skipped td{text-align:left;white-space:normal}h3{font-size:15px;margin-top:28px}.swatch{display:inline-block;width:10px;height:10px;margin-right:4px}";

/// `<!DOCTYPE html>` through `<body>`, with the title escaped and `extra_css` after [`CSS`].
pub fn open_page(out: &mut String, title: &str, extra_css: &str) {
    let _ = writeln!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{}</title><style>{CSS}{extra_css}</style></head><body>",
        esc(title)
    );
}

/// Closes what [`open_page`] opened.
pub fn close_page(out: &mut String) {
    out.push_str("</body></html>\n");
}

/// A table with a header row; every cell is escaped. Cells of `status_col` (and any cell ending in ` FAIL`)
/// are coloured by their first word (`pass`, `FAIL`).
pub fn table(out: &mut String, class: &str, head: &[String], rows: &[Vec<String>], status_col: Option<usize>) {
    let _ = write!(out, r#"<div class="wide"><table class="{}"><thead><tr>"#, esc(class));
    for h in head {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>");
    for r in rows {
        out.push_str("<tr>");
        for (i, c) in r.iter().enumerate() {
            let cls = if Some(i) == status_col || c.ends_with(" FAIL") {
                if c.starts_with("FAIL") || c.ends_with(" FAIL") {
                    r#" class="fail""#
                } else if c.starts_with("pass") {
                    r#" class="pass""#
                } else {
                    ""
                }
            } else {
                ""
            };
            let _ = write!(out, "<td{cls}>{}</td>", esc(c));
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table></div>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_text_is_escaped_in_cells_and_titles() {
        let mut out = String::new();
        open_page(&mut out, "</title><script>x</script>", "");
        table(&mut out, "t\"", &["<b>".into()], &[vec!["a & 'b'".into()]], None);
        assert!(!out.contains("<script>"), "{out}");
        assert!(out.contains("&lt;/title&gt;&lt;script&gt;"), "{out}");
        assert!(out.contains("<th>&lt;b&gt;</th>"), "{out}");
        assert!(out.contains("<td>a &amp; &#39;b&#39;</td>"), "{out}");
        assert!(out.contains(r#"class="t&quot;""#), "{out}");
    }
}
