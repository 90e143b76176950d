//! `sdpa analyze --html`: the page of real traces holds each op, each finding with its replay, the timeline's
//! calls by layer and each op's expected band; its SVG is well-formed XML; and strings from a trace (module
//! names, file names) are escaped, never markup. The page in a real browser: `sdpa-cli/tests/analyze_browser.rs`.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use sdpa_analysis::trace::attention::{Kind, Phase};
use sdpa_analysis::trace::diff::TraceDiff;
use sdpa_analysis::trace::printers::html;
use sdpa_analysis::{analyze_path, Options, TraceReport};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

fn path(dir: &str, name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join(dir).join(name)
}

fn report(p: &Path) -> TraceReport {
    analyze_path(p, &Options::default()).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Checks that `xml` is well-formed: every tag closed in order, attribute values quoted, `&` only in the
/// entities the printers write, no stray `<`. Returns the element names in document order.
fn well_formed(xml: &str) -> Vec<String> {
    let mut stack: Vec<String> = Vec::new();
    let mut names = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find(['<', '&']) {
        check_text(&rest[..i]);
        rest = &rest[i..];
        if rest.starts_with('&') {
            let end = rest.find(';').unwrap_or_else(|| panic!("bare & at {}", &rest[..rest.len().min(40)]));
            let ent = &rest[..=end];
            assert!(["&amp;", "&lt;", "&gt;", "&quot;", "&#39;"].contains(&ent), "unknown entity {ent}");
            rest = &rest[end + 1..];
            continue;
        }
        let end = tag_end(rest);
        let tag = &rest[1..end];
        rest = &rest[end + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            let open = stack.pop().unwrap_or_else(|| panic!("</{name}> closes nothing"));
            assert_eq!(open, name.trim(), "</{name}> closes <{open}>");
            continue;
        }
        let self_closing = tag.ends_with('/');
        let body = tag.trim_end_matches('/');
        let name = body.split_whitespace().next().unwrap().to_string();
        check_attributes(&body[name.len()..]);
        names.push(name.clone());
        if !self_closing {
            stack.push(name);
        }
    }
    check_text(rest);
    assert!(stack.is_empty(), "unclosed: {stack:?}");
    names
}

/// The index of the `>` that ends the tag at the start of `s`, skipping quoted attribute values.
fn tag_end(s: &str) -> usize {
    let mut quoted = false;
    for (i, c) in s.char_indices().skip(1) {
        match c {
            '"' => quoted = !quoted,
            '<' if !quoted => panic!("'<' inside a tag: {}", &s[..i.min(80)]),
            '>' if !quoted => return i,
            _ => {}
        }
    }
    panic!("unterminated tag: {}", &s[..s.len().min(80)])
}

fn check_text(t: &str) {
    assert!(!t.contains('>'), "raw '>' in text: {t}");
}

/// `name="value"` pairs, each value free of `<` and with only known entities.
fn check_attributes(mut a: &str) {
    loop {
        a = a.trim_start();
        if a.is_empty() {
            return;
        }
        let eq = a.find('=').unwrap_or_else(|| panic!("attribute without value: {a}"));
        assert!(a[eq + 1..].starts_with('"'), "unquoted attribute: {a}");
        let close = a[eq + 2..].find('"').unwrap() + eq + 2;
        let value = &a[eq + 2..close];
        assert!(!value.contains('<'), "'<' in attribute: {value}");
        a = &a[close + 1..];
    }
}

/// Each `<svg>...</svg>` of a page.
fn svgs(page: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = page;
    while let Some(i) = rest.find("<svg") {
        let end = rest[i..].find("</svg>").unwrap() + i + "</svg>".len();
        out.push(&rest[i..end]);
        rest = &rest[end..];
    }
    out
}

fn count(hay: &str, needle: &str) -> usize {
    hay.matches(needle).count()
}

fn escaped(s: &str) -> String {
    sdpa_analysis::render::esc(s)
}

/// The page of each real trace holds what its report holds.
fn check_page(r: &TraceReport) -> String {
    let page = html::report(r);
    // Every op in the table, with its module, shape and total time.
    for o in &r.attention_ops {
        let row = format!("<td>{}</td><td>{}</td>", escaped(&o.module), escaped(&o.shape_label()));
        assert!(page.contains(&row), "op row {row} missing");
        assert!(page.contains(&format!("<td>{:.1}</td>", o.total_us)));
    }
    // Every finding, with its replay command.
    assert_eq!(count(&page, "<div class=\"finding "), r.findings.len());
    for f in &r.findings {
        assert!(page.contains(&escaped(&f.title)), "finding {} missing", f.title);
        if let Some(rp) = &f.replay {
            assert!(page.contains(&format!("<code>{}</code>", escaped(&rp.command))));
        }
    }
    let figures = svgs(&page);
    for svg in &figures {
        let names = well_formed(svg);
        assert_eq!(names[0], "svg");
    }
    // The timeline: one bar per call kept, fused and unfused, forward and backward told apart by class.
    if !r.timeline.is_empty() {
        let t = figures.iter().find(|s| s.contains("class=\"plot timeline\"")).unwrap();
        assert_eq!(count(t, "<rect class=\"span "), r.timeline.spans.len());
        for s in &r.timeline.spans {
            let o = &r.attention_ops[s.op];
            let kind = if o.kind == Kind::Fused && o.fused_kernel { "fused" } else { "unfused" };
            assert!(t.contains(&format!("class=\"span {kind} {}\" data-op=\"{}\"", o.phase.name(), s.op)));
        }
        for row in &r.timeline.rows {
            assert!(t.contains(&format!("<title>{}</title>", escaped(row))), "row {row}");
        }
    }
    // Efficiency: a point per op that has one, and each such op's band with its edges and label.
    let judged: Vec<_> = r.attention_ops.iter().filter(|o| o.efficiency.is_some() && o.sk.is_some()).collect();
    if !judged.is_empty() {
        let e = figures.iter().find(|s| s.contains("class=\"plot efficiency\"")).unwrap();
        assert_eq!(count(e, "class=\"point "), judged.len());
        for o in judged {
            let b = o.expected_band.as_ref().unwrap();
            assert!(
                e.contains(&format!("data-low=\"{}\" data-high=\"{}\"", b.low, b.high)),
                "band of {}",
                o.shape_label()
            );
            assert!(e.contains(&escaped(&b.label)));
        }
    }
    well_formed(&page.replace("<!DOCTYPE html>", "").replace(
        "<meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
        "",
    ));
    page
}

#[test]
fn pages_of_the_real_traces_hold_every_op_finding_call_and_band() {
    let traces = [
        path("data", "bert_eager_fp16_S128.json.gz"),
        path("data", "llama_sdpa_train_bf16_S1024.json.gz"),
        path("data", "mistral_eager_bf16_S1024_nostack.json.gz"),
        path("fixtures", "flex_bf16_S2048.json.gz"),
        path("fixtures", "varlen_bf16.json.gz"),
        path("fixtures", "diff_before_eager_bf16_S1024.json.gz"),
        path("fixtures", "train_backends_bf16_S2048.json.gz"),
        path("fixtures", "decode_gqa_bf16.json.gz"),
        path("fixtures", "cp_unbalanced"),
    ];
    for t in &traces {
        let r = report(t);
        assert!(!r.attention_ops.is_empty());
        // Every call of these small traces is on the timeline.
        assert_eq!(r.timeline.spans.len(), r.summary.attention_calls, "{}", t.display());
        check_page(&r);
    }
}

#[test]
fn the_training_trace_has_a_row_per_layer_with_forward_and_backward() {
    let r = report(&path("data", "llama_sdpa_train_bf16_S1024.json.gz"));
    // Two decoder layers, each with its forward and (module taken from the forward) its backward call.
    assert_eq!(r.timeline.rows.len(), 2, "{:?}", r.timeline.rows);
    assert!(r.timeline.rows.iter().all(|row| row.ends_with("LlamaAttention_0") || row.ends_with("LlamaAttention_1")));
    for row in 0..2 {
        let phases: Vec<Phase> =
            r.timeline.spans.iter().filter(|s| s.row == row).map(|s| r.attention_ops[s.op].phase).collect();
        assert_eq!(phases, [Phase::Fwd, Phase::Bwd], "row {row}");
    }
    // Spans carry each call's own GPU time: they add up to the attention time.
    let sum: f64 = r.timeline.spans.iter().map(|s| s.gpu_us).sum();
    assert!((sum - r.summary.attention_time_us).abs() < 1e-6 * r.summary.attention_time_us);
    let page = check_page(&r);
    assert!(page.contains("class=\"span fused bwd\""));
}

#[test]
fn a_directory_of_ranks_names_each_rank_on_its_rows() {
    let r = report(&path("fixtures", "cp_balanced"));
    assert_eq!(r.inputs.len(), 2);
    for (i, input) in r.inputs.iter().enumerate() {
        let file = Path::new(input).file_name().unwrap().to_string_lossy().into_owned();
        let spans: Vec<_> = r.timeline.spans.iter().filter(|s| s.input == i).collect();
        assert!(!spans.is_empty(), "{file}");
        // Each rank's calls on rows of that rank, timed from that rank's first call.
        assert!(
            spans.iter().all(|s| r.timeline.rows[s.row].starts_with(&format!("{file}: "))),
            "{:?}",
            r.timeline.rows
        );
        assert!(spans.iter().any(|s| s.start_us == 0.0));
    }
    check_page(&r);
}

#[test]
fn the_page_carries_the_judgement_implementations_and_ranks() {
    // What the text and markdown say under the ops table is on the page too, escaped.
    let r = report(&path("fixtures", "cp_unbalanced"));
    let page = sdpa_analysis::trace::printers::html::report(&r);
    let ranks = r.ranks.as_ref().expect("two rank files make a ranks section");
    assert!(page.contains("<h2>Ranks</h2>"));
    assert_eq!(ranks.ranks.len(), 2);
    for o in r.attention_ops.iter().filter_map(|o| o.implementation.as_ref()) {
        assert!(page.contains(&escaped(&o.label())), "{}", o.label());
    }
    let r = report(&path("fixtures", "decode_gqa_bf16.json.gz"));
    let page = sdpa_analysis::trace::printers::html::report(&r);
    let judged = sdpa_analysis::trace::printers::judgement::lines(&r);
    assert!(!judged.is_empty());
    assert!(page.contains("<h2>Judgement</h2>"));
    for l in &judged {
        assert!(page.contains(&escaped(l)), "{l}");
    }
}

#[test]
fn the_eager_pair_draws_one_row_per_block() {
    let r = report(&path("fixtures", "diff_before_eager_bf16_S1024.json.gz"));
    let rows: Vec<String> = r.timeline.rows.iter().map(|x| x.rsplit('/').next().unwrap().to_string()).collect();
    assert_eq!(rows, ["Attention_0", "Attention_1", "Attention_2", "Attention_3"]);
    // In the order the blocks ran.
    let starts: Vec<f64> = r.timeline.spans.iter().map(|s| s.start_us).collect();
    assert!(starts.windows(2).all(|w| w[0] < w[1]), "{starts:?}");
    assert_eq!(starts[0], 0.0);
}

#[test]
fn the_diff_page_holds_the_match_and_both_timelines() {
    let before = report(&path("fixtures", "diff_before_eager_bf16_S1024.json.gz"));
    let after = report(&path("fixtures", "diff_after_sdpa_bf16_S1024.json.gz"));
    let d = TraceDiff::new(&before, &after);
    let page = html::diff(&d, &before, &after);
    assert!(page.contains("Path A realised (now fused)"));
    assert!(page.contains(&format!("<td>{:+.1}</td>", d.attention_delta_us)));
    let figures = svgs(&page);
    assert_eq!(figures.len(), 2);
    for s in &figures {
        well_formed(s);
        assert_eq!(count(s, "<rect class=\"span "), 4);
    }
    assert!(figures[0].contains("class=\"span unfused fwd\"") && figures[1].contains("class=\"span fused fwd\""));
}

/// Rewrites a real trace: module names and the file name carry markup.
#[test]
fn hostile_strings_from_the_trace_are_escaped() {
    let src = path("fixtures", "diff_after_sdpa_bf16_S1024.json.gz");
    let mut json = String::new();
    flate2::read::MultiGzDecoder::new(std::fs::File::open(&src).unwrap()).read_to_string(&mut json).unwrap();
    let evil = r#"<script>alert(\"x\")</script><img src=x onerror='y'>&amp;"#;
    assert!(json.contains("nn.Module: Attention_"));
    let json = json.replace("nn.Module: Attention_", &format!("nn.Module: {evil}Attention_"));
    let dir = std::env::temp_dir().join(format!("sdpa-page-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("t<b>&'\".json.gz");
    let mut gz = flate2::write::GzEncoder::new(std::fs::File::create(&file).unwrap(), flate2::Compression::fast());
    gz.write_all(json.as_bytes()).unwrap();
    gz.finish().unwrap();
    let r = report(&file);
    assert!(r.attention_ops[0].module.contains("<script>"), "{}", r.attention_ops[0].module);
    assert!(r.timeline.rows.iter().all(|row| row.contains("<script>")));
    let page = check_page(&r);
    for raw in ["<script", "<img", "<b>", "onerror='"] {
        assert!(!page.contains(raw), "{raw} reached the page unescaped");
    }
    assert!(page
        .contains("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&lt;img src=x onerror=&#39;y&#39;&gt;&amp;amp;"));
    assert!(page.contains("t&lt;b&gt;&amp;&#39;&quot;.json.gz"));
    let d = TraceDiff::new(&r, &r);
    let dp = html::diff(&d, &r, &r);
    assert!(!dp.contains("<script") && !dp.contains("<img"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[should_panic(expected = "closes")]
fn the_checker_refuses_crossed_tags() {
    well_formed("<svg><g></svg></g>");
}

#[test]
#[should_panic(expected = "inside a tag")]
fn the_checker_refuses_markup_in_attributes() {
    well_formed(r#"<svg><text x=<script>>a</text></svg>"#);
}

#[test]
fn the_timeline_keeps_at_most_max_spans_and_counts_the_rest() {
    use sdpa_analysis::trace::timeline::{Timeline, MAX_SPANS};
    let trace = sdpa_analysis::trace::kineto::parse_file(&path("data", "bert_eager_fp16_S128.json.gz")).unwrap();
    let tree = sdpa_analysis::trace::tree::OpTree::build(&trace);
    let calls = sdpa_analysis::trace::attention::detect(&tree);
    assert_eq!(calls.len(), 4);
    let many: Vec<_> = calls.iter().cycle().take(MAX_SPANS + 5).cloned().collect();
    let ops = vec![0; many.len()];
    let inputs = vec![0; many.len()];
    let t = Timeline::build(&many, &ops, &inputs, &["bert".to_string()]);
    assert_eq!((t.spans.len(), t.left_out), (MAX_SPANS, 5));
    // The four layers, once each, however many calls.
    assert_eq!(t.rows.len(), 4);
    // Lengths that disagree give no timeline rather than a wrong one.
    assert!(Timeline::build(&many, &ops[1..], &inputs, &[]).is_empty());
}
