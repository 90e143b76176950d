//! The CUDA half (feature `cuda`, run on a GPU machine): `sdpa` on candle CUDA tensors against the f64
//! reference, every mask kind, GQA, both dims orders, transposed and narrowed views, each dtype; and the
//! same call on the CPU and the GPU agreeing. CI builds the default (CPU) features only, so this file is
//! compiled where the feature is on, and there a missing GPU is a failure, not a skip.
#![cfg(feature = "cuda")]
// Helpers of a test panic on failure: that is how a test fails.
#![allow(clippy::unwrap_used)]

use candle_core::{DType as CDType, Device, Tensor};
use sdpa_candle::{sdpa, Layout, SdpaMask, SdpaOptions};
use sdpa_core::check::check_output;
use sdpa_core::{
    AttentionSpec, DType, ExplicitMask, F32Math, HostBuffer, HostInputs, HostOutput, Mask, MaskValues, Shape,
};

fn gpu() -> Device {
    Device::new_cuda(0).expect("tests/cuda.rs needs CUDA device 0")
}

fn to_tensor(buf: &HostBuffer, dims: &[usize], dev: &Device) -> Tensor {
    let cpu = Device::Cpu;
    match buf {
        HostBuffer::F32(v) => Tensor::from_vec(v.clone(), dims, &cpu),
        HostBuffer::F16(v) => Tensor::from_vec(v.clone(), dims, &cpu),
        HostBuffer::BF16(v) => Tensor::from_vec(v.clone(), dims, &cpu),
    }
    .unwrap()
    .to_device(dev)
    .unwrap()
}

fn to_host(t: &Tensor, dtype: DType) -> HostBuffer {
    let flat = t.to_device(&Device::Cpu).unwrap().flatten_all().unwrap();
    match dtype {
        DType::F32 => HostBuffer::F32(flat.to_vec1().unwrap()),
        DType::F16 => HostBuffer::F16(flat.to_vec1().unwrap()),
        DType::BF16 => HostBuffer::BF16(flat.to_vec1().unwrap()),
    }
}

fn dims(layout: Layout, b: usize, h: usize, s: usize, d: usize) -> [usize; 4] {
    match layout {
        Layout::Bhsd => [b, h, s, d],
        Layout::Bshd => [b, s, h, d],
    }
}

/// Contiguous values presented as a transposed view (stored in the other order, on the GPU).
fn transposed(t: &Tensor) -> Tensor {
    t.transpose(1, 2).unwrap().contiguous().unwrap().transpose(1, 2).unwrap()
}

/// Cut out of a larger GPU tensor along the heads dim: a non-zero start offset.
fn narrowed(t: &Tensor, layout: Layout) -> Tensor {
    let hd = if layout == Layout::Bhsd { 1 } else { 2 };
    let mut pad = t.dims().to_vec();
    pad[hd] = 2;
    let pad = Tensor::ones(pad, t.dtype(), t.device()).unwrap();
    Tensor::cat(&[&pad, t, &pad], hd).unwrap().narrow(hd, 2, t.dim(hd).unwrap()).unwrap()
}

#[test]
fn every_mask_layout_view_and_dtype_matches_the_reference_on_the_gpu() {
    let dev = gpu();
    let s = Shape { b: 2, hq: 8, hkv: 2, sq: 77, sk: 130, d: 64, dv: 64 };
    let mut seed = 0;
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for layout in [Layout::Bhsd, Layout::Bshd] {
            for view in 0..3 {
                for mask in ["none", "causal", "causal-br", "keep", "additive"] {
                    seed += 1;
                    let m = match mask {
                        "none" => Mask::None,
                        "causal" => Mask::CausalTopLeft,
                        "causal-br" => Mask::CausalBottomRight,
                        "keep" => {
                            Mask::Explicit(ExplicitMask { values: MaskValues::Boolean, dims: [s.b, 1, s.sq, s.sk] })
                        }
                        _ => Mask::Explicit(ExplicitMask { values: MaskValues::Additive, dims: [1, s.hq, s.sq, s.sk] }),
                    };
                    let spec = AttentionSpec::new(s, dtype).with_layout(layout).with_mask(m);
                    let inputs = HostInputs::random(&spec, seed).unwrap();
                    let present = |t: Tensor| match view {
                        0 => t,
                        1 => transposed(&t),
                        _ => narrowed(&t, layout),
                    };
                    let q = present(to_tensor(&inputs.q, &dims(layout, s.b, s.hq, s.sq, s.d), &dev));
                    let k = present(to_tensor(&inputs.k, &dims(layout, s.b, s.hkv, s.sk, s.d), &dev));
                    let v = present(to_tensor(&inputs.v, &dims(layout, s.b, s.hkv, s.sk, s.dv), &dev));
                    let sdpa_mask = match (&spec.mask, &inputs.mask) {
                        (Mask::Explicit(e), Some(add)) if e.values == MaskValues::Boolean => {
                            let bits: Vec<u8> = add.iter().map(|&x| u8::from(x == 0.0)).collect();
                            let t = Tensor::from_vec(bits, e.dims.to_vec(), &Device::Cpu).unwrap();
                            SdpaMask::Keep(t.to_device(&dev).unwrap())
                        }
                        (Mask::Explicit(e), Some(add)) => {
                            let t = Tensor::from_vec(add.clone(), e.dims.to_vec(), &Device::Cpu).unwrap();
                            SdpaMask::Additive(t.to_device(&dev).unwrap())
                        }
                        (Mask::CausalTopLeft, _) => SdpaMask::CausalTopLeft,
                        (Mask::CausalBottomRight, _) => SdpaMask::CausalBottomRight,
                        _ => SdpaMask::None,
                    };
                    let opts = SdpaOptions { layout, mask: sdpa_mask, ..Default::default() };
                    let o = sdpa(&q, &k, &v, &opts)
                        .unwrap_or_else(|e| panic!("{dtype} {layout:?} view {view} {mask}: {e}"));
                    assert!(o.device().is_cuda());
                    assert_eq!(o.dims(), &dims(layout, s.b, s.hq, s.sq, s.dv));
                    let got = HostOutput { o: to_host(&o, dtype), lse: None };
                    let rep = check_output(&spec, &inputs, &got, F32Math::Exact, None).unwrap();
                    assert!(rep.pass, "{dtype} {layout:?} view {view} {mask}: {rep:?}");

                    // The same call on the CPU gives the same numbers within the dtype's tolerance.
                    let cpu = |t: &Tensor| t.to_device(&Device::Cpu).unwrap();
                    let cpu_opts = SdpaOptions {
                        mask: match &opts.mask {
                            SdpaMask::Keep(t) => SdpaMask::Keep(cpu(t)),
                            SdpaMask::Additive(t) => SdpaMask::Additive(cpu(t)),
                            other => other.clone(),
                        },
                        ..opts.clone()
                    };
                    let o_cpu = sdpa(&cpu(&q), &cpu(&k), &cpu(&v), &cpu_opts).unwrap();
                    let diff = (o.to_device(&Device::Cpu).unwrap().to_dtype(CDType::F64).unwrap()
                        - o_cpu.to_dtype(CDType::F64).unwrap())
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f64>()
                    .unwrap();
                    assert!(diff < 0.1, "{dtype} {layout:?} view {view} {mask}: CPU and GPU differ by {diff}");
                }
            }
        }
    }
}

#[test]
fn a_gpu_mask_on_the_wrong_device_is_an_error() {
    let dev = gpu();
    let q = Tensor::randn(0f32, 1.0, (1, 2, 4, 8), &dev).unwrap();
    let m = Tensor::zeros((4, 4), CDType::F32, &Device::Cpu).unwrap();
    let err = sdpa(&q, &q, &q, &SdpaOptions::bhsd().with_mask(SdpaMask::Additive(m))).unwrap_err().to_string();
    assert!(err.contains("device"), "{err}");
    let cpu_k = Tensor::randn(0f32, 1.0, (1, 2, 4, 8), &Device::Cpu).unwrap();
    assert!(sdpa(&q, &cpu_k, &cpu_k, &SdpaOptions::bhsd()).is_err());
}
