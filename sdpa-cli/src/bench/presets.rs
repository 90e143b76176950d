//! Named sweeps. Each is a spec file under `bench/presets/`, compiled in, so `--preset NAME` and
//! `--spec bench/presets/NAME.json` (and `bench/pytorch_sdpa.py --spec ...`) run the same thing.

use super::plan::parse_spec_text;
use anyhow::{bail, Result};
use sdpa_core::record::BenchSpec;
use sdpa_core::{DType, Shape};

/// (name, what it is, spec file text).
pub const PRESETS: [(&str, &str, &str); 8] = [
    (
        "quick",
        "the default: CPU unfused vs fused at S = 256..1024 and a decode shape, plus a short GPU sweep when one is present",
        include_str!("../../../bench/presets/quick.json"),
    ),
    (
        "fa2bench",
        "GPU: batch x seqlen = 16384, hidden 2048, D 64/128, S 512..16k, causal and not, bf16/f16",
        include_str!("../../../bench/presets/fa2bench.json"),
    ),
    (
        "decode",
        "decoding one token: GPU bf16 (B=8 Sk=4096; GQA B=1 Sk=32768) and CPU (B=1 H=32 Sk=4096)",
        include_str!("../../../bench/presets/decode.json"),
    ),
    ("seed", "the seed reports' tiny shapes (B=1 H=1 D=64 S=64/128/512) and the CPU issue's shapes", include_str!("../../../bench/presets/seed.json")),
    (
        "headdims",
        "every head dim models use (32..256, MLA 192/128, 512): GPU bf16 B=4 S=4096, CPU f32/bf16 B=1 S=1024",
        include_str!("../../../bench/presets/headdims.json"),
    ),
    (
        "variants",
        "issue 22's window, softcap and ALiBi cases: GPU bf16 B=1 H=16 D=128 S=8k/32k, CPU f32/bf16 B=1 H=4 D=128 S=16k, causal",
        include_str!("../../../bench/presets/variants.json"),
    ),
    (
        "serving",
        "issue 23's serving layouts: GPU bf16 ragged prefill (16 seqs, 64k tokens) and paged decode (B=32, 512..32k, page 16), CPU varlen and paged decode, each with its dense equal-work call",
        include_str!("../../../bench/presets/serving.json"),
    ),
    (
        "backward",
        "issue 24's backward, bwd and fwd+bwd: GPU bf16 on the fa2bench grid (B x S = 16k, hidden 2048, D 64/128, S 512..16k, causal and not), CPU f32/bf16 on the anchors' shapes (B=1 H=8 D=64 S=512..2048, H=16 D=128 S=4096; run with --threads 2)",
        include_str!("../../../bench/presets/backward.json"),
    ),
];

/// The sweeps of a named preset.
pub fn preset(name: &str) -> Result<Vec<BenchSpec>> {
    match PRESETS.iter().find(|p| p.0 == name) {
        Some((_, _, text)) => parse_spec_text(text),
        None => {
            let names: Vec<&str> = PRESETS.iter().map(|p| p.0).collect();
            bail!("unknown preset `{name}` (expected one of: {})", names.join(", "))
        }
    }
}

/// Lists used when neither flags nor the spec give one (a spec file that names only shapes, say).
pub fn quick_defaults() -> BenchSpec {
    BenchSpec {
        backends: vec!["cpu".into()],
        kernels: vec!["unfused".into(), "fa2".into()],
        dtypes: vec![DType::F32],
        shapes: vec![Shape::new(1, 8, 512, 512, 64)],
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_parses() {
        for (name, _, _) in PRESETS {
            let sweeps = preset(name).unwrap();
            assert!(!sweeps.is_empty() && sweeps.iter().all(|s| !s.shapes.is_empty()), "{name}");
        }
        assert!(preset("nope").is_err());
    }
}
