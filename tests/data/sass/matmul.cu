// Tiled matrix multiply C = A B (n x n, row-major), 16 x 16 tiles staged in shared memory.
#define TILE 16
__global__ void matmul_tiled(const float *__restrict__ a, const float *__restrict__ b, float *__restrict__ c,
                             int n) {
  __shared__ float as[TILE][TILE];
  __shared__ float bs[TILE][TILE];
  int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
  float acc = 0.0f;
  for (int t = 0; t < n / TILE; t++) {
    as[threadIdx.y][threadIdx.x] = a[row * n + t * TILE + threadIdx.x];
    bs[threadIdx.y][threadIdx.x] = b[(t * TILE + threadIdx.y) * n + col];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < TILE; k++) acc += as[threadIdx.y][k] * bs[k][threadIdx.x];
    __syncthreads();
  }
  c[row * n + col] = acc;
}
