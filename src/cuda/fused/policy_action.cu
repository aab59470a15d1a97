// The policy head's action from its last layer: log σ squashed into [low, low + dif] with tanh,
// then tanh(μ + ε·exp(log σ)), masked per row group. One thread per action entry.
// head [rows, 2·A] (μ then raw log σ); eps and out [rows, A]; mask [rows / rows_per_mask, A] or
// null.
extern "C" __global__ void policy_action(
    const float* head, const float* eps, const float* mask, float* out, long long rows,
    int actions, float low, float dif, long long rows_per_mask) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows * actions) return;
  const long long row = i / actions;
  const int a = (int)(i % actions);
  const float* h = head + row * 2 * actions;
  const float log_std = (tanhf(h[actions + a]) + 1.0f) * (0.5f * dif) + low;
  float action = tanhf(h[a] + eps[i] * expf(log_std));
  if (mask != nullptr) action *= mask[(row / rows_per_mask) * actions + a];
  out[i] = action;
}
