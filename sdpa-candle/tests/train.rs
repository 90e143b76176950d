//! A tiny run of example 04's training (its model and task, compiled in from `examples/lm`): a few AdamW
//! steps with candle's attention and with `sdpa` from one seed give the same losses, and the loss falls.
//! The example itself (a few hundred steps, a long-sequence measurement) is for a machine with time.

// Helpers of a test panic on failure: that is how a test fails.
#![allow(clippy::unwrap_used)]

#[allow(dead_code)] // the example's measurement helpers are not needed here
#[path = "../examples/lm/mod.rs"]
mod lm;

use candle_core::{DType, Device};
use lm::{Attention, Config, Run, Task};

#[test]
fn a_tiny_model_trains_the_same_through_sdpa_and_through_candles_attention() {
    let dev = Device::Cpu;
    let cfg = Config { vocab: 256, d_model: 32, heads: 2, layers: 2, ffn: 64, max_seq: 24 };
    let task = Task { batch: 4, seq: 24, period: 6, alphabet: 8 };
    let losses = |attention| {
        let run = Run::new(attention, cfg.max_seq, DType::F32, &dev).unwrap();
        lm::train(cfg, &task, 24, 12, 1e-2, &run, &dev).unwrap()
    };
    let (theirs, ours) = (losses(Attention::Candle), losses(Attention::Sdpa));
    for (step, (a, b)) in theirs.iter().zip(&ours).enumerate() {
        assert!((a - b).abs() <= 1e-4, "step {step}: candle {a}, sdpa {b}");
    }
    assert!(ours[ours.len() - 1] < ours[0] - 1.0, "the loss did not fall: {ours:?}");
}
