// MPPI's selection and refit, one block per environment: the NaN guard, the top-k candidates by
// value, their softmax weights, the weighted mean and std (clamped, masked) and, when draws are
// given, the next iteration's candidates from them. Replaces about thirty torch kernels an
// iteration. Deterministic: every sum has a fixed order.
//
// values [E, N]; candidates [E, H, N, A] (the first P rows are the policy's and are kept);
// mask [E, A] or null; draws [E, H, N − P, A] or null.
// Out: score [E, K], elites [E, H, K, A], mean and std [E, H, A].
// Shared memory: N + K floats and K ints.

__device__ __forceinline__ float finite_or_zero(float x) {
  if (isnan(x)) return 0.0f;
  if (isinf(x)) return x > 0.0f ? 3.402823466e38f : -3.402823466e38f;
  return x;
}

__device__ __forceinline__ void sample_candidates(
    const float* mean, const float* std_dev, const float* mask, const float* draws, float* candidates,
    int e, int N, int H, int A, int P) {
  const int free = N - P;
  for (int t = threadIdx.x; t < H * free * A; t += blockDim.x) {
    const int h = t / (free * A);
    const int j = (t / A) % free;
    const int a = t % A;
    const long long at = ((long long)e * H + h) * A + a;
    float x = mean[at] + std_dev[at] * draws[(((long long)e * H + h) * free + j) * A + a];
    x = fminf(fmaxf(x, -1.0f), 1.0f);
    if (mask != nullptr) x *= mask[(long long)e * A + a];
    candidates[(((long long)e * H + h) * N + P + j) * A + a] = x;
  }
}

// candidates[:, :, P:] = clamp(mean + std·draws, −1, 1)·mask: the first iteration's samples.
extern "C" __global__ void mppi_sample(
    const float* mean, const float* std_dev, const float* mask, const float* draws, float* candidates,
    int N, int H, int A, int P) {
  sample_candidates(mean, std_dev, mask, draws, candidates, blockIdx.x, N, H, A, P);
}

extern "C" __global__ void mppi_refit(
    const float* values, float* candidates, const float* mask, const float* draws, float* score,
    float* elites, float* mean, float* std_dev, int N, int H, int A, int K, int P, float temperature,
    float min_std, float max_std) {
  extern __shared__ float shared[];
  float* value = shared;
  float* weight = value + N;
  int* elite = (int*)(weight + K);
  __shared__ float totals[2];
  const int e = blockIdx.x;

  for (int i = threadIdx.x; i < N; i += blockDim.x) {
    value[i] = finite_or_zero(values[(long long)e * N + i]);
  }
  __syncthreads();
  // A candidate's place is the number ahead of it (ties: the lower index first), so the elites
  // come out sorted by value, highest first, as torch's topk gives them.
  for (int i = threadIdx.x; i < N; i += blockDim.x) {
    const float v = value[i];
    int ahead = 0;
    for (int j = 0; j < N; ++j) {
      const float u = value[j];
      ahead += (u > v) || (u == v && j < i);
    }
    if (ahead < K) elite[ahead] = i;
  }
  __syncthreads();
  const float top = value[elite[0]];
  for (int k = threadIdx.x; k < K; k += blockDim.x) {
    weight[k] = expf((value[elite[k]] - top) * temperature);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) sum += weight[k];
    totals[0] = sum;
  }
  __syncthreads();
  for (int k = threadIdx.x; k < K; k += blockDim.x) {
    weight[k] /= totals[0];
    score[(long long)e * K + k] = weight[k];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) sum += weight[k];
    totals[1] = sum + 1e-9f;
  }
  __syncthreads();
  const float total = totals[1];

  for (int t = threadIdx.x; t < H * K * A; t += blockDim.x) {
    const int h = t / (K * A);
    const int k = (t / A) % K;
    const int a = t % A;
    elites[(((long long)e * H + h) * K + k) * A + a] =
        candidates[(((long long)e * H + h) * N + elite[k]) * A + a];
  }
  for (int t = threadIdx.x; t < H * A; t += blockDim.x) {
    const int h = t / A;
    const int a = t % A;
    const float* column = candidates + ((long long)e * H + h) * N * A + a;
    float m = 0.0f;
    for (int k = 0; k < K; ++k) m += weight[k] * column[(long long)elite[k] * A];
    m /= total;
    float s = 0.0f;
    for (int k = 0; k < K; ++k) {
      const float d = column[(long long)elite[k] * A] - m;
      s += weight[k] * d * d;
    }
    s = fminf(fmaxf(sqrtf(s / total), min_std), max_std);
    if (mask != nullptr) {
      m *= mask[(long long)e * A + a];
      s *= mask[(long long)e * A + a];
    }
    mean[((long long)e * H + h) * A + a] = m;
    std_dev[((long long)e * H + h) * A + a] = s;
  }
  if (draws == nullptr) return;
  // Every read of this environment's candidates is done before any is overwritten.
  __syncthreads();
  sample_candidates(mean, std_dev, mask, draws, candidates, e, N, H, A, P);
}
