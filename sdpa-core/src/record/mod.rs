//! The benchmark result record: one per (backend, kernel, device, dtype, shape, mask, layout), written by
//! `sdpa run --json`, `sdpa bench`, the PyTorch timing scripts, and read by `sdpa report` and the analyzer;
//! the sweep description ([`BenchSpec`]) that `sdpa bench --spec` and the analyzer's replays share; and the
//! file that holds a run's records ([`mod@file`]).

pub mod file;
pub mod first_call;

pub use file::{parse_results, BenchFile, MeasuredPeak, Skipped, BENCH_FORMAT};
pub use first_call::{FirstCall, ImageOrigin, KernelCache, ProgramLoad, WarmUp};

use crate::backend::F32Math;
use crate::check::CheckReport;
use crate::cost::AttentionCost;
use crate::dtype::DType;
use crate::spec::{AttentionSpec, Layout, Shape};
use crate::variants::Variants;
use serde::{Deserialize, Serialize};

/// Reads an f64 that may be `null`, as NaN: serde_json writes NaN and infinities as `null` (and the reader
/// turns Python's NaN into `null`), so a record that holds one must still read back.
pub(crate) fn f64_or_nan<'de, D: serde::Deserializer<'de>>(de: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(de)?.unwrap_or(f64::NAN))
}

/// Median, min and max of repeated timings, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TimeStats {
    /// Median over the timed repetitions.
    pub median: f64,
    /// Fastest repetition.
    #[serde(deserialize_with = "f64_or_nan")]
    pub min: f64,
    /// Slowest repetition.
    #[serde(deserialize_with = "f64_or_nan")]
    pub max: f64,
    /// Number of timed repetitions.
    #[serde(default)]
    pub reps: usize,
}

impl TimeStats {
    /// Statistics of `samples` (milliseconds); `None` when empty or any sample is not finite.
    pub fn from_samples(samples: &[f64]) -> Option<Self> {
        if samples.is_empty() || samples.iter().any(|x| !x.is_finite()) {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 { s[n / 2] } else { 0.5 * (s[n / 2 - 1] + s[n / 2]) };
        Some(TimeStats { median, min: s[0], max: s[n - 1], reps: n })
    }
}

/// One benchmark result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchRecord {
    /// "reference", "cpu", "cuda", "pytorch", "candle", ...
    pub backend: String,
    /// Kernel that ran ("fa2", "unfused", "flash", "cudnn", "math", ...), or "auto" when the backend chose.
    pub kernel: String,
    /// For `auto`: the kernel the backend chose for this shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_chose: Option<String>,
    /// Device name.
    pub device: String,
    /// Element type.
    pub dtype: DType,
    /// Logical sizes.
    pub shape: Shape,
    /// Mask name: none, causal (top-left), causal-br, bool, additive.
    pub mask: String,
    /// Window, softcap and ALiBi, with the diagonal they measure from always named (absent: plain).
    /// `tflops` counts the work the window leaves, not Sk² (`cost::AttentionCost::of_spec`).
    #[serde(default, skip_serializing_if = "Variants::is_plain")]
    pub variants: Variants,
    /// The ragged batch (per-sequence lengths, pages) when the call was varlen or paged; `shape` then
    /// holds B and the length bounds, and `tflops` counts each sequence's own work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ragged: Option<crate::ragged::Ragged>,
    /// bhsd or bshd (or "strided").
    #[serde(default)]
    pub layout: Option<String>,
    /// Which pass was timed: the forward (absent in older records), the backward, or both; `tflops` and
    /// `gbps` count that pass's work ([`crate::AttentionCost::of_pass`]) and `check` is the worst of the
    /// three gradients for a backward.
    #[serde(default, skip_serializing_if = "is_forward")]
    pub pass: crate::backward::Pass,
    /// For a backward: whether its result is independent of thread and atomic ordering (as the backend
    /// reported it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deterministic: Option<bool>,
    /// f32 multiplication mode when dtype is f32 ("exact", "tf32", "split-tf32").
    #[serde(default)]
    pub f32_math: Option<String>,
    /// For f8e4m3 inputs: the per-tensor descale factors the call ran with (`value = stored × factor`),
    /// which set the inputs' range and so the error in `check`; absent for other dtypes and in records
    /// written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub descale: Option<crate::fp8::Descale>,
    /// CPU worker threads, when relevant.
    #[serde(default)]
    pub threads: Option<usize>,
    /// Timings.
    pub time_ms: TimeStats,
    /// FLOPs of the two products (exact causal count) / median time, in TFLOP/s.
    #[serde(deserialize_with = "f64_or_nan")]
    pub tflops: f64,
    /// Minimal bytes / median time, in GB/s.
    #[serde(deserialize_with = "f64_or_nan")]
    pub gbps: f64,
    /// Comparison with the f64 reference, when checked (for a backward: the worst of the three gradients).
    #[serde(default)]
    pub check: Option<CheckReport>,
    /// For a backward: each gradient's comparison with the reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_check: Option<crate::backward::GradCheckReport>,
    /// Peak extra memory of the call in bytes, when measured.
    #[serde(default)]
    pub peak_mem_bytes: Option<u64>,
    /// Git commit of the code measured.
    #[serde(default)]
    pub commit: Option<String>,
    /// UTC date-time of the measurement (RFC 3339).
    #[serde(default)]
    pub date: Option<String>,
    /// Machine description (CPU model, host name, GPU).
    #[serde(default)]
    pub machine: Option<String>,
    /// The configuration's first call in the process: its latency and the kernel programs it compiled or
    /// loaded (absent in records written before it existed and in PyTorch's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_call: Option<FirstCall>,
    /// GPUs the call ran across (ring attention, `sdpa bench --gpus N`); absent for one device (records
    /// written before it existed, and every single-device run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<usize>,
}

impl BenchRecord {
    /// A record for `spec` from timing samples; TFLOPS and GB/s come from the cost model.
    pub fn new(
        backend: &str,
        kernel: &str,
        device: &str,
        spec: &AttentionSpec,
        time_ms: TimeStats,
        check: Option<CheckReport>,
    ) -> Self {
        let cost = AttentionCost::of_spec(spec);
        BenchRecord {
            backend: backend.to_string(),
            kernel: kernel.to_string(),
            auto_chose: None,
            device: device.to_string(),
            dtype: spec.dtype,
            shape: spec.shape,
            mask: spec.mask.name().to_string(),
            variants: spec.recorded_variants(),
            ragged: spec.ragged.clone(),
            layout: Some(spec.layout().map_or("strided", |l| l.name()).to_string()),
            pass: crate::backward::Pass::Fwd,
            deterministic: None,
            f32_math: None,
            // What the call ran with: the spec's factors, or the unit ones it falls back to (`descales`).
            descale: (spec.dtype == DType::F8E4M3).then(|| spec.descales()),
            threads: None,
            time_ms,
            tflops: cost.tflops(time_ms.median),
            gbps: cost.gbps(time_ms.median),
            check,
            grad_check: None,
            peak_mem_bytes: None,
            commit: None,
            date: None,
            machine: None,
            first_call: None,
            gpus: None,
        }
    }
}

impl BenchRecord {
    /// The record of `pass` instead of the forward: TFLOPS and GB/s recounted for that pass's work.
    pub fn with_pass(mut self, spec: &AttentionSpec, pass: crate::backward::Pass) -> Self {
        let cost = AttentionCost::of_pass(spec, pass);
        self.pass = pass;
        self.tflops = cost.tflops(self.time_ms.median);
        self.gbps = cost.gbps(self.time_ms.median);
        self
    }
}

/// A benchmark sweep as a file: `sdpa bench --spec FILE`, the presets under `bench/presets/`,
/// `bench/pytorch_sdpa.py --spec FILE` and the analyzer's replays all use it. The sweep is the cross product
/// of every list; an empty list takes the bench command's default (or its flag). A file holds one spec or a
/// JSON array of specs, whose sweeps are run one after the other.
///
/// Every list also reads from its singular key holding one value or a list (`"dtype": "bf16"`,
/// `"mask": "causal"`, `"layout": "bhsd"`, `"backend"`, `"kernel"`), the form replay files written before
/// replays were `BenchSpec`s have; giving both forms of one key is an error.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct BenchSpec {
    /// Short name, e.g. the preset's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What the sweep is for, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Backends: "reference", "cpu", "cuda"; "pytorch" asks for the PyTorch script on the same shapes.
    #[serde(skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many", alias = "backend")]
    pub backends: Vec<String>,
    /// Kernel names: "unfused", "fa1", "fa2", "splitkv", "auto".
    #[serde(skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many", alias = "kernel")]
    pub kernels: Vec<String>,
    /// Element types.
    #[serde(skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many", alias = "dtype")]
    pub dtypes: Vec<DType>,
    /// Logical sizes, `{b, hq, hkv, sq, sk, d, dv}`.
    #[serde(skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many", alias = "shape")]
    pub shapes: Vec<Shape>,
    /// Mask names as in records: "none", "causal" (top-left), "causal-br" (bottom-right), "bool",
    /// "additive" (explicit full `[B, Hq, Sq, Sk]` masks with random contents).
    #[serde(skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many", alias = "mask")]
    pub masks: Vec<String>,
    /// Memory layouts: "bhsd", "bshd".
    #[serde(skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many", alias = "layout")]
    pub layouts: Vec<Layout>,
    /// Attention variants, each a [`Variants`] object (`{"window": {"left": 4096, "right": 0}, "softcap": 50.0,
    /// "alibi": "standard", "diagonal": "bottom-right"}`; `{}` is plain attention). Swept like the other
    /// lists; empty (or absent) means plain attention only.
    #[serde(skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many", alias = "variant")]
    pub variants: Vec<Variants>,
    /// Ragged batches (`{"seqlens_k": [1, 4097, 333], "page_size": 16}`), resolved against each shape
    /// ([`crate::ragged::RaggedRequest::resolve`]); empty (or absent) means dense batches only.
    #[serde(default, skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many")]
    pub batches: Vec<crate::ragged::RaggedRequest>,
    /// Passes to time: "fwd", "bwd", "fwd+bwd"; empty (or absent) means the forward only.
    #[serde(skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many", alias = "pass")]
    pub passes: Vec<crate::backward::Pass>,
    /// f32 multiplication modes ("exact", "tf32", "split-tf32"); only f32 configurations use them.
    #[serde(skip_serializing_if = "Vec::is_empty", deserialize_with = "one_or_many")]
    pub f32_math: Vec<F32Math>,
    /// Untimed calls before timing, when the spec wants a value other than the command's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warmup: Option<usize>,
    /// Largest number of timed calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reps: Option<usize>,
    /// Time budget per configuration in seconds: fewer repetitions when one call is slow.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_time_s: Option<f64>,
}

fn is_forward(p: &crate::backward::Pass) -> bool {
    *p == crate::backward::Pass::Fwd
}

/// One value or a list of them, as a list. The value itself is read by `T`, so a bad value keeps `T`'s
/// own message ("unknown dtype `f64`") instead of an untagged enum's "did not match any variant".
fn one_or_many<'de, D, T>(de: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer, StrDeserializer};
    struct Visit<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Visit<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("one value or a list of values")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Vec<T>, A::Error> {
            Vec::<T>::deserialize(SeqAccessDeserializer::new(seq))
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Vec<T>, E> {
            T::deserialize(StrDeserializer::<E>::new(v)).map(|x| vec![x])
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Vec<T>, A::Error> {
            T::deserialize(MapAccessDeserializer::new(map)).map(|x| vec![x])
        }
    }
    de.deserialize_any(Visit(std::marker::PhantomData))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_even_and_odd_counts() {
        let t = TimeStats::from_samples(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((t.median, t.min, t.max, t.reps), (2.0, 1.0, 3.0, 3));
        assert_eq!(TimeStats::from_samples(&[4.0, 1.0, 2.0, 3.0]).unwrap().median, 2.5);
        assert!(TimeStats::from_samples(&[]).is_none());
        assert!(TimeStats::from_samples(&[1.0, f64::NAN]).is_none());
    }

    #[test]
    fn records_round_trip_and_accept_minimal_foreign_records() {
        let spec = AttentionSpec::new(Shape::new(1, 8, 1024, 1024, 64), DType::BF16);
        let t = TimeStats::from_samples(&[1.0]).unwrap();
        let r = BenchRecord::new("cpu", "fa2", "test", &spec, t, None);
        let back: BenchRecord = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        assert!((r.tflops - 4.0 * 8.0 * 1024.0 * 1024.0 * 64.0 / 1e-3 / 1e12).abs() < 1e-9);
        // A record as a Python script writes it: fewer fields, check with only the four required keys.
        let py = r#"{"backend":"pytorch","kernel":"flash","device":"H100","dtype":"bf16",
            "shape":{"b":1,"hq":8,"hkv":8,"sq":1024,"sk":1024,"d":64,"dv":64},"mask":"causal",
            "time_ms":{"median":0.5,"min":0.4,"max":0.6},"tflops":1.0,"gbps":2.0,
            "check":{"max_abs_err":0.001,"rel_err":0.002,"tolerance":0.016,"pass":true}}"#;
        let r: BenchRecord = serde_json::from_str(py).unwrap();
        assert!(r.check.unwrap().pass);
    }

    /// Regression: FP8 records lacked the descale factors their call ran with (the inputs' range, which
    /// sets the error in `check`), so two runs at different factors could not be told apart. Records of
    /// other dtypes, and FP8 records written before, stay as they were.
    #[test]
    fn fp8_records_carry_their_descales_and_older_records_still_read() {
        let t = TimeStats::from_samples(&[1.0]).unwrap();
        let ds = crate::fp8::Descale { q: 0.5, k: 0.25, v: 0.125 };
        let spec = AttentionSpec::new(Shape::new(1, 8, 256, 256, 64), DType::F8E4M3).with_descale(ds);
        let r = BenchRecord::new("cuda", "fa3", "test", &spec, t, None);
        assert_eq!(r.descale, Some(ds));
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains(r#""descale":{"q":0.5,"k":0.25,"v":0.125}"#), "{text}");
        let back: BenchRecord = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
        // bf16: no descale, and the key is not written.
        let plain = AttentionSpec::new(Shape::new(1, 8, 256, 256, 64), DType::BF16);
        let r16 = BenchRecord::new("cuda", "fa2", "test", &plain, t, None);
        assert_eq!(r16.descale, None);
        assert!(!serde_json::to_string(&r16).unwrap().contains("descale"));
        // An FP8 record written before the field existed reads, without factors.
        let old = text.replace(r#","descale":{"q":0.5,"k":0.25,"v":0.125}"#, "");
        assert!(!old.contains("descale"));
        assert_eq!(serde_json::from_str::<BenchRecord>(&old).unwrap().descale, None);
    }

    #[test]
    fn bench_specs_take_defaults_for_missing_lists() {
        let text = r#"{"backends":["cpu"],"dtypes":["bf16"],"masks":["causal-br"],"layouts":["bshd"],
            "shapes":[{"b":1,"hq":8,"hkv":2,"sq":64,"sk":96,"d":64,"dv":64}]}"#;
        let s: BenchSpec = serde_json::from_str(text).unwrap();
        assert_eq!(s.shapes[0].hkv, 2);
        assert_eq!(s.layouts, vec![Layout::Bshd]);
        assert!(s.kernels.is_empty() && s.reps.is_none());
        assert!(serde_json::from_str::<BenchSpec>(r#"{"dtypes":["f64"]}"#).is_err());
    }

    #[test]
    fn bench_specs_read_the_singular_keys_of_older_replay_files() {
        let text = r#"{"backends":["cuda"],"kernels":["unfused","fa2"],"dtype":"bf16","mask":"causal",
            "layout":"bshd","shapes":[{"b":2,"hq":16,"hkv":8,"sq":1024,"sk":1024,"d":64,"dv":64}]}"#;
        let s: BenchSpec = serde_json::from_str(text).unwrap();
        assert_eq!((s.dtypes, s.masks, s.layouts), (vec![DType::BF16], vec!["causal".to_string()], vec![Layout::Bshd]));
        let both = r#"{"dtype":"bf16","dtypes":["f16"]}"#;
        assert!(serde_json::from_str::<BenchSpec>(both).is_err(), "both forms of one key must be refused");
        // Written specs leave out what is unset and read back equal.
        let back: BenchSpec = serde_json::from_str(&serde_json::to_string(&BenchSpec::default()).unwrap()).unwrap();
        assert_eq!(back, BenchSpec::default());
        assert_eq!(serde_json::to_string(&BenchSpec::default()).unwrap(), "{}");
    }

    #[test]
    fn bench_specs_sweep_variants_and_default_to_plain_attention() {
        use crate::variants::{Alibi, Diagonal, Window};
        // No list: plain attention only, and nothing written for it.
        let plain: BenchSpec = serde_json::from_str(r#"{"dtypes":["bf16"]}"#).unwrap();
        assert!(plain.variants.is_empty());
        assert!(!serde_json::to_string(&plain).unwrap().contains("variants"));
        // The shape the analyzer's replays write (part 5 of issue 22), in a list with plain attention (`{}`).
        let text = r#"{"variants":[{},{"window":{"left":4096,"right":0},"softcap":50.0,"alibi":"standard",
            "diagonal":"bottom-right"},{"alibi":{"slopes":[0.5,0.25]},"diagonal":"top-left"},
            {"window":{"left":null,"right":0},"diagonal":"bottom-right"}]}"#;
        let s: BenchSpec = serde_json::from_str(text).unwrap();
        assert_eq!(s.variants.len(), 4);
        assert!(s.variants[0].is_plain());
        assert_eq!(s.variants[1].window, Some(Window::left(4096)));
        assert_eq!((s.variants[1].softcap, s.variants[1].alibi.clone()), (Some(50.0), Some(Alibi::Standard)));
        assert_eq!(s.variants[1].diagonal, Some(Diagonal::BottomRight));
        assert_eq!(s.variants[2].alibi, Some(Alibi::Slopes(vec![0.5, 0.25])));
        assert_eq!(s.variants[3].window, Some(Window { left: None, right: Some(0) }));
        let back: BenchSpec = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        // One object alone (the singular key too) is a one-item list.
        let one: BenchSpec = serde_json::from_str(r#"{"variant":{"softcap":30.0}}"#).unwrap();
        assert_eq!(one.variants.len(), 1);
        assert_eq!(one.variants[0].softcap, Some(30.0));
        // Bad values keep the variants' own messages.
        for bad in [
            r#"{"variants":[{"alibi":"bloom"}]}"#,
            r#"{"variants":[{"diagonal":"middle"}]}"#,
            r#"{"variants":[{"softcap":"big"}]}"#,
            r#"{"variants":[{"windw":{"left":4096,"right":0}}]}"#,
            r#"{"variants":[{"window":{"left":4096,"rigth":0}}]}"#,
        ] {
            assert!(serde_json::from_str::<BenchSpec>(bad).is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<BenchSpec>(r#"{"variant":{},"variants":[{}]}"#).is_err());
    }
}
