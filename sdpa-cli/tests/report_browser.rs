//! The HTML report in a real headless browser (Debian's `chromium`): the page loads, its tables lay out with
//! rows, and its SVG plots draw lines and points inside their frames. CI installs chromium (`.ci/run`) and sets
//! `SDPA_REQUIRE_BROWSER=1`, so there a missing browser fails the test; on a fresh machine without chromium the
//! test skips with a printed reason, so the README's test command works anywhere.

mod common;

use common::{browser_or_skip, probe_page};
use std::process::Command;

/// Measures the laid-out page from inside it and leaves the result in `<pre id="probe">` for --dump-dom.
const PROBE: &str = r#"<script>
window.addEventListener('load', () => {
  const r = {tables: 0, rows: 0, svgs: 0, drawn_svgs: 0, lines: 0, roofs: 0, points: 0, points_inside: 0, texts: 0};
  for (const t of document.querySelectorAll('table')) {
    const b = t.getBoundingClientRect();
    if (b.width > 0 && b.height > 0) r.tables++;
    for (const tr of t.querySelectorAll('tbody tr')) if (tr.getBoundingClientRect().height > 0) r.rows++;
  }
  for (const s of document.querySelectorAll('svg')) {
    r.svgs++;
    const f = s.getBoundingClientRect();
    if (f.width > 200 && f.height > 100) r.drawn_svgs++;
    for (const p of s.querySelectorAll('g.series polyline')) if (p.getTotalLength() > 10) r.lines++;
    for (const p of s.querySelectorAll('g.roof polyline')) if (p.getTotalLength() > 10) r.roofs++;
    for (const c of s.querySelectorAll('circle.point')) {
      const b = c.getBoundingClientRect();
      if (b.width > 0) r.points++;
      if (b.left >= f.left && b.right <= f.right && b.top >= f.top && b.bottom <= f.bottom) r.points_inside++;
    }
    for (const t of s.querySelectorAll('text')) if (t.getComputedTextLength() > 0) r.texts++;
  }
  const pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(r);
  document.body.appendChild(pre);
});
</script>"#;

fn record(backend: &str, kernel: &str, s: usize, d: usize, ms: f64) -> serde_json::Value {
    serde_json::json!({
        "backend": backend, "kernel": kernel, "device": "NVIDIA H100 80GB HBM3", "dtype": "bf16",
        "shape": {"b": 16384 / s, "hq": 2048 / d, "hkv": 2048 / d, "sq": s, "sk": s, "d": d, "dv": d},
        "mask": "none", "time_ms": {"median": ms, "min": ms, "max": ms * 1.1, "reps": 30},
        "tflops": 0.0, "gbps": 0.0,
        "check": {"max_abs_err": 0.002, "rel_err": 0.004, "tolerance": 0.016, "pass": true}
    })
}

#[test]
fn the_html_report_renders_tables_and_plots_in_chromium() {
    let Some(browser) = browser_or_skip() else { return };
    let dir = std::env::temp_dir().join(format!("sdpa-browser-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Two head dims x three lengths x two kernels: 12 configurations, two seq-length plots, one roofline.
    let mut recs = Vec::new();
    for d in [64, 128] {
        for (s, ms) in [(1024, 0.2), (4096, 0.6), (16384, 2.4)] {
            recs.push(record("cuda", "fa2", s, d, ms));
            recs.push(record("pytorch", "flash", s, d, ms * 1.25));
        }
    }
    std::fs::write(dir.join("r.json"), serde_json::Value::Array(recs).to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sdpa"))
        .args(["report", "r.json", "--out-dir", "rep", "--baseline", "pytorch:flash"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let html = std::fs::read_to_string(dir.join("rep/report.html")).unwrap();
    let r = probe_page(&browser, &dir, &html, PROBE);
    let n = |k: &str| r[k].as_u64().unwrap();
    // Sources, speedup summary, summary, 6 detail tables.
    assert_eq!(n("tables"), 9, "{r}");
    assert!(n("rows") >= 1 + 1 + 6 + 12, "{r}");
    assert_eq!(n("svgs"), 3, "{r}");
    assert_eq!(n("drawn_svgs"), 3, "{r}");
    // Two series per seq-length plot, two plots.
    assert_eq!(n("lines"), 4, "{r}");
    // The roofline's bf16 roof (the sloped bandwidth part and the flat compute part).
    assert_eq!(n("roofs"), 1, "{r}");
    // 12 points on the seq-length plots, 12 on the roofline, all inside their plot.
    assert_eq!(n("points"), 24, "{r}");
    assert_eq!(n("points_inside"), 24, "{r}");
    assert!(n("texts") > 20, "{r}");
    let _ = std::fs::remove_dir_all(&dir);
}
