//! `sdpa analyze --html` in a real headless browser, as the benchmark report is checked
//! (`report_browser.rs`): on a real training trace the page lays out its tables, the timeline draws a bar per
//! attention call inside its frame (forward and backward, one row per layer), the efficiency plot draws each op
//! and its expected band, and every finding shows with its replay; the `--diff` page draws both timelines.
//! CI sets `SDPA_REQUIRE_BROWSER=1`, so a missing chromium fails there and skips elsewhere.

mod common;

use common::{browser_or_skip, probe_page, sdpa, tmp};
use std::path::PathBuf;

/// Measures the laid-out page from inside it, leaving JSON in `<pre id="probe">`.
const PROBE: &str = r##"<script>
window.addEventListener('load', () => {
  const r = {tables: 0, rows: 0, svgs: 0, drawn_svgs: 0, spans: 0, spans_inside: 0, span_rows: [], bwd_spans: 0,
             points: 0, points_inside: 0, bands: 0, bands_drawn: 0, findings: 0, replays: 0, texts: 0};
  for (const t of document.querySelectorAll('table')) {
    const b = t.getBoundingClientRect();
    if (b.width > 0 && b.height > 0) r.tables++;
    for (const tr of t.querySelectorAll('tbody tr')) if (tr.getBoundingClientRect().height > 0) r.rows++;
  }
  for (const s of document.querySelectorAll('svg')) {
    r.svgs++;
    const f = s.getBoundingClientRect();
    if (f.width > 200 && f.height > 80) r.drawn_svgs++;
    const frame = s.querySelector(':scope > rect[stroke="#444"]').getBoundingClientRect();
    const inside = b => b.left >= frame.left - 0.5 && b.right <= frame.right + 0.5 && b.top >= frame.top - 0.5 && b.bottom <= frame.bottom + 0.5;
    for (const e of s.querySelectorAll('rect.span')) {
      const b = e.getBoundingClientRect();
      if (b.width > 0 && b.height > 0) r.spans++;
      if (inside(b)) r.spans_inside++;
      if (e.classList.contains('bwd')) r.bwd_spans++;
      const y = Math.round(b.top - frame.top);
      if (!r.span_rows.includes(y)) r.span_rows.push(y);
    }
    for (const e of s.querySelectorAll('.point')) {
      const b = e.getBoundingClientRect();
      if (b.width > 0) r.points++;
      if (inside(b)) r.points_inside++;
    }
    for (const e of s.querySelectorAll('rect.band')) {
      r.bands++;
      const b = e.getBoundingClientRect();
      if (b.height > 2 && inside(b)) r.bands_drawn++;
    }
    for (const t of s.querySelectorAll('text')) if (t.getComputedTextLength() > 0) r.texts++;
  }
  for (const d of document.querySelectorAll('div.finding')) if (d.getBoundingClientRect().height > 0) r.findings++;
  for (const p of document.querySelectorAll('pre.replay')) if (p.getBoundingClientRect().height > 0) r.replays++;
  const pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(r);
  document.body.appendChild(pre);
});
</script>"##;

fn trace(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sdpa-analysis/tests").join(rel);
    p.to_str().expect("utf-8 path").to_string()
}

#[test]
fn the_analysis_page_draws_calls_points_and_bands_in_chromium() {
    let Some(browser) = browser_or_skip() else { return };
    let dir = tmp("page");
    // Llama training step: two decoder layers, cuDNN forward and backward, each layer's calls on its own row.
    let t = trace("data/llama_sdpa_train_bf16_S1024.json.gz");
    let out = sdpa(&["analyze", &t, "--html", "page.html", "--json"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let calls = report["summary"]["attention_calls"].as_u64().expect("calls");
    let ops = report["attention_ops"].as_array().expect("ops").len() as u64;
    let findings = report["findings"].as_array().expect("findings");
    let replays = findings.iter().filter(|f| f["replay"].is_object()).count() as u64;
    let html = std::fs::read_to_string(dir.join("page.html")).expect("page written");
    let r = probe_page(&browser, &dir, &html, PROBE);
    let n = |k: &str| r[k].as_u64().expect("probe field");
    // Summary and the ops table.
    assert_eq!(n("tables"), 2, "{r}");
    assert_eq!(n("rows"), 6 + ops, "{r}");
    assert_eq!(n("svgs"), 2, "{r}");
    assert_eq!(n("drawn_svgs"), 2, "{r}");
    assert_eq!(calls, 4);
    assert_eq!(n("spans"), calls, "{r}");
    assert_eq!(n("spans_inside"), calls, "{r}");
    assert_eq!(n("bwd_spans"), 2, "{r}");
    assert_eq!(r["span_rows"].as_array().map(Vec::len), Some(2), "{r}");
    assert_eq!(n("points"), ops, "{r}");
    assert_eq!(n("points_inside"), ops, "{r}");
    // One band per distinct band the ops carry (the forward's seed band and the backward's own band from
    // published backward rates), each drawn once.
    let mut bands: Vec<String> = report["attention_ops"]
        .as_array()
        .expect("ops")
        .iter()
        .map(|o| o["expected_band"]["label"].as_str().unwrap_or("").to_string())
        .collect();
    bands.sort();
    bands.dedup();
    assert_eq!(bands.len(), 2, "{bands:?}");
    assert_eq!(n("bands"), bands.len() as u64, "{r}");
    assert_eq!(n("bands_drawn"), bands.len() as u64, "{r}");
    assert_eq!(n("findings"), findings.len() as u64, "{r}");
    assert_eq!(n("replays"), replays, "{r}");
    assert!(n("texts") > 20, "{r}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_diff_page_draws_both_timelines_in_chromium() {
    let Some(browser) = browser_or_skip() else { return };
    let dir = tmp("diff-page");
    let (b, a) =
        (trace("fixtures/diff_before_eager_bf16_S1024.json.gz"), trace("fixtures/diff_after_sdpa_bf16_S1024.json.gz"));
    let out = sdpa(&["analyze", "--diff", &b, &a, "--html", "diff.html"], &dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let html = std::fs::read_to_string(dir.join("diff.html")).expect("page written");
    let r = probe_page(&browser, &dir, &html, PROBE);
    let n = |k: &str| r[k].as_u64().expect("probe field");
    // Totals and matched ops.
    assert_eq!(n("tables"), 2, "{r}");
    assert_eq!(n("rows"), 3, "{r}");
    assert_eq!(n("svgs"), 2, "{r}");
    // Four blocks on each side, one row each.
    assert_eq!(n("spans"), 8, "{r}");
    assert_eq!(n("spans_inside"), 8, "{r}");
    let _ = std::fs::remove_dir_all(&dir);
}
