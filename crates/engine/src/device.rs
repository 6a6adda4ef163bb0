//! Device selection: CPU always; Metal or CUDA when the engine is built with the matching
//! cargo feature and the hardware answers. The model code never assumes CPU.

use candle_core::{DType, Device};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};

/// Which device the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceChoice {
    /// The best available: CUDA, then Metal, then CPU.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// An Apple GPU (feature `metal`).
    Metal,
    /// An NVIDIA GPU by ordinal (feature `cuda`).
    Cuda(usize),
}

/// Opens the requested device; `Auto` falls back to CPU silently.
pub fn select_device(choice: DeviceChoice) -> Result<Device> {
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Metal => Device::new_metal(0)
            .map_err(|e| EngineError::invalid(format!("Metal unavailable: {e}"))),
        DeviceChoice::Cuda(i) => Device::new_cuda(i)
            .map_err(|e| EngineError::invalid(format!("CUDA device {i} unavailable: {e}"))),
        DeviceChoice::Auto => {
            if candle_core::utils::cuda_is_available() {
                if let Ok(d) = Device::new_cuda(0) {
                    return Ok(d);
                }
            }
            if candle_core::utils::metal_is_available() {
                if let Ok(d) = Device::new_metal(0) {
                    return Ok(d);
                }
            }
            Ok(Device::Cpu)
        }
    }
}

/// The activation dtype that suits a device: f32 on CPU (its fast kernels), bf16 on CUDA,
/// f16 on Metal.
pub fn preferred_dtype(device: &Device) -> DType {
    match device {
        Device::Cpu => DType::F32,
        Device::Cuda(_) => DType::BF16,
        Device::Metal(_) => DType::F16,
    }
}

impl crate::checkpoint::LoadOptions {
    /// The device `choice` opens, with the dtype ([`preferred_dtype`]) and held weights
    /// ([`WeightsChoice::default_for`]) that suit it.
    pub fn on(choice: DeviceChoice) -> Result<Self> {
        let device = select_device(choice)?;
        Ok(Self {
            dtype: preferred_dtype(&device),
            weights: crate::checkpoint::weights::WeightsChoice::default_for(&device),
            device,
        })
    }
}
