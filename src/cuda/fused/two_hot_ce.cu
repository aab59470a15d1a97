// Soft cross-entropy of two-hot logits against scalar targets, and its gradient, for the update's
// reward and value losses (TwoHot::soft_ce): the target's two-hot coding, the log-softmax, the
// loss and dloss/dlogits in one pass, one warp per row. logits and grad [rows, bins]; target
// [target_rows], row r taking target r % target_rows (the Q heads share their TD targets);
// loss [rows]. The coding follows TwoHot::encode: symlog, NaN to 0 and ±∞ to the edges, clamped
// to [vmin, vmax], split between the bin below and the next one (wrapping, with weight 0).

extern "C" __global__ void two_hot_soft_ce(
    const float* logits, const float* target, float* loss, float* grad, long long rows, int bins,
    long long target_rows, float vmin, float vmax, float bin_size) {
  const long long row = warp_row();
  if (row >= rows) return;
  const float* x = logits + row * bins;
  float* g = grad + row * bins;

  const float t = target[row % target_rows];
  float coded = (t > 0.0f ? 1.0f : (t < 0.0f ? -1.0f : 0.0f)) * logf(fabsf(t) + 1.0f);
  if (isnan(coded)) coded = 0.0f;
  coded = fminf(fmaxf(coded, vmin), vmax);
  const float position = (coded - vmin) / bin_size;
  const float lower = fminf(fmaxf(floorf(position), 0.0f), (float)(bins - 1));
  const float upper_weight = position - lower;
  const float lower_weight = 1.0f - upper_weight;
  const int lower_bin = (int)lower;
  const int upper_bin = (lower_bin + 1) % bins;

  float top = __int_as_float(0xff800000);  // −∞
  for (int i = lane(); i < bins; i += 32) top = fmaxf(top, x[i]);
  top = warp_max(top);
  float total = 0.0f;
  for (int i = lane(); i < bins; i += 32) total += expf(x[i] - top);
  const float log_total = logf(warp_sum(total));

  const float weights = lower_weight + upper_weight;
  for (int i = lane(); i < bins; i += 32) {
    const float log_p = x[i] - top - log_total;
    const float coding =
        (i == lower_bin ? lower_weight : 0.0f) + (i == upper_bin ? upper_weight : 0.0f);
    g[i] = expf(log_p) * weights - coding;
  }
  if (lane() == 0) {
    const float lower_log_p = x[lower_bin] - top - log_total;
    const float upper_log_p = x[upper_bin] - top - log_total;
    loss[row] = -(lower_weight * lower_log_p + upper_weight * upper_log_p);
  }
}
