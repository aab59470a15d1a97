// Helpers shared by the fused kernels (prepended to each source before NVRTC compiles it).
// NVRTC has no standard headers: only built-in types and CUDA's device functions.

#define TDMPC2_FULL_WARP 0xffffffffu

__device__ __forceinline__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    x += __shfl_xor_sync(TDMPC2_FULL_WARP, x, offset);
  }
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    x = fmaxf(x, __shfl_xor_sync(TDMPC2_FULL_WARP, x, offset));
  }
  return x;
}

// The row a warp works on, for blocks of whole warps.
__device__ __forceinline__ long long warp_row() {
  return (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
}

__device__ __forceinline__ int lane() { return threadIdx.x & 31; }
