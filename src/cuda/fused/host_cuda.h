// CUDA's device side as the fused kernels use it, on the CPU (src/cuda/fused/host.rs compiles
// each kernel source after this header with the host's C++ compiler). A block's threads are
// fibers on one OS thread: each runs until it reaches a barrier (__syncthreads, __syncwarp, a
// warp shuffle) or ends, and a barrier opens once every thread of its block or warp that has not
// ended waits at it, as on a GPU where ended threads no longer count. Even blocks run their
// threads from the first, odd blocks from the last, so that a read of another thread's write
// that no barrier orders gives a wrong number in one of the two orders rather than passing.
// __shared__ variables are static: one block runs at a time, and one launch in the process.
//
// A fiber is entered once a launch through ucontext (the portable way onto a stack of its own)
// and from then on switched to and from with _setjmp/_longjmp, which unlike swapcontext make no
// system call: a warp reduction switches hundreds of times a row. glibc's fortified longjmp
// refuses jumps between stacks, hence the #undef, before any system header.
#undef _FORTIFY_SOURCE
#include <math.h>
#include <setjmp.h>
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
  jmp_buf context;
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
  jmp_buf scheduler;
  ucontext_t launcher;  // where each fiber returns once it has saved its first context
  std::string error;
};

inline Run*& run() {
  static Run* current = nullptr;
  return current;
}

inline void suspend(Run& r, Fiber& self) {
  if (_setjmp(self.context) == 0) _longjmp(r.scheduler, 1);
}

inline void resume(Run& r, Fiber& fiber) {
  if (_setjmp(r.scheduler) == 0) _longjmp(fiber.context, 1);
}

inline void wait(State state) {
  Run& r = *run();
  Fiber& self = r.fibers[r.thread];
  self.state = state;
  suspend(r, self);
}

// A fiber's whole life, on its own stack: it saves its context and goes back to the launch,
// then runs the kernel's body once for each block the scheduler resumes it in. It never returns.
inline void fiber_main() {
  {
    Run& r = *run();
    ucontext_t entered;
    if (_setjmp(r.fibers[r.thread].context) == 0) swapcontext(&entered, &r.launcher);
  }
  for (;;) {
    Run& r = *run();
    r.body(r.kernel, r.args);
    r.fibers[r.thread].state = State::Ended;
    suspend(r, r.fibers[r.thread]);
  }
}

// Enters each fiber once: it returns here with its context saved, ready for the first block.
inline void start_fibers(Run& r) {
  for (unsigned t = 0; t < r.fibers.size(); ++t) {
    ucontext_t entry;
    getcontext(&entry);
    entry.uc_stack.ss_sp = r.fibers[t].stack.get();
    entry.uc_stack.ss_size = kStackBytes;
    entry.uc_link = nullptr;
    makecontext(&entry, fiber_main, 0);
    r.thread = t;
    swapcontext(&r.launcher, &entry);
  }
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
  for (Fiber& f : r.fibers) f.state = State::Runnable;
  const bool reverse = block_index % 2 == 1;
  for (;;) {
    bool ran = false;
    for (unsigned i = 0; i < n; ++i) {
      const unsigned t = reverse ? n - 1 - i : i;
      if (r.fibers[t].state != State::Runnable) continue;
      r.thread = t;
      resume(r, r.fibers[t]);
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
  start_fibers(r);
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
