// C ABI for the Rust side over what tch does not reach: at::cuda::CUDAGraph (src/cuda/graph.rs),
// torch generators of our own (src/cuda/generator.rs), at::_foreach_norm (src/cuda/norms.rs), the
// caching allocator's peak memory (src/cuda/memory.rs),
// loading and launching our NVRTC-compiled kernels on torch's stream (src/cuda/fused/), and the
// autograd function that joins the LayerNorm kernels and their backward to torch's autograd.
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
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
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
#include <stdexcept>
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

// Launches `kernel` on the current torch stream of `device`, so that a graph being captured on
// that stream records it. `args` points at each argument's value, in order.
void launch_on_torch_stream(
    c10::DeviceIndex device, void* kernel, dim3 grid, dim3 block, uint32_t shared_bytes,
    void** args) {
  c10::cuda::CUDAGuard guard(device);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  C10_CUDA_CHECK(
      cudaLaunchKernel(static_cast<const void*>(kernel), grid, block, args, shared_bytes, stream));
}

// A kernel of the fused kernels' host build (src/cuda/fused/host_cuda.h, which tests load): its
// first field runs it on the CPU and gives null or what went wrong.
struct HostKernel {
  const char* (*launch)(const HostKernel*, uint32_t grid, uint32_t block, uint32_t shared_bytes,
                        void** args);
};

// LayerNorm over the last dim of x [rows, width], an affine per member, then Mish (group 0) or
// SimNorm (softmax within groups of `group`), as one autograd node: on CUDA our row kernels
// forward and backward (src/cuda/fused/layer_norm_act.cu); on the CPU the kernels' host build
// where the kernels are given, else the same formulas as torch operations, so that a CPU test
// holds the formulas and this node's bookkeeping to torch's autograd. Row r takes member (r / member_rows) % members of weight and bias ([members, width],
// or [width] for one).
struct LayerNormActivationSettings {
  void* forward;   // kernels (HostKernel on the CPU), or null for torch's operations
  void* backward;
  uint32_t blocks;  // the kernels' launch: one warp a row
  uint32_t threads;
  double eps;
  int64_t members;
  int64_t member_rows;
  int64_t group;  // 0: Mish
};

// weight or bias ([members, width] or [width]) as one row of parameters per row of x.
at::Tensor per_row(const at::Tensor& p, const LayerNormActivationSettings& s, int64_t rows) {
  const int64_t width = p.size(-1);
  return p.reshape({1, s.members, 1, width})
      .expand({rows / (s.members * s.member_rows), s.members, s.member_rows, width})
      .reshape({rows, width});
}

// x̂, 1/std and z = x̂·weight + bias, as torch operations.
std::tuple<at::Tensor, at::Tensor, at::Tensor> affine_output(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
    const LayerNormActivationSettings& s) {
  const auto centred = x - x.mean(-1, true);
  const auto rstd = ((centred * centred).mean(-1, true) + s.eps).rsqrt();
  const auto xhat = centred * rstd;
  const auto rows = x.size(0);
  return {xhat, rstd, xhat * per_row(weight, s, rows) + per_row(bias, s, rows)};
}

at::Tensor grouped(const at::Tensor& z, int64_t group) {
  return z.view({z.size(0), z.size(1) / group, group});
}

// The activation of z (the CPU's formula).
at::Tensor activation(const at::Tensor& z, int64_t group) {
  if (group == 0) return z * at::tanh(at::log1p(at::exp(z)));
  return at::softmax(grouped(z, group), -1).view(z.sizes());
}

// dx, and each row's dz·x̂ and dz stacked [2, rows, width] (the CPU's formula).
std::pair<at::Tensor, at::Tensor> backward_rows(
    const at::Tensor& x, const at::Tensor& dy, const at::Tensor& weight, const at::Tensor& bias,
    const LayerNormActivationSettings& s) {
  const auto [xhat, rstd, z] = affine_output(x, weight, bias, s);
  at::Tensor dz;
  if (s.group == 0) {
    const auto t = at::tanh(at::log1p(at::exp(z)));
    dz = dy * (t + z * at::sigmoid(z) * (1 - t * t));
  } else {
    const auto y = at::softmax(grouped(z, s.group), -1);
    const auto g = grouped(dy, s.group);
    dz = (y * (g - (g * y).sum(-1, true))).view(z.sizes());
  }
  const auto g = dz * per_row(weight, s, x.size(0));
  const auto dx = rstd * (g - g.mean(-1, true) - xhat * (g * xhat).mean(-1, true));
  return {dx, at::stack({dz * xhat, dz}, 0)};
}

// The scalar arguments the LayerNorm row kernels take after their pointers, typed as there.
struct RowKernelScalars {
  int64_t rows;
  int32_t width;
  float eps;
  int32_t members;
  int64_t member_rows;
  int32_t group;

  RowKernelScalars(const at::Tensor& x, const LayerNormActivationSettings& s)
      : rows(x.size(0)),
        width(static_cast<int32_t>(x.size(1))),
        eps(static_cast<float>(s.eps)),
        members(static_cast<int32_t>(s.members)),
        member_rows(s.member_rows),
        group(static_cast<int32_t>(s.group)) {}
};

// Launches a LayerNorm row kernel on `data` (its tensors' data, in the kernel's order), then
// the scalars.
void launch_row_kernel(
    const at::Tensor& x, void* kernel, const LayerNormActivationSettings& s,
    std::vector<void*> data) {
  if (s.blocks == 0) return;  // no rows
  RowKernelScalars scalars(x, s);
  std::vector<void*> args;
  for (void*& pointer : data) args.push_back(&pointer);
  args.insert(
      args.end(), std::initializer_list<void*>{&scalars.rows, &scalars.width, &scalars.eps,
                                               &scalars.members, &scalars.member_rows,
                                               &scalars.group});
  if (x.is_cpu()) {
    const auto* host = static_cast<const HostKernel*>(kernel);
    if (const char* error = host->launch(host, s.blocks, s.threads, 0, args.data())) {
      throw std::runtime_error(error);
    }
    return;
  }
  launch_on_torch_stream(x.device().index(), kernel, s.blocks, s.threads, 0, args.data());
}

struct LayerNormActivation : public torch::autograd::Function<LayerNormActivation> {
  static at::Tensor forward(
      torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
      const at::Tensor& bias, LayerNormActivationSettings s) {
    ctx->save_for_backward({x, weight, bias});
    ctx->saved_data["settings"] = c10::IValue(std::vector<int64_t>{
        reinterpret_cast<intptr_t>(s.forward), reinterpret_cast<intptr_t>(s.backward),
        s.blocks, s.threads, s.members, s.member_rows, s.group});
    ctx->saved_data["eps"] = s.eps;
    return output(x, weight, bias, s);
  }

  // The forward pass itself, with or without a node.
  static at::Tensor output(
      const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
      const LayerNormActivationSettings& s) {
    if (s.forward == nullptr) {
      return activation(std::get<2>(affine_output(x, weight, bias, s)), s.group);
    }
    auto y = at::empty_like(x);
    // (Mish's kernel reads no group.)
    launch_row_kernel(
        x, s.forward, s, {x.data_ptr(), y.data_ptr(), weight.data_ptr(), bias.data_ptr()});
    return y;
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &weight = saved[1], &bias = saved[2];
    const auto values = ctx->saved_data["settings"].toIntVector();
    const LayerNormActivationSettings s{
        reinterpret_cast<void*>(static_cast<intptr_t>(values[0])),
        reinterpret_cast<void*>(static_cast<intptr_t>(values[1])),
        static_cast<uint32_t>(values[2]),
        static_cast<uint32_t>(values[3]),
        ctx->saved_data["eps"].toDouble(),
        values[4],
        values[5],
        values[6]};
    const bool params = ctx->needs_input_grad(1) || ctx->needs_input_grad(2);
    const auto dy = grads[0].contiguous();
    at::Tensor dx, param_rows;
    if (s.backward == nullptr) {
      std::tie(dx, param_rows) = backward_rows(x, dy, weight, bias, s);
    } else {
      dx = at::empty_like(x);
      if (params) param_rows = at::empty({2, x.size(0), x.size(1)}, x.options());
      launch_row_kernel(
          x, s.backward, s,
          {x.data_ptr(), dy.data_ptr(), weight.data_ptr(), bias.data_ptr(), dx.data_ptr(),
           params ? param_rows.data_ptr() : nullptr});
    }
    at::Tensor dweight, dbias;
    if (params) {
      const int64_t rows = x.size(0), width = x.size(1);
      const auto sums = param_rows
                            .view({2, rows / (s.members * s.member_rows), s.members,
                                   s.member_rows, width})
                            .sum({1, 3});
      dweight = sums[0].view(weight.sizes());
      dbias = sums[1].view(bias.sizes());
    }
    return {dx, dweight, dbias, at::Tensor()};
  }
};

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

// Whether torch's grad mode is on in this thread (tch can set it but not read it).
char* tdmpc2_grad_enabled(int32_t* out) {
  return guarded([&] { *out = at::GradMode::is_enabled() ? 1 : 0; });
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

// A kernel of a loaded library. Its attributes are asked for at once: under CUDA's lazy
// loading (the default) that loads it into `device`'s context now, not at its first launch,
// which could fall inside a graph's capture. A runtime that does not load on the question
// leaves it lazy, its error cleared.
char* tdmpc2_cuda_library_kernel(
    int64_t device, void* library, const char* name, void** kernel) {
  *kernel = nullptr;
  return guarded([&] {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    cudaKernel_t found = nullptr;
    C10_CUDA_CHECK(cudaLibraryGetKernel(&found, static_cast<cudaLibrary_t>(library), name));
    cudaFuncAttributes attributes{};
    if (cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(found)) != cudaSuccess) {
      (void)cudaGetLastError();
    }
    *kernel = found;
  });
}

// launch_on_torch_stream, for the Rust side's kernels.
char* tdmpc2_cuda_launch(
    int64_t device, void* kernel, const uint32_t* grid, const uint32_t* block,
    uint32_t shared_bytes, void** args) {
  return guarded([&] {
    launch_on_torch_stream(
        static_cast<c10::DeviceIndex>(device), kernel, dim3(grid[0], grid[1], grid[2]),
        dim3(block[0], block[1], block[2]), shared_bytes, args);
  });
}

// LayerNormActivation above on x, joined to autograd where x, weight or bias want gradients.
char* tdmpc2_layer_norm_activation(
    at::Tensor* x, at::Tensor* weight, at::Tensor* bias,
    const LayerNormActivationSettings* settings, at::Tensor** out) {
  *out = nullptr;
  return guarded([&] {
    // Without a gradient to give (plans, targets) no node is made: eager plans are bound by
    // the host's time per call.
    const bool wanted = at::GradMode::is_enabled() &&
                        (x->requires_grad() || weight->requires_grad() || bias->requires_grad());
    *out = new at::Tensor(
        wanted ? LayerNormActivation::apply(*x, *weight, *bias, *settings)
               : LayerNormActivation::output(*x, *weight, *bias, *settings));
  });
}

}  // extern "C"
