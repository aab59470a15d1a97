//! The CUDA caching allocator's peak memory on a device (torch's `max_memory_allocated` and
//! `max_memory_reserved`), through the shim: tch has no binding for it.
use tch::Device;

use super::GraphError;

/// Bytes at their highest since the last reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPeak {
    /// Held by tensors.
    pub allocated: u64,
    /// Held by the allocator from the driver (allocated, and cached for reuse).
    pub reserved: u64,
}

/// The peak on `device` since the last reset; with `reset`, the allocator's cached free blocks
/// are released and a new peak starts from now.
pub fn memory_peak(device: Device, reset: bool) -> Result<MemoryPeak, GraphError> {
    let Device::Cuda(index) = device else {
        return Err(GraphError::NotCuda(device));
    };
    imp::memory_peak(index as i64, reset)
}

#[cfg(tdmpc2_cuda_graphs)]
mod imp {
    use std::ffi::c_char;

    use super::MemoryPeak;
    use crate::cuda::graph::imp::check;
    use crate::cuda::GraphError;

    extern "C" {
        fn tdmpc2_cuda_memory_peak(
            device: i64,
            allocated: *mut i64,
            reserved: *mut i64,
            reset: i32,
        ) -> *mut c_char;
    }

    pub fn memory_peak(device: i64, reset: bool) -> Result<MemoryPeak, GraphError> {
        let (mut allocated, mut reserved) = (0i64, 0i64);
        check("memory peak", unsafe {
            tdmpc2_cuda_memory_peak(device, &mut allocated, &mut reserved, reset as i32)
        })?;
        Ok(MemoryPeak {
            allocated: allocated.max(0) as u64,
            reserved: reserved.max(0) as u64,
        })
    }
}

#[cfg(not(tdmpc2_cuda_graphs))]
mod imp {
    use super::MemoryPeak;
    use crate::cuda::graph::imp::not_built;
    use crate::cuda::GraphError;

    pub fn memory_peak(_device: i64, _reset: bool) -> Result<MemoryPeak, GraphError> {
        Err(not_built())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_has_no_cuda_memory_peak() {
        let err = memory_peak(Device::Cpu, false).unwrap_err();
        assert!(matches!(err, GraphError::NotCuda(Device::Cpu)), "{err}");
    }
}
