// 2D 5-point Jacobi stencil over the interior of an nx x ny grid; each thread walks a column
// strip of `rows` points.
__global__ void stencil2d(const float *__restrict__ in, float *__restrict__ out, int nx, int ny, int rows) {
  int x = blockIdx.x * blockDim.x + threadIdx.x;
  int y0 = blockIdx.y * rows;
  if (x < 1 || x >= nx - 1) return;
  for (int y = max(y0, 1); y < min(y0 + rows, ny - 1); y++) {
    int i = y * nx + x;
    out[i] = 0.25f * (in[i - 1] + in[i + 1] + in[i - nx] + in[i + nx]) - in[i];
  }
}
