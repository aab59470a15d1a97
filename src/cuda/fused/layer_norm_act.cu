// LayerNorm (biased variance, affine) followed by the layer's activation, one warp per row:
// the two torch kernels and Mish's own memory pass become one read and one write of the row.
// x and y are [rows, width] (row-major, contiguous); weight and bias [members, width], where row
// r takes member (r / member_rows) % members: one member for a plain layer, and for a stack of
// ensemble members either blocks of rows ([members, n, width]) or interleaved rows
// ([n, members, width]). y may equal x.

__device__ __forceinline__ void layer_norm_row(
    const float* x, float* y, const float* weight, const float* bias, int width, float eps) {
  float sum = 0.0f;
  for (int i = lane(); i < width; i += 32) sum += x[i];
  const float mean = warp_sum(sum) / width;
  float squares = 0.0f;
  for (int i = lane(); i < width; i += 32) {
    const float d = x[i] - mean;
    squares += d * d;
  }
  const float rstd = rsqrtf(warp_sum(squares) / width + eps);
  for (int i = lane(); i < width; i += 32) y[i] = (x[i] - mean) * rstd * weight[i] + bias[i];
}

// The offset of row's member in weight and bias.
__device__ __forceinline__ long long member_offset(
    long long row, int members, long long member_rows, int width) {
  return (row / member_rows) % members * (long long)width;
}

// Mish as torch computes it: x·tanh(log1p(exp(x))).
extern "C" __global__ void layer_norm_mish(
    const float* x, float* y, const float* weight, const float* bias, long long rows, int width,
    float eps, int members, long long member_rows) {
  const long long row = warp_row();
  if (row >= rows) return;
  float* out = y + row * width;
  const long long member = member_offset(row, members, member_rows, width);
  layer_norm_row(x + row * width, out, weight + member, bias + member, width, eps);
  // Each lane reads back only what it wrote.
  for (int i = lane(); i < width; i += 32) out[i] = out[i] * tanhf(log1pf(expf(out[i])));
}

// SimNorm: a softmax within each consecutive group of `group` features (width a multiple of it).
extern "C" __global__ void layer_norm_simnorm(
    const float* x, float* y, const float* weight, const float* bias, long long rows, int width,
    float eps, int members, long long member_rows, int group) {
  const long long row = warp_row();
  if (row >= rows) return;
  float* out = y + row * width;
  const long long member = member_offset(row, members, member_rows, width);
  layer_norm_row(x + row * width, out, weight + member, bias + member, width, eps);
  __syncwarp();
  for (int g = lane(); g < width / group; g += 32) {
    float* v = out + g * group;
    float top = v[0];
    for (int i = 1; i < group; ++i) top = fmaxf(top, v[i]);
    float total = 0.0f;
    for (int i = 0; i < group; ++i) {
      v[i] = expf(v[i] - top);
      total += v[i];
    }
    for (int i = 0; i < group; ++i) v[i] /= total;
  }
}
