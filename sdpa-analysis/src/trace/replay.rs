//! Replays: the `sdpa bench` command and the [`BenchSpec`] that run a finding's shape on our own backends.
//!
//! The spec is the file format `sdpa bench --spec FILE` reads (one type for sweeps, presets and replays):
//!
//! ```json
//! {
//!   "backends": ["cuda"],
//!   "kernels": ["unfused", "fa2"],
//!   "dtypes": ["bf16"],
//!   "shapes": [{"b": 2, "hq": 16, "hkv": 8, "sq": 1024, "sk": 1024, "d": 64, "dv": 64}],
//!   "masks": ["causal"],
//!   "layouts": ["bhsd"]
//! }
//! ```
//!
//! A replay's mask is `none`, `causal` (top-left, PyTorch `is_causal`), `causal-br` (bottom-right), or
//! `additive` / `bool` for an explicit mask seen in a trace (replayed as a full-size random mask of that kind:
//! the trace records only the mask's dims, and the finding says so). `sdpa bench --spec` also accepts a
//! `{command, spec}` replay or a whole `--json` report, and the singular keys (`dtype`, `mask`, `layout`)
//! of replay files written before replays were `BenchSpec`s.
//!
//! A call with a window, softcap or ALiBi replays with the same variants: `--window L,R`, `--softcap C`,
//! `--alibi`, and `--diagonal tl|br` when no causal mask names the diagonal, in the command, and `variants` (a
//! list of `sdpa_core::Variants` objects, e.g. `{"window": {"left": 4096, "right": 0}, "softcap": 50.0,
//! "diagonal": "bottom-right"}`) beside the spec.

use sdpa_core::{BenchSpec, Variants};
use serde::{Deserialize, Serialize};

/// The `sdpa bench` command line that runs `spec` (one `--shape` per shape; lists comma-separated; the
/// default layout `bhsd` left out).
pub fn bench_command(spec: &BenchSpec) -> String {
    let names = |v: Vec<&str>| v.join(",");
    let mut cmd = format!(
        "sdpa bench --backend {} --kernel {} --dtype {}",
        spec.backends.join(","),
        spec.kernels.join(","),
        names(spec.dtypes.iter().map(|d| d.name()).collect())
    );
    for s in &spec.shapes {
        if s.dv == s.d {
            cmd.push_str(&format!(" --shape {},{},{},{},{},{}", s.b, s.hq, s.hkv, s.sq, s.sk, s.d));
        } else {
            cmd.push_str(&format!(" --shape {s}"));
        }
    }
    if !spec.masks.is_empty() {
        cmd.push_str(&format!(" --mask {}", spec.masks.join(",")));
    }
    if spec.layouts.iter().any(|l| l.name() != "bhsd") {
        cmd.push_str(&format!(" --layout {}", names(spec.layouts.iter().map(|l| l.name()).collect())));
    }
    cmd
}

/// The `sdpa bench` flags of one call's variants (empty for plain attention); the diagonal is given only
/// when no causal mask among `masks` names it.
pub fn variant_flags(v: &Variants, masks: &[String]) -> String {
    let mut f = String::new();
    if let Some(w) = v.window {
        f.push_str(&format!(" --window {w}"));
    }
    if let Some(c) = v.softcap {
        f.push_str(&format!(" --softcap {c}"));
    }
    match &v.alibi {
        Some(sdpa_core::Alibi::Standard) => f.push_str(" --alibi"),
        // Given slopes need a file; the replay's `variants` carries them.
        Some(sdpa_core::Alibi::Slopes(_)) => f.push_str(" --alibi-slopes FILE"),
        None => {}
    }
    let causal = masks.iter().any(|m| m.starts_with("causal"));
    if let (Some(d), false) = (v.diagonal, causal) {
        if v.window.is_some() || v.alibi.is_some() {
            f.push_str(&format!(" --diagonal {}", d.name()));
        }
    }
    f
}

/// A finding's replay: the command and the spec it stands for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Replay {
    /// `sdpa bench ...`.
    pub command: String,
    /// The same request as a spec file (its `variants` hold the call's window, softcap and ALiBi).
    pub spec: BenchSpec,
    /// What the command runs that the spec does not say (a varlen or paged batch: the spec holds its dense
    /// equivalent, the command its layout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Replay {
    /// Builds a replay from a spec.
    pub fn new(spec: BenchSpec) -> Self {
        Replay { command: bench_command(&spec), spec, note: None }
    }

    /// The replay of a varlen batch (and a paged one with `page_size`) whose every length is known: the command
    /// gains `--seqlens-q`, `--seqlens-k` (and `--page-size`); the spec keeps the dense problem of the same
    /// lengths, which is the same work only when all lengths are equal, as the note says.
    pub fn with_seqlens(mut self, seqlens_q: &[usize], seqlens_k: &[usize], page_size: Option<usize>) -> Self {
        let list = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
        self.command.push_str(&format!(" --seqlens-q {} --seqlens-k {}", list(seqlens_q), list(seqlens_k)));
        if let Some(p) = page_size {
            self.command.push_str(&format!(" --page-size {p}"));
        }
        let layout = if page_size.is_some() { "paged" } else { "varlen" };
        self.note = Some(format!(
            "the command runs the {layout} batch with its exact lengths; the spec is the dense batch of the same \
             shape (spec files have no per-sequence lengths)"
        ));
        self
    }

    /// Builds a replay of a call with these variants (none: plain attention).
    pub fn with_variants(mut spec: BenchSpec, variants: Option<Variants>) -> Self {
        let Some(v) = variants.filter(|v| !v.is_plain()) else { return Self::new(spec) };
        let command = format!("{}{}", bench_command(&spec), variant_flags(&v, &spec.masks));
        spec.variants = vec![v];
        Replay { command, spec, note: None }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use sdpa_core::{DType, Layout, Shape};

    #[test]
    fn spec_round_trips_and_prints_the_command() {
        let spec = BenchSpec {
            backends: vec!["cuda".into()],
            kernels: vec!["unfused".into(), "fa2".into()],
            dtypes: vec![DType::BF16],
            shapes: vec![Shape { b: 2, hq: 16, hkv: 8, sq: 1024, sk: 1024, d: 64, dv: 64 }],
            masks: vec!["causal".into()],
            layouts: vec![Layout::Bhsd],
            ..BenchSpec::default()
        };
        assert_eq!(
            bench_command(&spec),
            "sdpa bench --backend cuda --kernel unfused,fa2 --dtype bf16 --shape 2,16,8,1024,1024,64 --mask causal"
        );
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<BenchSpec>(&json).unwrap(), spec);
        let bshd = BenchSpec { layouts: vec![Layout::Bshd], ..spec };
        assert!(bench_command(&bshd).ends_with(" --mask causal --layout bshd"));
    }

    #[test]
    fn variants_travel_in_the_command_and_the_spec() {
        use sdpa_core::{Alibi, Diagonal, Variants, Window};
        let spec = BenchSpec { masks: vec!["causal-br".into()], ..BenchSpec::default() };
        let v = Variants {
            window: Some(Window::left(4096)),
            softcap: Some(50.0),
            alibi: None,
            diagonal: Some(Diagonal::BottomRight),
        };
        let r = Replay::with_variants(spec.clone(), Some(v.clone()));
        assert!(r.command.ends_with(" --mask causal-br --window 4096,0 --softcap 50"), "{}", r.command);
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(
            json["spec"]["variants"],
            serde_json::json!([{"window": {"left": 4096, "right": 0}, "softcap": 50.0, "diagonal": "bottom-right"}])
        );
        assert_eq!(serde_json::from_value::<Replay>(json).unwrap(), r);
        // No causal mask: the diagonal must be named.
        let none = BenchSpec { masks: vec!["none".into()], ..BenchSpec::default() };
        let alibi =
            Variants { alibi: Some(Alibi::Standard), diagonal: Some(Diagonal::BottomRight), ..Variants::default() };
        assert!(Replay::with_variants(none, Some(alibi)).command.ends_with(" --mask none --alibi --diagonal br"));
        assert!(Replay::with_variants(spec, Some(Variants::default())).spec.variants.is_empty(), "plain stays plain");
    }
}
