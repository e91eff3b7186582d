// Block sum reduction: a grid-stride load loop, a shared-memory tree with __syncthreads(),
// then the last warp reduces with shuffles; thread 0 adds the block's sum atomically.
__global__ void reduce_sum(const float *__restrict__ x, float *__restrict__ out, int n) {
  extern __shared__ float smem[];
  unsigned tid = threadIdx.x;
  float v = 0.0f;
  for (int i = blockIdx.x * blockDim.x + tid; i < n; i += gridDim.x * blockDim.x) v += x[i];
  smem[tid] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 32; s >>= 1) {
    if (tid < s) smem[tid] += smem[tid + s];
    __syncthreads();
  }
  if (tid < 32) {
    v = smem[tid] + smem[tid + 32];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    if (tid == 0) atomicAdd(out, v);
  }
}
