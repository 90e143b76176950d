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

use sdpa_core::BenchSpec;
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

/// A finding's replay: the command and the spec it stands for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Replay {
    /// `sdpa bench ...`.
    pub command: String,
    /// The same request as a spec file.
    pub spec: BenchSpec,
}

impl Replay {
    /// Builds a replay from a spec.
    pub fn new(spec: BenchSpec) -> Self {
        Replay { command: bench_command(&spec), spec }
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
}
