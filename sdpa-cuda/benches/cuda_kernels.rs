//! Times CUDA kernels on a list of points with device events (L2 flushed before each call, median of the
//! reps), checking each output against the f64 reference on a few rows, and writes one JSON record per
//! (point, kernel), naming the kernel that ran and its entry points (`programs`: e.g. which splitkv load
//! path and head-dim class the plan chose). `bench/gpu/bench_cuda.py` drives it and times PyTorch on the same points in the same
//! run; run alone (`cargo bench -p sdpa-cuda --bench cuda_kernels`) it times a small default grid.
//!
//! Usage: `cuda_kernels [--points points.json] [--out records.json] [--warmup N] [--reps N]
//! [--flush dirty|clean]`, where a point is `{"tag", "b", "hq", "hkv", "sq", "sk", "d", ["dv",] "dtype",
//! "mask", "kernel", "f32_math"[, "descale"]}` (`dv` defaults to `d`; `descale`, for `f8e4m3` points only, is one
//! factor or `q,k,v` and defaults to `sqrt(3) / 448`, which spreads the random draws over the E4M3 range). `--flush` picks how L2 is emptied before each timed call (`sdpa_cuda::L2Flush`:
//! `dirty`, the default, writes 256 MB as `do_bench` does; `clean` reads 256 MB). With
//! `SDPA_SPLITKV_TRACE=1` in the environment and `--trace DIR`, the per-block timeline of each point's last
//! `splitkv` launch goes to `DIR/trace-{n}.json` (n = the point's index; `sdpa_cuda::splitkv::TRACE_FIELDS`
//! says what the words are).

use sdpa_core::check::check_output;
use sdpa_core::{
    AttentionCost, AttentionSpec, DType, Descale, F32Math, HostBackend, HostInputs, Kernel, Mask, RunOptions, Shape,
};
use sdpa_cuda::{CudaBackend, L2Flush};
use serde_json::{json, Value};
use std::process::ExitCode;

fn default_points() -> Value {
    let mut v = Vec::new();
    for (kernel, dtype, math) in [("unfused", "bf16", "exact"), ("fa1", "bf16", "exact"), ("fa1", "f32", "exact")] {
        for s in [512, 2048] {
            v.push(json!({"tag": "default", "b": 4, "hq": 16, "hkv": 16, "sq": s, "sk": s, "d": 64,
                          "dtype": dtype, "mask": "none", "kernel": kernel, "f32_math": math}));
        }
    }
    Value::Array(v)
}

fn field<'a>(p: &'a Value, k: &str) -> Result<&'a Value, String> {
    p.get(k).ok_or_else(|| format!("point {p} lacks `{k}`"))
}

fn usize_of(p: &Value, k: &str) -> Result<usize, String> {
    field(p, k)?.as_u64().map(|x| x as usize).ok_or_else(|| format!("`{k}` of {p} is not an integer"))
}

fn str_of<'a>(p: &'a Value, k: &str) -> Result<&'a str, String> {
    field(p, k)?.as_str().ok_or_else(|| format!("`{k}` of {p} is not a string"))
}

/// The spec and options of a point.
fn call_of(p: &Value) -> Result<(AttentionSpec, RunOptions), String> {
    let shape = Shape {
        b: usize_of(p, "b")?,
        hq: usize_of(p, "hq")?,
        hkv: usize_of(p, "hkv")?,
        sq: usize_of(p, "sq")?,
        sk: usize_of(p, "sk")?,
        d: usize_of(p, "d")?,
        dv: if p.get("dv").is_some() { usize_of(p, "dv")? } else { usize_of(p, "d")? },
    };
    let dtype = str_of(p, "dtype")?.parse()?;
    let mask: Mask = str_of(p, "mask")?.parse()?;
    let kernel: Kernel = str_of(p, "kernel")?.parse()?;
    let f32_math: F32Math = str_of(p, "f32_math")?.parse()?;
    let mut spec = AttentionSpec::new(shape, dtype).with_mask(mask);
    if dtype == DType::F8E4M3 {
        let descale: Descale = match p.get("descale") {
            Some(v) => v.as_str().ok_or_else(|| format!("`descale` of {p} is not a string"))?.parse()?,
            None => Descale::for_random_inputs(),
        };
        spec = spec.with_descale(descale);
    }
    Ok((spec, RunOptions { kernel, f32_math, threads: None, lse: false }))
}

fn one(
    gpu: &CudaBackend,
    spec: &AttentionSpec,
    opts: &RunOptions,
    warmup: usize,
    reps: usize,
) -> Result<Value, String> {
    let (shape, dtype, f32_math, mask) = (spec.shape, spec.dtype, opts.f32_math, &spec.mask);
    let inputs = HostInputs::random(spec, 42).map_err(|e| e.to_string())?;
    let run = gpu.run_host(spec, opts, &inputs).map_err(|e| e.to_string())?;
    let check = check_output(spec, &inputs, &run.output, f32_math, Some(8)).map_err(|e| e.to_string())?;
    let (mut times, ran) = gpu.time_host(spec, opts, &inputs, warmup, reps).map_err(|e| e.to_string())?;
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let cost = AttentionCost::of(&shape, mask, dtype);
    // The entry points the call runs (e.g. which splitkv load path and head-dim class the plan chose).
    let programs: Vec<String> =
        gpu.programs_for(spec, opts).map_err(|e| e.to_string())?.iter().map(|p| p.name.clone()).collect();
    Ok(json!({
        "kernel_ran": ran.name(),
        "programs": programs,
        "median_ms": median,
        "min_ms": times[0],
        "max_ms": times[times.len() - 1],
        "tflops": cost.flops / median / 1e9,
        "gbps": cost.bytes / median / 1e6,
        "rel_err": check.rel_err,
        "check_pass": check.pass,
        "descale": spec.descale,
    }))
}

/// Copies the trace global of the `splitkv` program the point ran (its last traced launch) to `path` as one
/// array of `TRACE_FIELDS` words per block, and zeroes it.
fn write_trace(gpu: &CudaBackend, spec: &AttentionSpec, opts: &RunOptions, path: &str) -> Result<(), String> {
    use sdpa_cuda::splitkv::{TRACE_BLOCKS, TRACE_FIELDS, TRACE_GLOBAL};
    let dev = gpu.device();
    let programs = gpu.programs_for(spec, opts).map_err(|e| e.to_string())?;
    let program = programs
        .iter()
        .find(|p| p.module.name == sdpa_cuda::modules::SPLITKV.name)
        .ok_or_else(|| "the point does not run splitkv".to_string())?;
    let module = dev.module(program).map_err(|e| e.to_string())?;
    let stream = dev.stream();
    let mut global = module.get_global(TRACE_GLOBAL, stream).map_err(|e| format!("{e:?}"))?;
    let bytes = stream.clone_dtoh(&global).map_err(|e| format!("{e:?}"))?;
    // Zeroed for the next point, which may launch fewer blocks.
    stream.memset_zeros(&mut global).map_err(|e| format!("{e:?}"))?;
    let words: Vec<u64> = bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
    let blocks: Vec<&[u64]> = words.chunks_exact(TRACE_FIELDS).take(TRACE_BLOCKS).take_while(|b| b[0] != 0).collect();
    std::fs::write(path, serde_json::to_string(&blocks).map_err(|e| e.to_string())?).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let warmup = arg("--warmup").and_then(|s| s.parse().ok()).unwrap_or(5);
    let reps = arg("--reps").and_then(|s| s.parse().ok()).unwrap_or(30);
    let points = match arg("--points") {
        Some(path) => match std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str::<Value>(&t).map_err(|e| e.to_string()))
        {
            Ok(v) => v,
            Err(e) => {
                eprintln!("cuda_kernels: cannot read {path}: {e}");
                return ExitCode::FAILURE;
            }
        },
        None => default_points(),
    };
    let flush: L2Flush = match arg("--flush").as_deref().unwrap_or("dirty").parse() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("cuda_kernels: {e}");
            return ExitCode::FAILURE;
        }
    };
    let gpu = match CudaBackend::new(0) {
        Ok(g) => g.with_l2_flush(flush),
        Err(e) => {
            eprintln!("cuda_kernels: {e}");
            return ExitCode::FAILURE;
        }
    };
    let points = points.as_array().map(Vec::as_slice).unwrap_or_default();
    let calls: Vec<_> = points.iter().filter_map(|p| call_of(p).ok()).collect();
    // Every program the points need, compiled in parallel before anything is timed (a point whose call
    // cannot be planned reports its error below).
    let programs: Vec<_> = calls.iter().filter_map(|(s, o)| gpu.programs_for(s, o).ok()).flatten().collect();
    if let Err(e) = gpu.device().prepare(&programs) {
        eprintln!("cuda_kernels: warm-up: {e}");
    }
    let device = sdpa_core::Backend::device_name(&gpu);
    let trace_dir = arg("--trace");
    let mut out = Vec::new();
    for (n, p) in points.iter().enumerate() {
        let res = call_of(p).and_then(|(spec, opts)| {
            let res = one(&gpu, &spec, &opts, warmup, reps);
            if let Some(dir) = &trace_dir {
                if let Err(e) = write_trace(&gpu, &spec, &opts, &format!("{dir}/trace-{n}.json")) {
                    eprintln!("cuda_kernels: trace of point {n}: {e}");
                }
            }
            res
        });
        let mut rec = p.clone();
        if let Some(obj) = rec.as_object_mut() {
            obj.insert("device".into(), json!(device));
            obj.insert("l2_flush".into(), json!(format!("{flush:?}").to_lowercase()));
            match res {
                Ok(Value::Object(r)) => obj.extend(r),
                Ok(_) => {}
                Err(e) => {
                    obj.insert("error".into(), json!(e));
                }
            }
        }
        eprintln!("{rec}");
        out.push(rec);
    }
    let text = serde_json::to_string_pretty(&out).unwrap_or_default();
    match arg("--out") {
        Some(path) => {
            if let Err(e) = std::fs::write(&path, text) {
                eprintln!("cuda_kernels: cannot write {path}: {e}");
                return ExitCode::FAILURE;
            }
        }
        None => println!("{text}"),
    }
    ExitCode::SUCCESS
}
