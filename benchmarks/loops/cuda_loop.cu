// A decode-like loop with no Python: each step reads GIB GiB of device memory once (a bandwidth-bound reduction
// over random-looking data), the host waits for it, and every second the loop prints its own step time and GB/s.
// decodemon attaches to it by pid and reads the device-wide counters beside it.
//   nvcc -O2 -arch=sm_90 -o /tmp/cuda_loop benchmarks/loops/cuda_loop.cu && /tmp/cuda_loop 8 60
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
  fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__global__ void fill(uint4* p, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = make_uint4(i * 2654435761u, i ^ 0x9e3779b9u, (unsigned)(i >> 7) * 40503u, (unsigned)i);
}

__global__ void rd(const uint4* __restrict__ p, size_t n, unsigned* out) {
  unsigned s = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint4 v = p[i]; s ^= v.x + v.y + v.z + v.w;
  }
  if (s == 0x12345678u) out[0] = s;  // never true in practice: keeps the loads
}

int main(int argc, char** argv) {
  size_t bytes = (size_t)((argc > 1 ? atof(argv[1]) : 8.0) * (1ull << 30));
  double secs = argc > 2 ? atof(argv[2]) : 60;
  uint4* p; unsigned* o; size_t n = bytes / 16;
  CHECK(cudaMalloc(&p, bytes)); CHECK(cudaMalloc(&o, 4));
  fill<<<132 * 8, 512>>>(p, n); CHECK(cudaGetLastError()); CHECK(cudaDeviceSynchronize());
  printf("{\"known_bytes_per_step\": %zu}\n", n * 16); fflush(stdout);
  auto t0 = std::chrono::steady_clock::now(), tl = t0; long k = 0, kl = 0;
  while (true) {
    rd<<<132 * 8, 512>>>(p, n, o); CHECK(cudaGetLastError()); CHECK(cudaDeviceSynchronize()); k++;
    auto t = std::chrono::steady_clock::now(); double dt = std::chrono::duration<double>(t - tl).count();
    if (dt > 1) {
      double unix_s = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      printf("{\"t\": %.3f, \"steps\": %ld, \"ms_per_step\": %.4f, \"gbs\": %.1f}\n", unix_s, k - kl,
             dt / (k - kl) * 1e3, (double)(n * 16) * (k - kl) / dt / 1e9);
      fflush(stdout); tl = t; kl = k;
    }
    if (std::chrono::duration<double>(t - t0).count() > secs) break;
  }
  return 0;
}
