// A candidate's value from its rollout: returns + factor·(Q₁ + Q₂)/2, where each Qᵢ is a head's
// two-hot logits decoded (softmax over the bins, expectation over the support, symexp). One warp
// per row. logits [2, rows, bins] (the pair of heads), support [bins], returns and out [rows],
// factor [rows] (factor_stride 1) or one value (factor_stride 0).

__device__ __forceinline__ float decode_row(const float* logits, const float* support, int bins) {
  float top = __int_as_float(0xff800000);  // −∞
  for (int i = lane(); i < bins; i += 32) top = fmaxf(top, logits[i]);
  top = warp_max(top);
  float total = 0.0f, weighted = 0.0f;
  for (int i = lane(); i < bins; i += 32) {
    const float p = expf(logits[i] - top);
    total += p;
    weighted += p * support[i];
  }
  const float x = warp_sum(weighted) / warp_sum(total);
  return copysignf(expm1f(fabsf(x)), x);
}

extern "C" __global__ void q_bootstrap(
    const float* logits, const float* support, const float* returns, const float* factor,
    long long factor_stride, float* out, long long rows, int bins) {
  const long long row = warp_row();
  if (row >= rows) return;
  const float q1 = decode_row(logits + row * bins, support, bins);
  const float q2 = decode_row(logits + (rows + row) * bins, support, bins);
  if (lane() == 0) out[row] = returns[row] + factor[row * factor_stride] * ((q1 + q2) * 0.5f);
}
