//! Replays: the `sdpa bench` command and JSON spec that run a finding's shape on our own backends.
//!
//! [`ReplaySpec`] is the file format `sdpa bench --spec FILE` reads:
//!
//! ```json
//! {
//!   "backends": ["cuda"],
//!   "kernels": ["unfused", "fa2"],
//!   "dtype": "bf16",
//!   "shapes": [{"b": 2, "hq": 16, "hkv": 8, "sq": 1024, "sk": 1024, "d": 64, "dv": 64}],
//!   "mask": "causal",
//!   "layout": "bhsd"
//! }
//! ```
//!
//! `mask` is `none`, `causal` (top-left, PyTorch `is_causal`), `causal-br` (bottom-right), or `additive` /
//! `bool` for an explicit mask seen in a trace (replayed as a full-size random mask of that kind: the trace
//! records only the mask's dims, and the finding says so). `layout` is `bhsd` or `bshd`. `dtype` is `f32`,
//! `f16` or `bf16`. `sdpa bench --spec` also accepts a `{command, spec}` replay or a whole `--json` report.

use sdpa_core::Shape;
use serde::{Deserialize, Serialize};

/// A benchmark request: every kernel on every backend, for every shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplaySpec {
    /// Backends to run on: `cuda`, `cpu`.
    pub backends: Vec<String>,
    /// Kernel names (sdpa-core's `Kernel`): `unfused`, `fa1`, `fa2`, `splitkv`, `auto`.
    pub kernels: Vec<String>,
    /// Element type: `f32`, `f16`, `bf16`.
    pub dtype: String,
    /// Shapes, `B, Hq, Hkv, Sq, Sk, D, Dv`.
    pub shapes: Vec<Shape>,
    /// `none`, `causal`, `causal-br`, `additive` or `bool`.
    pub mask: String,
    /// `bhsd` or `bshd`.
    pub layout: String,
}

impl ReplaySpec {
    /// The equivalent `sdpa bench` command line (one shape per `--shape`).
    pub fn command(&self) -> String {
        let mut cmd = format!(
            "sdpa bench --backend {} --kernel {} --dtype {}",
            self.backends.join(","),
            self.kernels.join(","),
            self.dtype
        );
        for s in &self.shapes {
            if s.dv == s.d {
                cmd.push_str(&format!(" --shape {},{},{},{},{},{}", s.b, s.hq, s.hkv, s.sq, s.sk, s.d));
            } else {
                cmd.push_str(&format!(" --shape {s}"));
            }
        }
        cmd.push_str(&format!(" --mask {}", self.mask));
        if self.layout != "bhsd" {
            cmd.push_str(&format!(" --layout {}", self.layout));
        }
        cmd
    }
}

/// A finding's replay: the command and the spec it stands for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replay {
    /// `sdpa bench ...`.
    pub command: String,
    /// The same request as a spec file.
    pub spec: ReplaySpec,
}

impl Replay {
    /// Builds a replay from a spec.
    pub fn new(spec: ReplaySpec) -> Self {
        Replay { command: spec.command(), spec }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn spec_round_trips_and_prints_the_command() {
        let spec = ReplaySpec {
            backends: vec!["cuda".into()],
            kernels: vec!["unfused".into(), "fa2".into()],
            dtype: "bf16".into(),
            shapes: vec![Shape { b: 2, hq: 16, hkv: 8, sq: 1024, sk: 1024, d: 64, dv: 64 }],
            mask: "causal".into(),
            layout: "bhsd".into(),
        };
        assert_eq!(
            spec.command(),
            "sdpa bench --backend cuda --kernel unfused,fa2 --dtype bf16 --shape 2,16,8,1024,1024,64 --mask causal"
        );
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<ReplaySpec>(&json).unwrap(), spec);
    }
}
