//! Times windows, softcap and ALiBi against the same call without them on the GPU (issue 22's speed cases):
//! bf16, B = 1, H = 16, D = 128, causal bottom-right, S = 32k by default: full causal, window 4096, causal +
//! softcap 50, window + softcap, ALiBi. Device-event times (L2 flushed before each call), the median of
//! `reps`, TFLOPS on the work the band leaves (`AttentionCost::of_spec`), and a check of a few rows
//! against the f64 reference. Until `sdpa run --window/--softcap/--alibi` are everywhere, this is the
//! quickest way to time them:
//!
//!     cargo run --release -p sdpa-cuda --example variant_timing -- [S] [kernel] [reps]

use sdpa_core::check::check_output;
use sdpa_core::{
    Alibi, AttentionCost, AttentionSpec, DType, F32Math, HostBackend, HostInputs, Kernel, Mask, RunOptions, Shape,
    Variants, Window,
};
use sdpa_cuda::CudaBackend;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let s: usize = args.get(1).map_or(Ok(32768), |x| x.parse())?;
    let kernel: Kernel = args.get(2).map_or(Ok(Kernel::Fa2), |x| x.parse())?;
    let reps: usize = args.get(3).map_or(Ok(10), |x| x.parse())?;
    let gpu = CudaBackend::new(0)?;
    let shape = Shape { b: 1, hq: 16, hkv: 16, sq: s, sk: s, d: 128, dv: 128 };
    let base = AttentionSpec::new(shape, DType::BF16).with_mask(Mask::CausalBottomRight);
    let v = |window, softcap, alibi| Variants { window, softcap, alibi, diagonal: None };
    let w = Some(Window::left(4096));
    let cases = [
        ("full causal", v(None, None, None)),
        ("window 4096,0", v(w, None, None)),
        ("causal + softcap 50", v(None, Some(50.0), None)),
        ("window + softcap 50", v(w, Some(50.0), None)),
        ("causal + alibi", v(None, None, Some(Alibi::Standard))),
        ("window + softcap + alibi", v(w, Some(50.0), Some(Alibi::Standard))),
    ];
    let opts = RunOptions { kernel, f32_math: F32Math::Exact, threads: None, lse: false };
    let calls: Vec<(AttentionSpec, RunOptions)> =
        cases.iter().map(|(_, var)| (base.clone().with_variants(var.clone()), opts)).collect();
    gpu.warm_up(&calls)?;
    let inputs = HostInputs::random(&base, 1)?;
    println!("{} bf16 B=1 H=16 D=128 S={s} causal-br, kernel {kernel}, median of {reps}", gpu.device_name());
    println!("{:<26} {:>9} {:>8} {:>9} {:>8}  check", "case", "ms", "vs full", "TFLOPS", "ran");
    let mut full = None;
    for ((name, _), (spec, opts)) in cases.iter().zip(&calls) {
        let (mut times, ran) = gpu.time_host(spec, opts, &inputs, 2, reps)?;
        times.sort_by(f64::total_cmp);
        let ms = times[times.len() / 2];
        let full_ms = *full.get_or_insert(ms);
        let tflops = AttentionCost::of_spec(spec).flops / (ms * 1e-3) / 1e12;
        let run = gpu.run_host(spec, opts, &inputs)?;
        let r = check_output(spec, &inputs, &run.output, F32Math::Exact, Some(16))?;
        let verdict = if r.pass { format!("ok ({:.1e})", r.rel_err) } else { format!("FAIL {r:?}") };
        println!("{name:<26} {ms:>9.3} {:>7.2}x {tflops:>9.1} {ran:>8}  {verdict}", full_ms / ms);
    }
    Ok(())
}
