//! A CUDA stream of its own (from torch's pool), for work that should not queue behind the
//! default stream's: the pipelined actor's plans beside the learner's updates.
use tch::Device;

use super::graph::GraphError;

pub struct Stream {
    raw: imp::RawStream,
    device: Device,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("device", &self.device)
            .finish()
    }
}

impl Stream {
    /// A stream on `device` (CUDA only).
    pub fn new(device: Device) -> Result<Stream, GraphError> {
        let Device::Cuda(index) = device else {
            return Err(GraphError::NotCuda(device));
        };
        Ok(Stream {
            raw: imp::RawStream::new(index as i64)?,
            device,
        })
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// Makes this the calling thread's current stream of its device: the thread's torch calls
    /// queue there from now on.
    pub fn make_current(&self) -> Result<(), GraphError> {
        self.raw.make_current()
    }

    /// Blocks until the work queued on this stream is done.
    pub fn synchronize(&self) -> Result<(), GraphError> {
        self.raw.synchronize()
    }

    /// Makes this stream wait, without blocking the host, for the work queued so far on the
    /// device's default stream (what other threads wrote that this stream will read).
    pub fn wait_for_default(&self) -> Result<(), GraphError> {
        self.raw.wait_for_default()
    }
}

#[cfg(tdmpc2_cuda_graphs)]
mod imp {
    use std::ffi::{c_char, c_void};
    use std::ptr::NonNull;

    use crate::cuda::graph::imp::check;
    use crate::cuda::GraphError;

    extern "C" {
        fn tdmpc2_cuda_stream_new(device: i64, out: *mut *mut c_void) -> *mut c_char;
        fn tdmpc2_cuda_stream_delete(stream: *mut c_void);
        fn tdmpc2_cuda_stream_make_current(stream: *mut c_void) -> *mut c_char;
        fn tdmpc2_cuda_stream_wait_for_default(stream: *mut c_void) -> *mut c_char;
        fn tdmpc2_cuda_stream_synchronize(stream: *mut c_void) -> *mut c_char;
    }

    pub struct RawStream(NonNull<c_void>);

    // SAFETY: a stream handle names a CUDA stream, which any thread may use; the shim's calls
    // on it only read it.
    unsafe impl Send for RawStream {}
    unsafe impl Sync for RawStream {}

    impl RawStream {
        pub fn new(device: i64) -> Result<RawStream, GraphError> {
            let mut raw = std::ptr::null_mut();
            check("stream", unsafe {
                tdmpc2_cuda_stream_new(device, &mut raw)
            })?;
            NonNull::new(raw)
                .map(RawStream)
                .ok_or_else(|| GraphError::Cuda {
                    op: "stream",
                    message: "the shim returned no stream".into(),
                })
        }

        pub fn make_current(&self) -> Result<(), GraphError> {
            check("make stream current", unsafe {
                tdmpc2_cuda_stream_make_current(self.0.as_ptr())
            })
        }

        pub fn wait_for_default(&self) -> Result<(), GraphError> {
            check("stream wait", unsafe {
                tdmpc2_cuda_stream_wait_for_default(self.0.as_ptr())
            })
        }

        pub fn synchronize(&self) -> Result<(), GraphError> {
            check("stream synchronize", unsafe {
                tdmpc2_cuda_stream_synchronize(self.0.as_ptr())
            })
        }
    }

    impl Drop for RawStream {
        fn drop(&mut self) {
            unsafe { tdmpc2_cuda_stream_delete(self.0.as_ptr()) }
        }
    }
}

#[cfg(not(tdmpc2_cuda_graphs))]
mod imp {
    use crate::cuda::graph::imp::not_built;
    use crate::cuda::GraphError;

    /// Never constructed: without the shim there is no stream of our own.
    pub struct RawStream(());

    impl RawStream {
        pub fn new(_device: i64) -> Result<RawStream, GraphError> {
            Err(not_built())
        }

        pub fn make_current(&self) -> Result<(), GraphError> {
            Err(not_built())
        }

        pub fn wait_for_default(&self) -> Result<(), GraphError> {
            Err(not_built())
        }

        pub fn synchronize(&self) -> Result<(), GraphError> {
            Err(not_built())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_cuda_only() {
        assert!(matches!(
            Stream::new(Device::Cpu),
            Err(GraphError::NotCuda(Device::Cpu))
        ));
    }
}
