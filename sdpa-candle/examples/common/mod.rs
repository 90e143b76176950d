//! Pieces the numbered examples share: parsing the device and dtype, the error measure, the tolerance it is
//! held to, and interleaved timing.

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use std::time::Instant;

/// `cpu` or `cuda` (CUDA device 0; needs the `cuda` feature).
pub fn device(name: &str) -> Result<Device> {
    match name {
        "cpu" => Ok(Device::Cpu),
        "cuda" => Device::new_cuda(0).context("opening CUDA device 0 (build with --features cuda)"),
        other => bail!("unknown device `{other}` (cpu or cuda)"),
    }
}

/// `f32`, `f16` or `bf16`.
pub fn dtype(name: &str) -> Result<DType> {
    match name {
        "f32" => Ok(DType::F32),
        "f16" => Ok(DType::F16),
        "bf16" => Ok(DType::BF16),
        other => bail!("unknown dtype `{other}` (f32, f16 or bf16)"),
    }
}

/// sdpa's tolerance on the relative L2 error for a dtype (`sdpa_core::check::tolerance`, exact f32 math).
/// sdpa accumulates in f32 and rounds once; candle rounds scores, probabilities and products to the model's
/// dtype. The examples' bar: within this, or at most candle's own error.
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 2e-3,
        _ => 1.6e-2,
    }
}

/// Relative L2 distance `‖a − b‖ / ‖b‖`, in f64.
pub fn rel_l2(a: &Tensor, b: &Tensor) -> Result<f64> {
    let (a, b) = (a.to_dtype(DType::F64)?, b.to_dtype(DType::F64)?);
    let d = (&a - &b)?.sqr()?.sum_all()?.to_scalar::<f64>()?;
    let r = b.sqr()?.sum_all()?.to_scalar::<f64>()?;
    Ok((d / r).sqrt())
}

/// Median wall times in milliseconds of `a` and `b`, run in turn `reps` times each after one warm-up
/// (interleaved, so load from other work on the machine falls on both alike), synchronising the device.
pub fn time_pair(
    dev: &Device,
    reps: usize,
    mut a: impl FnMut() -> Result<Tensor>,
    mut b: impl FnMut() -> Result<Tensor>,
) -> Result<(f64, f64)> {
    let run = |f: &mut dyn FnMut() -> Result<Tensor>| -> Result<f64> {
        dev.synchronize()?;
        let t = Instant::now();
        f()?;
        dev.synchronize()?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    };
    run(&mut a)?;
    run(&mut b)?;
    let (mut ta, mut tb) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for _ in 0..reps {
        ta.push(run(&mut a)?);
        tb.push(run(&mut b)?);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok((median(ta), median(tb)))
}
