//! A torch random generator of its own, on the CPU or a CUDA device (through the shim of
//! src/cuda/shim.cpp, since tch reaches only torch's default generators): a thread that
//! draws concurrently with another (the pipelined actor beside the learner) keeps its draws
//! reproducible, and on CUDA draws on the device; a CUDA graph that registers it advances it on
//! every replay.
use std::sync::{Arc, Mutex};

use tch::{Device, Tensor};

use super::graph::GraphError;

/// A generator shared between its user and the graphs that must register it.
pub type SharedGenerator = Arc<Mutex<Generator>>;

/// What [`Generator::fill`] draws.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Draw {
    /// Standard normal.
    Normal,
    /// Exp(1).
    Exponential,
    /// Integers uniform in `low..high`.
    Integers { low: i64, high: i64 },
    /// 1 with probability `p`, else 0.
    Bernoulli { p: f64 },
}

pub struct Generator {
    raw: imp::RawGenerator,
    device: Device,
}

impl std::fmt::Debug for Generator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generator")
            .field("device", &self.device)
            .finish()
    }
}

impl Generator {
    /// A generator on `device` whose stream starts from `seed`.
    pub fn new(device: Device, seed: u64) -> Result<Generator, GraphError> {
        let index = match device {
            Device::Cpu => -1,
            Device::Cuda(index) => index as i64,
            other => return Err(GraphError::NotCuda(other)),
        };
        Ok(Generator {
            raw: imp::RawGenerator::new(index, seed)?,
            device,
        })
    }

    /// Shared with the graphs that draw from it.
    pub fn shared(self) -> SharedGenerator {
        Arc::new(Mutex::new(self))
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// Restarts the stream from `seed`.
    pub fn reseed(&mut self, seed: u64) -> Result<(), GraphError> {
        self.raw.reseed(seed)
    }

    /// Overwrites `tensor` (on the generator's device) with draws.
    pub fn fill(&mut self, tensor: &mut Tensor, draw: Draw) -> Result<(), GraphError> {
        if tensor.device() != self.device {
            return Err(GraphError::Cuda {
                op: "draw",
                message: format!(
                    "a tensor on {:?} from a generator on {:?}",
                    tensor.device(),
                    self.device
                ),
            });
        }
        self.raw.fill(tensor, draw)
    }

    /// A random permutation of `0..n` (int64) on the generator's device.
    pub fn randperm(&mut self, n: i64) -> Result<Tensor, GraphError> {
        self.raw.randperm(n)
    }

    /// The shim's handle, for a graph to register.
    pub(super) fn raw(&self) -> *mut std::ffi::c_void {
        self.raw.as_ptr()
    }
}

#[cfg(tdmpc2_cuda_graphs)]
mod imp {
    use std::ffi::{c_char, c_void};
    use std::ptr::NonNull;

    use tch::Tensor;

    use super::Draw;
    use crate::cuda::graph::imp::{check, new_tensor};
    use crate::cuda::GraphError;

    extern "C" {
        fn tdmpc2_generator_new(device: i64, seed: u64, out: *mut *mut c_void) -> *mut c_char;
        fn tdmpc2_generator_delete(generator: *mut c_void);
        fn tdmpc2_generator_reseed(generator: *mut c_void, seed: u64) -> *mut c_char;
        fn tdmpc2_generator_fill(
            generator: *mut c_void,
            tensor: *mut c_void,
            kind: i32,
            p: f64,
            low: i64,
            high: i64,
        ) -> *mut c_char;
        fn tdmpc2_generator_randperm(
            generator: *mut c_void,
            n: i64,
            out: *mut *mut c_void,
        ) -> *mut c_char;
    }

    pub struct RawGenerator(NonNull<c_void>);

    // SAFETY: torch's generators may be used from any thread; `&mut self` (or the mutex of a
    // shared generator) keeps their use to one thread at a time.
    unsafe impl Send for RawGenerator {}

    impl RawGenerator {
        pub fn new(device: i64, seed: u64) -> Result<RawGenerator, GraphError> {
            let mut raw = std::ptr::null_mut();
            check("generator", unsafe {
                tdmpc2_generator_new(device, seed, &mut raw)
            })?;
            NonNull::new(raw)
                .map(RawGenerator)
                .ok_or_else(|| GraphError::Cuda {
                    op: "generator",
                    message: "the shim returned no generator".into(),
                })
        }

        pub fn as_ptr(&self) -> *mut c_void {
            self.0.as_ptr()
        }

        pub fn reseed(&mut self, seed: u64) -> Result<(), GraphError> {
            check("reseed", unsafe {
                tdmpc2_generator_reseed(self.as_ptr(), seed)
            })
        }

        pub fn fill(&mut self, tensor: &mut Tensor, draw: Draw) -> Result<(), GraphError> {
            let (kind, p, low, high) = match draw {
                Draw::Normal => (0, 0.0, 0, 0),
                Draw::Exponential => (1, 0.0, 0, 0),
                Draw::Integers { low, high } => (2, 0.0, low, high),
                Draw::Bernoulli { p } => (3, p, 0, 0),
            };
            // SAFETY: tch's tensor handle is a pointer to the at::Tensor the shim expects.
            let tensor = tensor.as_mut_ptr() as *mut c_void;
            check("draw", unsafe {
                tdmpc2_generator_fill(self.as_ptr(), tensor, kind, p, low, high)
            })
        }

        pub fn randperm(&mut self, n: i64) -> Result<Tensor, GraphError> {
            new_tensor("randperm", |out| unsafe {
                tdmpc2_generator_randperm(self.as_ptr(), n, out)
            })
        }
    }

    impl Drop for RawGenerator {
        fn drop(&mut self) {
            unsafe { tdmpc2_generator_delete(self.as_ptr()) }
        }
    }
}

#[cfg(not(tdmpc2_cuda_graphs))]
mod imp {
    use std::ffi::c_void;

    use tch::Tensor;

    use super::Draw;
    use crate::cuda::graph::imp::not_built;
    use crate::cuda::GraphError;

    /// Never constructed: without the shim there is no generator of our own.
    pub struct RawGenerator(());

    impl RawGenerator {
        pub fn new(_device: i64, _seed: u64) -> Result<RawGenerator, GraphError> {
            Err(not_built())
        }

        pub fn as_ptr(&self) -> *mut c_void {
            std::ptr::null_mut()
        }

        pub fn reseed(&mut self, _seed: u64) -> Result<(), GraphError> {
            Err(not_built())
        }

        pub fn fill(&mut self, _tensor: &mut Tensor, _draw: Draw) -> Result<(), GraphError> {
            Err(not_built())
        }

        pub fn randperm(&mut self, _n: i64) -> Result<Tensor, GraphError> {
            Err(not_built())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    fn cpu_generator(seed: u64) -> Generator {
        Generator::new(Device::Cpu, seed).expect("a CPU generator of our own")
    }

    fn draw(generator: &mut Generator, draw: Draw) -> Tensor {
        let mut t = Tensor::zeros([20_000], (Kind::Float, Device::Cpu));
        generator.fill(&mut t, draw).unwrap();
        t
    }

    /// Same seed, same stream; reseeding restarts it; each kind of draw has its law. (Whether
    /// the process's default generator is left as it was cannot be seen here: other tests
    /// draw from it at the same time.)
    #[test]
    #[cfg_attr(
        not(tdmpc2_cuda_graphs),
        ignore = "this build has no C++ shim (a CPU-only torch wheel)"
    )]
    fn a_generator_of_its_own_is_reproducible_and_draws_each_law() {
        let mut a = cpu_generator(5);
        let mut b = cpu_generator(5);
        let normal = draw(&mut a, Draw::Normal);
        assert!(normal.equal(&draw(&mut b, Draw::Normal)));
        let mean = normal.mean(Kind::Float).double_value(&[]);
        let std = normal.std(true).double_value(&[]);
        assert!(
            mean.abs() < 0.05 && (std - 1.0).abs() < 0.05,
            "{mean} {std}"
        );
        let exponential = draw(&mut a, Draw::Exponential);
        assert!(exponential.min().double_value(&[]) >= 0.0);
        assert!((exponential.mean(Kind::Float).double_value(&[]) - 1.0).abs() < 0.05);
        let integers = draw(&mut a, Draw::Integers { low: 0, high: 9 });
        assert_eq!(integers.min().double_value(&[]), 0.0);
        assert_eq!(integers.max().double_value(&[]), 8.0);
        let coins = draw(&mut a, Draw::Bernoulli { p: 0.25 });
        assert!((coins.mean(Kind::Float).double_value(&[]) - 0.25).abs() < 0.02);
        let mut perm = Vec::<i64>::try_from(a.randperm(7).unwrap()).unwrap();
        perm.sort();
        assert_eq!(perm, (0..7).collect::<Vec<_>>());

        a.reseed(5).unwrap();
        let mut fresh = cpu_generator(5);
        assert!(draw(&mut a, Draw::Normal).equal(&draw(&mut fresh, Draw::Normal)));
        assert!(
            !draw(&mut a, Draw::Normal).equal(&normal),
            "the stream goes on"
        );
    }

    #[test]
    #[cfg_attr(
        not(tdmpc2_cuda_graphs),
        ignore = "this build has no C++ shim (a CPU-only torch wheel)"
    )]
    fn a_tensor_elsewhere_is_refused() {
        let mut generator = cpu_generator(1);
        if tch::Cuda::is_available() {
            let mut t = Tensor::zeros([2], (Kind::Float, Device::Cuda(0)));
            assert!(generator.fill(&mut t, Draw::Normal).is_err());
        }
        assert!(matches!(
            Generator::new(Device::Mps, 1),
            Err(GraphError::NotCuda(Device::Mps))
        ));
    }
}
