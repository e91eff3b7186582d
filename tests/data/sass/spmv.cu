// CSR sparse matrix-vector product y = A x, one thread per row: the inner loop runs over the
// row's nonzeros, so its trip count varies from row to row.
__global__ void spmv_csr(const int *__restrict__ row_ptr, const int *__restrict__ cols,
                         const float *__restrict__ vals, const float *__restrict__ x, float *__restrict__ y,
                         int rows) {
  int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  float sum = 0.0f;
  for (int j = row_ptr[row]; j < row_ptr[row + 1]; j++) sum += vals[j] * x[cols[j]];
  y[row] = sum;
}
