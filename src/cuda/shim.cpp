// C ABI for the Rust side over what tch does not reach: at::cuda::CUDAGraph (src/cuda/graph.rs),
// torch generators of our own (src/cuda/generator.rs), at::_foreach_norm (src/cuda/norms.rs), the
// caching allocator's peak memory (src/cuda/memory.rs), and
// loading and launching our NVRTC-compiled kernels on torch's stream (src/cuda/fused/).
//
// Every function returns nullptr on success, or a malloc'd error message that the caller frees
// with tdmpc2_cuda_free_error. No C++ exception crosses this boundary.
//
// Only headers that need no CUDA compiler: not ATen/cuda/CUDAEvent.h or CUDAContext.h, which
// pull cuda_fp16.h and the CCCL headers.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/randperm.h>
#include <ATen/ops/stack.h>
#include <cuda_runtime_api.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace {

char* copy_message(const char* text) {
  size_t n = std::strlen(text);
  char* out = static_cast<char*>(std::malloc(n + 1));
  if (out != nullptr) {
    std::memcpy(out, text, n + 1);
  }
  return out;
}

// Runs body, turning any exception into an error message.
template <typename F>
char* guarded(F&& body) noexcept {
  try {
    body();
    return nullptr;
  } catch (const c10::Error& e) {
    return copy_message(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return copy_message(e.what());
  } catch (...) {
    return copy_message("unknown C++ exception");
  }
}

}  // namespace

// A graph, the side stream it is captured on, and the caller's stream while the side stream is
// current.
struct Tdmpc2CudaGraph {
  c10::DeviceIndex device;
  c10::cuda::CUDAStream side;
  std::optional<c10::cuda::CUDAStream> saved;
  at::cuda::CUDAGraph graph;

  Tdmpc2CudaGraph(c10::DeviceIndex device, c10::cuda::CUDAStream side)
      : device(device), side(side) {}
};

// A torch random generator of its own (not the process's default one), on the CPU or a CUDA
// device.
struct Tdmpc2Generator {
  at::Generator generator;
};

extern "C" {

void tdmpc2_cuda_free_error(char* message) { std::free(message); }

// A generator seeded with `seed`: on CUDA device `device`, or on the CPU when `device` < 0.
char* tdmpc2_generator_new(int64_t device, uint64_t seed, Tdmpc2Generator** out) {
  *out = nullptr;
  return guarded([&] {
    at::Generator generator = device < 0
        ? at::detail::createCPUGenerator(seed)
        : at::cuda::detail::createCUDAGenerator(static_cast<c10::DeviceIndex>(device));
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_current_seed(seed);
    }
    *out = new Tdmpc2Generator{std::move(generator)};
  });
}

void tdmpc2_generator_delete(Tdmpc2Generator* generator) { delete generator; }

// Restarts the generator's stream from `seed`.
char* tdmpc2_generator_reseed(Tdmpc2Generator* generator, uint64_t seed) {
  return guarded([&] {
    std::lock_guard<std::mutex> lock(generator->generator.mutex());
    generator->generator.set_current_seed(seed);
  });
}

// Fills `tensor` in place: kind 0 standard normal, 1 Exp(1), 2 integers uniform in
// [low, high), 3 Bernoulli(p) as 0 or 1.
char* tdmpc2_generator_fill(
    Tdmpc2Generator* generator, at::Tensor* tensor, int32_t kind, double p, int64_t low,
    int64_t high) {
  return guarded([&] {
    const std::optional<at::Generator> g = generator->generator;
    switch (kind) {
      case 0: tensor->normal_(0.0, 1.0, g); break;
      case 1: tensor->exponential_(1.0, g); break;
      case 2: tensor->random_(low, high, g); break;
      case 3: tensor->bernoulli_(p, g); break;
      default: TORCH_CHECK(false, "unknown draw kind ", kind);
    }
  });
}

// A random permutation of 0..n (int64) on the generator's device.
char* tdmpc2_generator_randperm(Tdmpc2Generator* generator, int64_t n, at::Tensor** out) {
  *out = nullptr;
  return guarded([&] {
    auto options = at::TensorOptions().dtype(at::kLong).device(generator->generator.device());
    *out = new at::Tensor(at::randperm(n, generator->generator, options));
  });
}

// The L2 norm of each of `count` tensors, stacked into one tensor: one multi-tensor kernel on
// CUDA (as torch.nn.utils.clip_grad_norm_ takes them there), a norm per tensor on the CPU.
char* tdmpc2_foreach_norms(at::Tensor** tensors, int64_t count, at::Tensor** out) {
  *out = nullptr;
  return guarded([&] {
    std::vector<at::Tensor> list;
    list.reserve(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      list.push_back(*tensors[i]);
    }
    *out = new at::Tensor(at::stack(at::_foreach_norm(list, 2), 0));
  });
}

// torch's fused Adam (no AMSGrad, no weight decay) over `count` tensors and their moments, all
// reading the step counts `steps` (already advanced by the caller, as torch's optimiser does) and
// the rate `lr` (a tensor: a CUDA graph replaying the step sees it change). One kernel on CUDA.
char* tdmpc2_fused_adam(
    at::Tensor** params, at::Tensor** grads, at::Tensor** exp_avgs, at::Tensor** exp_avg_sqs,
    at::Tensor** steps, int64_t count, at::Tensor* lr, double beta1, double beta2, double eps) {
  return guarded([&] {
    auto list = [count](at::Tensor** tensors) {
      std::vector<at::Tensor> out;
      out.reserve(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) {
        out.push_back(*tensors[i]);
      }
      return out;
    };
    at::_fused_adam_(
        list(params), list(grads), list(exp_avgs), list(exp_avg_sqs), {}, list(steps), *lr, beta1,
        beta2, /*weight_decay=*/0.0, eps, /*amsgrad=*/false, /*maximize=*/false);
  });
}

// Visible CUDA devices; 0 without a driver or a device (never an error).
char* tdmpc2_cuda_device_count(int64_t* out) {
  return guarded([&] { *out = c10::cuda::device_count(); });
}

char* tdmpc2_cuda_synchronize(int64_t device) {
  return guarded([&] {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    c10::cuda::device_synchronize();
  });
}

// The caching allocator's peak bytes on `device` (allocated by tensors, reserved from the
// driver) since the last reset; with `reset`, the cached free blocks go back to the driver and a
// new peak starts, so that it counts only what is reserved from then on.
char* tdmpc2_cuda_memory_peak(int64_t device, int64_t* allocated, int64_t* reserved, int32_t reset) {
  return guarded([&] {
    auto index = static_cast<c10::DeviceIndex>(device);
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
    auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    *allocated = stats.allocated_bytes[aggregate].peak;
    *reserved = stats.reserved_bytes[aggregate].peak;
    if (reset != 0) {
      c10::cuda::CUDAGuard guard(index);
      c10::cuda::device_synchronize();
      c10::cuda::CUDACachingAllocator::emptyCache();
      c10::cuda::CUDACachingAllocator::resetPeakStats(index);
    }
  });
}

// A memory pool id that several captures can share.
char* tdmpc2_cuda_graph_pool_handle(uint64_t* first, uint64_t* second) {
  return guarded([&] {
    auto id = at::cuda::graph_pool_handle();
    *first = id.first;
    *second = id.second;
  });
}

char* tdmpc2_cuda_graph_new(int64_t device, Tdmpc2CudaGraph** out) {
  *out = nullptr;
  return guarded([&] {
    auto index = static_cast<c10::DeviceIndex>(device);
    c10::cuda::CUDAGuard guard(index);
    *out = new Tdmpc2CudaGraph(index, c10::cuda::getStreamFromPool(false, index));
  });
}

void tdmpc2_cuda_graph_delete(Tdmpc2CudaGraph* graph) {
  if (graph == nullptr) {
    return;
  }
  char* error = guarded([&] {
    if (graph->saved) {
      c10::cuda::setCurrentCUDAStream(*graph->saved);
    }
    c10::cuda::CUDAGuard guard(graph->device);
    // A replay still running holds the graph's memory: wait for it before freeing.
    c10::cuda::device_synchronize();
    delete graph;
  });
  std::free(error);
}

// Waits for all work on the device, then makes the side stream current for this thread.
char* tdmpc2_cuda_graph_enter_side_stream(Tdmpc2CudaGraph* graph) {
  return guarded([&] {
    TORCH_CHECK(!graph->saved, "the side stream is already current");
    c10::cuda::CUDAGuard guard(graph->device);
    c10::cuda::device_synchronize();
    graph->saved = c10::cuda::getCurrentCUDAStream(graph->device);
    c10::cuda::setCurrentCUDAStream(graph->side);
  });
}

// Waits for the side stream's work (warm-up), then restores the caller's stream.
char* tdmpc2_cuda_graph_leave_side_stream(Tdmpc2CudaGraph* graph) {
  return guarded([&] {
    if (!graph->saved) {
      return;
    }
    c10::cuda::setCurrentCUDAStream(*graph->saved);
    graph->saved.reset();
    graph->side.synchronize();
  });
}

// Starts capturing on the side stream (which must be current) into the given pool; {0, 0} asks
// for a private pool.
char* tdmpc2_cuda_graph_capture_begin(
    Tdmpc2CudaGraph* graph, uint64_t pool_first, uint64_t pool_second) {
  return guarded([&] {
    TORCH_CHECK(graph->saved, "capture_begin needs the side stream to be current");
    c10::cuda::CUDAGuard guard(graph->device);
    c10::cuda::device_synchronize();
    // Thread-local: another thread (a pipelined actor) that synchronises meanwhile does not
    // invalidate this capture, and its own work is not captured.
    graph->graph.capture_begin({pool_first, pool_second}, cudaStreamCaptureModeThreadLocal);
  });
}

char* tdmpc2_cuda_graph_capture_end(Tdmpc2CudaGraph* graph) {
  return guarded([&] {
    c10::cuda::CUDAGuard guard(graph->device);
    graph->graph.capture_end();
  });
}

// Makes the graph's replays advance `generator` as they advance the default generator: its
// draws are new on every replay. Before capture_begin.
char* tdmpc2_cuda_graph_register_generator(Tdmpc2CudaGraph* graph, Tdmpc2Generator* generator) {
  return guarded([&] { graph->graph.register_generator_state(generator->generator); });
}

// Launches the graph on the caller's current stream of the graph's device.
char* tdmpc2_cuda_graph_replay(Tdmpc2CudaGraph* graph) {
  return guarded([&] { graph->graph.replay(); });
}

// The compute capability of `device`, which NVRTC compiles for.
char* tdmpc2_cuda_device_arch(int64_t device, int32_t* major, int32_t* minor) {
  return guarded([&] {
    int value = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(
        &value, cudaDevAttrComputeCapabilityMajor, static_cast<int>(device)));
    *major = value;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(
        &value, cudaDevAttrComputeCapabilityMinor, static_cast<int>(device)));
    *minor = value;
  });
}

// Loads a compiled image (cubin) for `device`; its kernels stay loaded for the process's life.
char* tdmpc2_cuda_library_load(int64_t device, const void* image, void** library) {
  *library = nullptr;
  return guarded([&] {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    cudaLibrary_t loaded = nullptr;
    C10_CUDA_CHECK(
        cudaLibraryLoadData(&loaded, image, nullptr, nullptr, 0, nullptr, nullptr, 0));
    *library = loaded;
  });
}

char* tdmpc2_cuda_library_kernel(void* library, const char* name, void** kernel) {
  *kernel = nullptr;
  return guarded([&] {
    cudaKernel_t found = nullptr;
    C10_CUDA_CHECK(cudaLibraryGetKernel(&found, static_cast<cudaLibrary_t>(library), name));
    *kernel = found;
  });
}

// Launches `kernel` on the current torch stream of `device`, so that a graph being captured on
// that stream records it. `args` points at each argument's value, in order.
char* tdmpc2_cuda_launch(
    int64_t device, void* kernel, const uint32_t* grid, const uint32_t* block,
    uint32_t shared_bytes, void** args) {
  return guarded([&] {
    auto index = static_cast<c10::DeviceIndex>(device);
    c10::cuda::CUDAGuard guard(index);
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(index).stream();
    C10_CUDA_CHECK(cudaLaunchKernel(
        static_cast<const void*>(kernel), dim3(grid[0], grid[1], grid[2]),
        dim3(block[0], block[1], block[2]), args, shared_bytes, stream));
  });
}

}  // extern "C"
