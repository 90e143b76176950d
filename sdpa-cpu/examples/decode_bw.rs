//! Decoding against the machine's read bandwidth, both measured in this one process and interleaved:
//! each round measures the read ceiling (Rust, `threads` threads streaming a 1 GiB buffer with 512-bit
//! loads, with and without software prefetch; the best pass), then times every (layout, kernel), then the
//! ceiling again. A kernel's fraction is its bytes (Q, K, V read once, O written once) per second over
//! the best ceiling of the same round; the 1-minute load average is recorded per round, since other
//! work on a shared machine lowers both.
//!
//! ```sh
//! cargo build --release -p sdpa-cpu --example decode_bw
//! target-cpu/release/examples/decode_bw --shape 1,32,32,1,4096,128 --threads 2 --rounds 5 --reps 10 \
//!     --layouts bhsd,bshd --kernels fa2,splitkv --out bench/results/cpu/cpu-decode-bw.json
//! ```
//!
//! Writes sdpa-core `BenchRecord`s (a JSON array) to `--out` and the ceilings, loads and fractions to the
//! same name with `-meta.json`; prints a summary.

#[path = "support/readbw.rs"]
mod readbw;

use sdpa_core::record::{BenchRecord, TimeStats};
use sdpa_core::{
    AttentionCost, AttentionSpec, Backend, DType, HostBuffer, HostInputs, Kernel, Layout, RunOptions, Shape,
};
use std::error::Error;
use std::time::Instant;

struct Args {
    shape: Shape,
    dtype: DType,
    threads: usize,
    rounds: usize,
    reps: usize,
    layouts: Vec<Layout>,
    kernels: Vec<Kernel>,
    gib: f64,
    out: Option<String>,
}

fn parse() -> Result<Args, Box<dyn Error>> {
    let mut a = Args {
        shape: "1,32,32,1,4096,128".parse()?,
        dtype: DType::F32,
        threads: 2,
        rounds: 5,
        reps: 10,
        layouts: vec![Layout::Bhsd, Layout::Bshd],
        kernels: vec![Kernel::Fa2, Kernel::SplitKv],
        gib: 0.25,
        out: None,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--shape" => a.shape = val()?.parse()?,
            "--dtype" => a.dtype = val()?.parse()?,
            "--threads" => a.threads = val()?.parse()?,
            "--rounds" => a.rounds = val()?.parse()?,
            "--reps" => a.reps = val()?.parse()?,
            "--layouts" => a.layouts = val()?.split(',').map(str::parse).collect::<Result<_, _>>()?,
            "--kernels" => a.kernels = val()?.split(',').map(str::parse).collect::<Result<_, _>>()?,
            "--gib" => a.gib = val()?.parse()?,
            "--out" => a.out = Some(val()?.clone()),
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    if a.threads == 0 || a.rounds == 0 || a.reps == 0 {
        return Err("--threads, --rounds and --reps must be at least 1".into());
    }
    Ok(a)
}

/// One (layout, kernel) case: its spec, inputs and output, and the samples so far.
struct Case {
    spec: AttentionSpec,
    kernel: Kernel,
    inputs: HostInputs,
    out: HostBuffer,
    samples: Vec<f64>,
    round_medians: Vec<f64>,
    round_mins: Vec<f64>,
    /// Call GB/s over the ceiling pass just before it.
    pair_fractions: Vec<f64>,
}

impl Case {
    /// Milliseconds of one call.
    fn call(&mut self, opts: &RunOptions) -> Result<f64, Box<dyn Error>> {
        let (s, i) = (&self.spec, &self.inputs);
        let t = Instant::now();
        match (&i.q, &i.k, &i.v, &mut self.out) {
            (HostBuffer::F32(q), HostBuffer::F32(k), HostBuffer::F32(v), HostBuffer::F32(o)) => {
                sdpa_cpu::attention(s, opts, q, k, v, None, o, None)?
            }
            (HostBuffer::F16(q), HostBuffer::F16(k), HostBuffer::F16(v), HostBuffer::F16(o)) => {
                sdpa_cpu::attention(s, opts, q, k, v, None, o, None)?
            }
            (HostBuffer::BF16(q), HostBuffer::BF16(k), HostBuffer::BF16(v), HostBuffer::BF16(o)) => {
                sdpa_cpu::attention(s, opts, q, k, v, None, o, None)?
            }
            _ => return Err("inputs and output differ in dtype".into()),
        };
        Ok(t.elapsed().as_secs_f64() * 1e3)
    }
}

fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(f64::NAN)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        f64::NAN
    } else {
        s[s.len() / 2]
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let a = parse()?;
    let bytes_ceiling = (a.gib * 2f64.powi(30)) as usize;
    let buf = readbw::buffer(bytes_ceiling);
    let mut cases = Vec::new();
    for &layout in &a.layouts {
        let spec = AttentionSpec::new(a.shape, a.dtype).with_layout(layout);
        let inputs = HostInputs::random(&spec, 1)?;
        let o_len = spec.required_len(sdpa_core::Operand::O)?;
        for &kernel in &a.kernels {
            cases.push(Case {
                spec: spec.clone(),
                kernel,
                inputs: inputs.clone(),
                out: HostBuffer::poisoned(a.dtype, o_len),
                samples: Vec::new(),
                round_medians: Vec::new(),
                round_mins: Vec::new(),
                pair_fractions: Vec::new(),
            });
        }
    }
    let bytes = AttentionCost::of_spec(&cases.first().ok_or("no case: give --layouts and --kernels")?.spec).bytes;
    let mut ceilings = Vec::new();
    let mut ceiling_passes = Vec::new();
    let mut loads = Vec::new();
    for round in 0..a.rounds {
        loads.push(loadavg());
        let mut passes = Vec::new();
        let mut times = vec![Vec::new(); cases.len()];
        for c in &mut cases {
            c.call(&RunOptions { kernel: c.kernel, threads: Some(a.threads), ..Default::default() })?;
        }
        for rep in 0..a.reps {
            for (n, c) in cases.iter_mut().enumerate() {
                // A ceiling pass right before each call (plain and prefetching in turn): a call and its pass
                // see the same background load, so their ratio is steadier than either.
                let ceil = readbw::read_gbps(&buf, a.threads, rep % 2 == 1);
                passes.push(ceil);
                let opts = RunOptions { kernel: c.kernel, threads: Some(a.threads), ..Default::default() };
                let t = c.call(&opts)?;
                c.pair_fractions.push(bytes / t / 1e6 / ceil);
                times[n].push(t);
            }
        }
        let ceil = passes.iter().copied().fold(0.0, f64::max);
        ceilings.push(ceil);
        let mut line = format!(
            "round {}: load {:.1}, read ceiling {ceil:.1} GB/s (best of {} passes; median {:.1});",
            round + 1,
            loads[round],
            passes.len(),
            median(&passes)
        );
        ceiling_passes.push(passes);
        for (c, t) in cases.iter_mut().zip(times) {
            c.round_medians.push(median(&t));
            c.round_mins.push(t.iter().copied().fold(f64::INFINITY, f64::min));
            c.samples.extend(t);
            let gbps = bytes / c.round_mins[round] / 1e6;
            line += &format!(
                " {} {}: {gbps:.1} GB/s ({:.0} %)",
                c.spec.layout().map_or("strided", |l| l.name()),
                c.kernel,
                100.0 * gbps / ceil
            );
        }
        eprintln!("{line}");
    }

    let device = sdpa_cpu::CpuBackend::new(Some(a.threads))?.device_name();
    let mut records = Vec::new();
    let mut fractions = serde_json::Map::new();
    println!(
        "{} {} over {} rounds, {} reps each; bytes per call {:.1} MB",
        a.shape,
        a.dtype,
        a.rounds,
        a.reps,
        bytes / 1e6
    );
    println!("| layout | kernel | median ms | min ms | GB/s (median) | GB/s (min) | % of the pass before each call (median) | % fastest call / best pass of its round (median of rounds) |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for c in &cases {
        let fr_med: Vec<f64> = c.round_medians.iter().zip(&ceilings).map(|(t, ceil)| bytes / t / 1e6 / ceil).collect();
        let fr_min: Vec<f64> = c.round_mins.iter().zip(&ceilings).map(|(t, ceil)| bytes / t / 1e6 / ceil).collect();
        let (tmed, tmin) = (median(&c.round_medians), c.samples.iter().copied().fold(f64::INFINITY, f64::min));
        let layout = c.spec.layout().map_or("strided", |l| l.name());
        println!(
            "| {layout} | {} | {tmed:.3} | {tmin:.3} | {:.1} | {:.1} | {:.0} % | {:.0} % |",
            c.kernel,
            bytes / tmed / 1e6,
            bytes / tmin / 1e6,
            100.0 * median(&c.pair_fractions),
            100.0 * median(&fr_min)
        );
        fractions.insert(
            format!("{layout} {}", c.kernel),
            serde_json::json!({
                "per_call_over_pass_before_median": median(&c.pair_fractions),
                "median_call_over_round_best_per_round": fr_med,
                "fastest_call_over_round_best_per_round": fr_min,
            }),
        );
        // The record's median is the median of the per-round medians (as the PyTorch runner does).
        let mut stats = TimeStats::from_samples(&c.samples).ok_or("no samples")?;
        stats.median = tmed;
        let mut r = BenchRecord::new("cpu", c.kernel.name(), &device, &c.spec, stats, None);
        r.threads = Some(a.threads);
        r.machine = Some(sdpa_core::hardware::cpu_model());
        records.push(r);
    }
    println!(
        "read ceiling per round (GB/s): {:?}; 1-minute load per round: {:?}",
        ceilings.iter().map(|x| (x * 10.0).round() / 10.0).collect::<Vec<_>>(),
        loads
    );
    if let Some(out) = &a.out {
        std::fs::write(out, serde_json::to_string_pretty(&records)?)?;
        let meta = serde_json::json!({
            "command": std::env::args().collect::<Vec<_>>().join(" "),
            "read_ceiling_gbps_per_round": ceilings,
            "read_passes_gbps_per_round": ceiling_passes,
            "read_ceiling": format!("one pass before every call (plain and software-prefetching in turn), {} threads streaming {:.2} GiB with 512-bit loads; a round's ceiling is its best pass", a.threads, a.gib),
            "loadavg_1min_per_round": loads,
            "bytes_per_call": bytes,
            "fraction_of_ceiling_per_round": fractions,
        });
        std::fs::write(out.replace(".json", "-meta.json"), serde_json::to_string_pretty(&meta)?)?;
    }
    Ok(())
}
