// Kernel launch overhead on the local GPU, for the Arch fields launch_api_ns, launch_gap_ns,
// graph_api_ns and graph_gap_ns (docs/model.md section 13; docs/calibration.md).
//
//   nvcc -O2 -o /tmp/launch_overhead calibration/launch_overhead.cu && /tmp/launch_overhead
//
// prints one JSON object (medians over REPEATS, nanoseconds):
// - api_ns: host time of one cudaLaunchKernel while the GPU is busy (a spin kernel runs first),
//   so the call never waits for the GPU: the host's per-launch cost;
// - stream_gap_ns: GPU time per empty 1-CTA kernel in a chain of N on one stream, all queued
//   before the chain starts (behind the spin kernel), so the host is not the limit: the
//   front end's per-kernel cost in a stream;
// - graph_api_ns: host time of one cudaGraphLaunch of the same chain captured as a graph
//   (graph20_api_ns: of a 20-kernel graph);
// - graph_gap_ns: GPU time per kernel of that graph;
// - stream_unqueued_ns: GPU time per kernel when the host launches the chain without a spin
//   kernel ahead (host and GPU race: max(api, gap) in the model).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#define CHECK(x)                                                                  \
  do {                                                                            \
    cudaError_t e = (x);                                                          \
    if (e != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e));               \
      return 1;                                                                   \
    }                                                                             \
  } while (0)

__global__ void empty_kernel() {}

__global__ void spin_kernel(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

static double now_ns() {
  return std::chrono::duration<double, std::nano>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int main() {
  const int N = 400;        // kernels per chain (below the launch queue's depth)
  const int REPEATS = 15;
  const long long SPIN = 200000000LL;  // ~100 ms at ~2 GHz: longer than N host launches
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 50; ++i) empty_kernel<<<1, 32, 0, s>>>();  // warm up
  CHECK(cudaStreamSynchronize(s));

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < N; ++i) empty_kernel<<<1, 32, 0, s>>>();
  CHECK(cudaStreamEndCapture(s, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphLaunch(exec, s));  // warm up
  CHECK(cudaStreamSynchronize(s));
  cudaGraph_t graph20;
  cudaGraphExec_t exec20;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < 20; ++i) empty_kernel<<<1, 32, 0, s>>>();
  CHECK(cudaStreamEndCapture(s, &graph20));
  CHECK(cudaGraphInstantiate(&exec20, graph20, 0));
  CHECK(cudaGraphLaunch(exec20, s));  // warm up
  CHECK(cudaStreamSynchronize(s));

  std::vector<double> api, gap, gapi, ggap, unq, g20;
  for (int r = 0; r < REPEATS; ++r) {
    float ms = 0;
    // stream chain behind a spin kernel
    spin_kernel<<<1, 32, 0, s>>>(SPIN);
    CHECK(cudaEventRecord(a, s));
    double t0 = now_ns();
    for (int i = 0; i < N; ++i) empty_kernel<<<1, 32, 0, s>>>();
    double t1 = now_ns();
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaEventElapsedTime(&ms, a, b));
    api.push_back((t1 - t0) / N);
    gap.push_back(ms * 1e6 / N);
    // the same chain as one graph, behind a spin kernel
    spin_kernel<<<1, 32, 0, s>>>(SPIN);
    CHECK(cudaEventRecord(a, s));
    t0 = now_ns();
    CHECK(cudaGraphLaunch(exec, s));
    t1 = now_ns();
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaEventElapsedTime(&ms, a, b));
    gapi.push_back(t1 - t0);
    ggap.push_back(ms * 1e6 / N);
    // a 20-kernel graph's launch call, behind a spin kernel
    spin_kernel<<<1, 32, 0, s>>>(SPIN);
    t0 = now_ns();
    CHECK(cudaGraphLaunch(exec20, s));
    t1 = now_ns();
    g20.push_back(t1 - t0);
    // stream chain, host and GPU racing
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaEventRecord(a, s));
    for (int i = 0; i < N; ++i) empty_kernel<<<1, 32, 0, s>>>();
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaEventElapsedTime(&ms, a, b));
    unq.push_back(ms * 1e6 / N);
  }
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf(
      "{\"device\": \"%s\", \"driver\": %d, \"runtime\": %d, \"kernels_per_chain\": %d, "
      "\"repeats\": %d, \"api_ns\": %.1f, \"stream_gap_ns\": %.1f, \"graph_api_ns\": %.1f, "
      "\"graph_gap_ns\": %.1f, \"stream_unqueued_ns\": %.1f, \"graph20_api_ns\": %.1f}\n",
      prop.name, driver, runtime, N, REPEATS, median(api), median(gap), median(gapi), median(ggap),
      median(unq), median(g20));
  return 0;
}
