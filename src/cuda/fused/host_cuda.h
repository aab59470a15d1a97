// CUDA's device side as the fused kernels use it, on the CPU (src/cuda/fused/host.rs compiles
// each kernel source after this header with the host's C++ compiler). A block's threads are
// fibers on one OS thread: each runs until it reaches a barrier (__syncthreads, __syncwarp, a
// warp shuffle) or ends, and a barrier opens once every thread of its block or warp that has not
// ended waits at it, as on a GPU where ended threads no longer count. Even blocks run their
// threads from the first, odd blocks from the last, so that a read of another thread's write
// that no barrier orders gives a wrong number in one of the two orders rather than passing.
// __shared__ variables are static: one block runs at a time, and one launch in the process.
#include <math.h>
#include <string.h>
#include <ucontext.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

struct dim3 {
  unsigned x, y, z;
};

struct float2 {
  float x, y;
};

inline float2 make_float2(float x, float y) { return {x, y}; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __int_as_float(int bits) {
  float x;
  memcpy(&x, &bits, sizeof x);
  return x;
}

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

namespace tdmpc2_host {

enum class State { Runnable, AtBlockBarrier, AtWarpBarrier, Ended };

struct Fiber {
  ucontext_t context;
  std::unique_ptr<char[]> stack;  // left uninitialised: pages are touched only as used
  State state;
};

constexpr unsigned kWarp = 32;
constexpr size_t kStackBytes = 64 * 1024;

// The launch being run: its block, and the fiber running now.
struct Run {
  void (*body)(void (*)(), void**);
  void (*kernel)();
  void** args;
  dim3 grid, block, block_index;
  unsigned thread;
  std::vector<Fiber> fibers;
  std::vector<float> lanes;  // each thread's value in a warp shuffle
  std::vector<unsigned char> shared;
  ucontext_t scheduler;
  std::string error;
};

inline Run*& run() {
  static Run* current = nullptr;
  return current;
}

inline void wait(State state) {
  Run& r = *run();
  Fiber& self = r.fibers[r.thread];
  self.state = state;
  swapcontext(&self.context, &r.scheduler);
}

inline void fiber_main() {
  Run& r = *run();
  r.body(r.kernel, r.args);
  r.fibers[r.thread].state = State::Ended;
  // Returning resumes the scheduler (uc_link).
}

// Opens the barriers every live thread of a block or warp waits at; false if none could open
// while threads still wait (a barrier some live thread never reaches).
inline bool open_barriers(Run& r) {
  bool waiting = false, opened = false, block_ready = true;
  for (const Fiber& f : r.fibers) {
    if (f.state != State::Ended) waiting = true;
    if (f.state != State::Ended && f.state != State::AtBlockBarrier) block_ready = false;
  }
  if (!waiting) return true;
  if (block_ready) {
    for (Fiber& f : r.fibers) {
      if (f.state == State::AtBlockBarrier) f.state = State::Runnable;
    }
    return true;
  }
  for (size_t first = 0; first < r.fibers.size(); first += kWarp) {
    const size_t end = std::min(first + kWarp, r.fibers.size());
    bool ready = true, any = false;
    for (size_t i = first; i < end; ++i) {
      const State s = r.fibers[i].state;
      if (s == State::AtWarpBarrier) any = true;
      if (s != State::Ended && s != State::AtWarpBarrier) ready = false;
    }
    if (ready && any) {
      for (size_t i = first; i < end; ++i) {
        if (r.fibers[i].state == State::AtWarpBarrier) r.fibers[i].state = State::Runnable;
      }
      opened = true;
    }
  }
  return opened;
}

inline bool run_block(Run& r, unsigned block_index) {
  r.block_index = dim3{block_index, 0, 0};
  const unsigned n = r.block.x;
  for (unsigned t = 0; t < n; ++t) {
    Fiber& f = r.fibers[t];
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = f.stack.get();
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = &r.scheduler;
    makecontext(&f.context, fiber_main, 0);
    f.state = State::Runnable;
  }
  const bool reverse = block_index % 2 == 1;
  for (;;) {
    bool ran = false;
    for (unsigned i = 0; i < n; ++i) {
      const unsigned t = reverse ? n - 1 - i : i;
      if (r.fibers[t].state != State::Runnable) continue;
      r.thread = t;
      swapcontext(&r.scheduler, &r.fibers[t].context);
      ran = true;
    }
    bool ended = true;
    for (const Fiber& f : r.fibers) ended = ended && f.state == State::Ended;
    if (ended) return true;
    if (!open_barriers(r) && !ran) {
      r.error = "threads of block " + std::to_string(block_index) +
                " wait at a barrier that the others never reach";
      return false;
    }
  }
}

// A kernel of this library: its launch runs it on the CPU. The shim and host.rs see only the
// first field.
struct HostKernel {
  const char* (*launch)(const HostKernel*, uint32_t grid, uint32_t block, uint32_t shared_bytes,
                        void** args);
  const char* name;
  void (*kernel)();
  void (*body)(void (*)(), void**);
};

inline const char* launch(const HostKernel* k, uint32_t grid, uint32_t block,
                          uint32_t shared_bytes, void** args) {
  static std::mutex one_launch;
  static thread_local std::string error;
  std::lock_guard<std::mutex> lock(one_launch);
  if (block == 0 || block > 1024) {
    error = std::string(k->name) + ": " + std::to_string(block) + " threads a block";
    return error.c_str();
  }
  Run r;
  r.body = k->body;
  r.kernel = k->kernel;
  r.args = args;
  r.grid = dim3{grid, 1, 1};
  r.block = dim3{block, 1, 1};
  r.fibers.resize(block);
  for (Fiber& f : r.fibers) f.stack.reset(new char[kStackBytes]);
  r.lanes.resize(block);
  r.shared.assign(shared_bytes + 16, 0);
  run() = &r;
  for (unsigned b = 0; b < grid; ++b) {
    if (!run_block(r, b)) {
      run() = nullptr;
      error = std::string(k->name) + ": " + r.error;
      return error.c_str();
    }
  }
  run() = nullptr;
  return nullptr;
}

template <typename... P, size_t... I>
void unpack(void (*kernel)(P...), void** args, std::index_sequence<I...>) {
  kernel(*static_cast<P*>(args[I])...);
}

template <typename... P>
HostKernel host_kernel(const char* name, void (*kernel)(P...)) {
  return HostKernel{&launch, name, reinterpret_cast<void (*)()>(kernel),
                    [](void (*raw)(), void** args) {
                      unpack(reinterpret_cast<void (*)(P...)>(raw), args,
                             std::index_sequence_for<P...>{});
                    }};
}

inline void* dynamic_shared() { return run()->shared.data(); }

}  // namespace tdmpc2_host

#define threadIdx (dim3{tdmpc2_host::run()->thread, 0, 0})
#define blockIdx (tdmpc2_host::run()->block_index)
#define blockDim (tdmpc2_host::run()->block)
#define gridDim (tdmpc2_host::run()->grid)

inline void __syncthreads() { tdmpc2_host::wait(tdmpc2_host::State::AtBlockBarrier); }
inline void __syncwarp(unsigned = 0xffffffffu) {
  tdmpc2_host::wait(tdmpc2_host::State::AtWarpBarrier);
}

// Every lane of the warp gives its value, then reads lane ^ offset's.
inline float __shfl_xor_sync(unsigned, float value, int offset) {
  tdmpc2_host::Run& r = *tdmpc2_host::run();
  const unsigned self = r.thread;
  r.lanes[self] = value;
  __syncwarp();
  const float other = r.lanes[self ^ static_cast<unsigned>(offset)];
  __syncwarp();
  return other;
}
