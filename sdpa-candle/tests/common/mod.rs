//! Host buffers to candle tensors and back, shared by the test files (each `mod common;` includes it).

use candle_core::{Device, Tensor};
use sdpa_core::{DType, HostBuffer};

/// A host buffer as a tensor of `dims` on `dev` (built on the CPU, then moved).
pub fn to_tensor(buf: &HostBuffer, dims: &[usize], dev: &Device) -> Tensor {
    let cpu = Device::Cpu;
    match buf {
        HostBuffer::F32(v) => Tensor::from_vec(v.clone(), dims, &cpu),
        HostBuffer::F16(v) => Tensor::from_vec(v.clone(), dims, &cpu),
        HostBuffer::BF16(v) => Tensor::from_vec(v.clone(), dims, &cpu),
        // E4M3 codes through their exact values (candle's E4M3 conversion keeps them: tests/fp8.rs).
        HostBuffer::F8E4M3(_) => {
            Tensor::from_vec(buf.to_f32_vec(), dims, &cpu).and_then(|t| t.to_dtype(candle_core::DType::F8E4M3))
        }
    }
    .unwrap()
    .to_device(dev)
    .unwrap()
}

/// A tensor's elements, in order, as a host buffer of `dtype` (copied to the CPU first when elsewhere).
pub fn to_host(t: &Tensor, dtype: DType) -> HostBuffer {
    let flat = t.to_device(&Device::Cpu).unwrap().flatten_all().unwrap();
    match dtype {
        DType::F32 => HostBuffer::F32(flat.to_vec1().unwrap()),
        DType::F16 => HostBuffer::F16(flat.to_vec1().unwrap()),
        DType::BF16 => HostBuffer::BF16(flat.to_vec1().unwrap()),
        DType::F8E4M3 => {
            let vals: Vec<f32> = flat.to_dtype(candle_core::DType::F32).unwrap().to_vec1().unwrap();
            HostBuffer::from_f32(DType::F8E4M3, &vals)
        }
    }
}

pub mod grad;
