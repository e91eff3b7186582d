// Row softmax, one warp per row: the row's maximum, exp (MUFU.EX2) and sum, each reduced with
// warp shuffles, then the normalised outputs.
__device__ float warp_max(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}
__device__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
__global__ void softmax_rows(const float *__restrict__ in, float *__restrict__ out, int rows, int cols) {
  int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float *r = in + (size_t)row * cols;
  float m = -INFINITY;
  for (int j = lane; j < cols; j += 32) m = fmaxf(m, r[j]);
  m = warp_max(m);
  float s = 0.0f;
  for (int j = lane; j < cols; j += 32) s += __expf(r[j] - m);
  s = warp_sum(s);
  float inv = 1.0f / s;
  for (int j = lane; j < cols; j += 32) out[(size_t)row * cols + j] = __expf(r[j] - m) * inv;
}
