// LayerNorm (biased variance, affine) followed by the layer's activation, one warp per row:
// the two torch kernels and Mish's own memory pass become one read and one write of the row.
// x and y are [rows, width] (row-major, contiguous); weight and bias [members, width], where row
// r takes member (r / member_rows) % members: one member for a plain layer, and for a stack of
// ensemble members either blocks of rows ([members, n, width]) or interleaved rows
// ([n, members, width]). y may equal x.
//
// Each has its backward (the shim's autograd function launches them): from x and dy it gives dx
// and, where param_rows is given ([2, rows, width]), each row's share of the weight's and the
// bias's gradients, dz·x̂ and dz (z the affine output), which the caller sums over each member's
// rows with torch (deterministic: no atomics). The row's statistics are computed again from x.

// A row's mean and 1/sqrt(variance + eps).
__device__ __forceinline__ float2 row_stats(const float* x, int width, float eps) {
  float sum = 0.0f;
  for (int i = lane(); i < width; i += 32) sum += x[i];
  const float mean = warp_sum(sum) / width;
  float squares = 0.0f;
  for (int i = lane(); i < width; i += 32) {
    const float d = x[i] - mean;
    squares += d * d;
  }
  return make_float2(mean, rsqrtf(warp_sum(squares) / width + eps));
}

__device__ __forceinline__ void layer_norm_row(
    const float* x, float* y, const float* weight, const float* bias, int width, float eps) {
  const float2 stats = row_stats(x, width, eps);
  for (int i = lane(); i < width; i += 32) {
    y[i] = (x[i] - stats.x) * stats.y * weight[i] + bias[i];
  }
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

// One lane's softmax of v[0..n), in place.
__device__ __forceinline__ void softmax_in_place(float* v, int n) {
  float top = v[0];
  for (int i = 1; i < n; ++i) top = fmaxf(top, v[i]);
  float total = 0.0f;
  for (int i = 0; i < n; ++i) {
    v[i] = expf(v[i] - top);
    total += v[i];
  }
  for (int i = 0; i < n; ++i) v[i] /= total;
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
  for (int g = lane(); g < width / group; g += 32) softmax_in_place(out + g * group, group);
}

// The derivative of Mish at z, as torch's mish_backward computes it.
__device__ __forceinline__ float mish_slope(float z) {
  const float sigmoid = 1.0f / (1.0f + expf(-z));
  const float t = tanhf(log1pf(expf(z)));
  return t + z * sigmoid * (1.0f - t * t);
}

// LayerNorm's backward for one row, given dz (the gradient at the affine output) in dx, which it
// overwrites: dx = rstd·(g − mean(g) − x̂·mean(g·x̂)) with g = dz·weight. Each lane reads back
// only what it wrote.
__device__ __forceinline__ void layer_norm_backward_row(
    const float* x, float* dx, const float* weight, float* dweight_row, float* dbias_row,
    int width, float2 stats) {
  float sum = 0.0f, sum_xhat = 0.0f;
  for (int i = lane(); i < width; i += 32) {
    const float xhat = (x[i] - stats.x) * stats.y;
    const float dz = dx[i];
    const float g = dz * weight[i];
    sum += g;
    sum_xhat += g * xhat;
    if (dweight_row != nullptr) {
      dweight_row[i] = dz * xhat;
      dbias_row[i] = dz;
    }
    dx[i] = g;
  }
  const float mean_g = warp_sum(sum) / width;
  const float mean_g_xhat = warp_sum(sum_xhat) / width;
  for (int i = lane(); i < width; i += 32) {
    const float xhat = (x[i] - stats.x) * stats.y;
    dx[i] = stats.y * (dx[i] - mean_g - xhat * mean_g_xhat);
  }
}

extern "C" __global__ void layer_norm_mish_backward(
    const float* x, const float* dy, const float* weight, const float* bias, float* dx,
    float* param_rows, long long rows, int width, float eps, int members, long long member_rows) {
  const long long row = warp_row();
  if (row >= rows) return;
  const long long at = row * width;
  const long long member = member_offset(row, members, member_rows, width);
  const float2 stats = row_stats(x + at, width, eps);
  for (int i = lane(); i < width; i += 32) {
    const float z = (x[at + i] - stats.x) * stats.y * weight[member + i] + bias[member + i];
    dx[at + i] = dy[at + i] * mish_slope(z);
  }
  layer_norm_backward_row(
      x + at, dx + at, weight + member, param_rows ? param_rows + at : nullptr,
      param_rows ? param_rows + rows * width + at : nullptr, width, stats);
}

// SimNorm's backward within each group: dz = y·(dy − Σ dy·y), y the group's softmax of z.
extern "C" __global__ void layer_norm_simnorm_backward(
    const float* x, const float* dy, const float* weight, const float* bias, float* dx,
    float* param_rows, long long rows, int width, float eps, int members, long long member_rows,
    int group) {
  const long long row = warp_row();
  if (row >= rows) return;
  const long long at = row * width;
  const long long member = member_offset(row, members, member_rows, width);
  const float2 stats = row_stats(x + at, width, eps);
  float* d = dx + at;
  for (int i = lane(); i < width; i += 32) {
    d[i] = (x[at + i] - stats.x) * stats.y * weight[member + i] + bias[member + i];
  }
  // The groups are split among the lanes differently from the elements above.
  __syncwarp();
  for (int g = lane(); g < width / group; g += 32) {
    float* v = d + g * group;
    const float* dv = dy + at + g * group;
    softmax_in_place(v, group);
    float dot = 0.0f;
    for (int i = 0; i < group; ++i) dot += dv[i] * v[i];
    for (int i = 0; i < group; ++i) v[i] *= dv[i] - dot;
  }
  __syncwarp();
  layer_norm_backward_row(
      x + at, d, weight + member, param_rows ? param_rows + at : nullptr,
      param_rows ? param_rows + rows * width + at : nullptr, width, stats);
}
