//! What the CPU benchmarks compare, shared by the criterion bench and the interleaved recorder: the
//! shapes of the CPU issue and three ways to run attention on the same candle tensors.

#![allow(dead_code)]

use candle_core::{DType, Device, Result, Tensor};
use candle_nn::attention::{flash_attn, AttnMask};
use sdpa_candle::{sdpa, SdpaMask, SdpaOptions};
use sdpa_core::{AttentionSpec, HostBuffer, HostInputs, Mask, Shape};

/// B=1 shapes of the CPU issue: (H, S, D).
pub const SHAPES: [(usize, usize, usize); 3] = [(8, 1024, 64), (8, 2048, 64), (16, 4096, 128)];

/// The ways attention runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contender {
    /// `sdpa_candle::sdpa` on BHSD tensors.
    Sdpa,
    /// candle's matmul, scale, (mask add,) softmax_last_dim, matmul: what candle-transformers' models run.
    CandleUnfused,
    /// `candle_nn::attention::flash_attn`, candle's own CPU flash kernel, on BSHD tensors (CPU only).
    CandleFlash,
}

impl Contender {
    pub const ALL: [Contender; 3] = [Contender::Sdpa, Contender::CandleUnfused, Contender::CandleFlash];

    pub fn name(self) -> &'static str {
        match self {
            Contender::Sdpa => "sdpa-candle",
            Contender::CandleUnfused => "candle-unfused",
            Contender::CandleFlash => "candle-flash-attn",
        }
    }
}

/// One benchmark configuration with its inputs in both dims orders and the host copy for checking.
pub struct Bench {
    pub spec: AttentionSpec,
    pub inputs: HostInputs,
    pub causal: bool,
    /// `[B, H, S, D]` contiguous.
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    /// `[B, S, H, D]` contiguous (what candle's flash kernel reads).
    pub q_bshd: Tensor,
    pub k_bshd: Tensor,
    pub v_bshd: Tensor,
    /// Additive causal mask `[S, S]` in the inputs' dtype, for the unfused path.
    pub causal_mask: Option<Tensor>,
    pub threads: usize,
}

fn tensor(buf: &HostBuffer, dims: (usize, usize, usize, usize), dev: &Device) -> Result<Tensor> {
    let cpu = Device::Cpu;
    match buf {
        HostBuffer::F32(v) => Tensor::from_vec(v.clone(), dims, &cpu),
        HostBuffer::F16(v) => Tensor::from_vec(v.clone(), dims, &cpu),
        HostBuffer::BF16(v) => Tensor::from_vec(v.clone(), dims, &cpu),
        // E4M3 codes through their exact values (candle's E4M3 conversion keeps them: tests/fp8.rs).
        HostBuffer::F8E4M3(_) => {
            Tensor::from_vec(buf.to_f32_vec(), dims, &cpu).and_then(|t| t.to_dtype(candle_core::DType::F8E4M3))
        }
    }?
    .to_device(dev)
}

impl Bench {
    /// Inputs for B=1, `h` heads, `s` positions, head dim `d` on `dev`.
    pub fn new(
        h: usize,
        s: usize,
        d: usize,
        dtype: sdpa_core::DType,
        causal: bool,
        threads: usize,
        dev: &Device,
    ) -> Result<Self> {
        let shape = Shape::new(1, h, s, s, d);
        let mask = if causal { Mask::CausalTopLeft } else { Mask::None };
        let spec = AttentionSpec::new(shape, dtype).with_mask(mask);
        let inputs = HostInputs::random(&spec, 42).map_err(candle_core::Error::wrap)?;
        let dims = (1, h, s, d);
        let (q, k, v) = (tensor(&inputs.q, dims, dev)?, tensor(&inputs.k, dims, dev)?, tensor(&inputs.v, dims, dev)?);
        let bshd = |t: &Tensor| t.transpose(1, 2)?.contiguous();
        let causal_mask = if causal {
            let m: Vec<f32> = (0..s * s).map(|x| if x % s > x / s { f32::NEG_INFINITY } else { 0.0 }).collect();
            Some(Tensor::from_vec(m, (s, s), &Device::Cpu)?.to_dtype(q.dtype())?.to_device(dev)?)
        } else {
            None
        };
        Ok(Bench {
            q_bshd: bshd(&q)?,
            k_bshd: bshd(&k)?,
            v_bshd: bshd(&v)?,
            q,
            k,
            v,
            spec,
            inputs,
            causal,
            causal_mask,
            threads,
        })
    }

    /// Runs one contender; the output is `[B, H, S, D]`.
    pub fn run(&self, who: Contender) -> Result<Tensor> {
        let d = self.spec.shape.d;
        let scale = 1.0 / (d as f64).sqrt();
        match who {
            Contender::Sdpa => {
                let mask = if self.causal { SdpaMask::CausalTopLeft } else { SdpaMask::None };
                let opts = SdpaOptions::bhsd().with_mask(mask).with_threads(self.threads);
                sdpa(&self.q, &self.k, &self.v, &opts)
            }
            Contender::CandleUnfused => {
                let att = (self.q.matmul(&self.k.t()?)? * scale)?;
                let att = match &self.causal_mask {
                    Some(m) => att.broadcast_add(m)?,
                    None => att,
                };
                candle_nn::ops::softmax_last_dim(&att)?.matmul(&self.v)
            }
            Contender::CandleFlash => {
                let mask = if self.causal { AttnMask::causal() } else { AttnMask::None };
                let (q, k, v) = (&self.q_bshd, &self.k_bshd, &self.v_bshd);
                match self.q.dtype() {
                    DType::F32 => flash_attn::<f32>(q, k, v, scale as f32, mask, None, None),
                    DType::F16 => flash_attn::<half::f16>(q, k, v, scale as f32, mask, None, None),
                    DType::BF16 => flash_attn::<half::bf16>(q, k, v, scale as f32, mask, None, None),
                    other => candle_core::bail!("no flash_attn for {other:?}"),
                }
            }
        }
    }
}
