// topk_logprobs on the GPU (the teacher cache's top-K next-token candidates computed on the device) against
// its floor measured in the same run: the bytes of the logits read once over the device's copy bandwidth
// (a device-to-device copy of the same logits, counting bytes read and written). N = 16384 rows,
// V ∈ {49152 (SmolLM2), 151936 (Qwen2)}, K ∈ {8, 64, 128}, bf16 and f32 logits drawn N(0, 3²) (bf16 rounding
// gives the ties real logits have), through the graph API as teacher-cache runs it; medians of CUDA-event
// timings on the backend's stream. Sampled rows are checked against a float64 sort on the host (ids exact,
// logprobs to 1e-4), so a fast wrong kernel cannot pass; the last line is the worst and median ratio.
//
// Usage: bench_topk [--n N] [--reps R]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "retort.h"

namespace {

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

using namespace retort;

// N(0, sd²) by Box-Muller from a hash of the index: no host staging of gigabytes.
__device__ __forceinline__ float normal_at(uint64_t i, uint64_t seed, float sd) {
  uint64_t h = (i + seed) * 0x9E3779B97F4A7C15ull;
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  const float u1 = (float((h >> 40) & 0xffffff) + 0.5f) / 16777216.0f;
  const float u2 = (float((h >> 16) & 0xffffff) + 0.5f) / 16777216.0f;
  return sd * sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

__global__ void fill_normal(void* p, bool bf16, int64_t n, uint64_t seed, float sd) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = normal_at(uint64_t(i), seed, sd);
    if (bf16)
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
    else
      static_cast<float*>(p)[i] = v;
  }
}

// Median over reps samples of the time per call, each sample timing `inner` calls queued back to back.
float median_ms(cudaStream_t s, const std::function<void()>& fn, int reps, int inner = 3) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 2; ++i) fn();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a, s));
    for (int j = 0; j < inner; ++j) fn();
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms / float(inner));
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

float bf16_value(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Check {
  int bad_ids = 0;
  double worst_lp = 0;
};

// Rows r of the device logits against a float64 sort: (value desc, id asc), logprob x - lse.
void check_rows(const Tensor* x, const std::vector<float>& lp, const std::vector<int64_t>& ids, int64_t K,
                Check& c) {
  const int64_t N = x->ne[1], V = x->ne[0];
  const size_t es = dtype_size(x->dtype);
  std::vector<uint8_t> raw(static_cast<size_t>(V) * es);
  std::vector<double> z(static_cast<size_t>(V));
  std::vector<int64_t> order(static_cast<size_t>(V));
  for (int64_t r : {int64_t(0), N / 3, N - 1}) {
    CK(cudaMemcpy(raw.data(), static_cast<const char*>(x->data) + size_t(r) * x->nb[1], raw.size(),
                  cudaMemcpyDeviceToHost));
    for (int64_t j = 0; j < V; ++j) {
      if (x->dtype == DType::BF16) {
        uint16_t h;
        std::memcpy(&h, raw.data() + j * 2, 2);
        z[size_t(j)] = bf16_value(h);
      } else {
        float f;
        std::memcpy(&f, raw.data() + j * 4, 4);
        z[size_t(j)] = f;
      }
    }
    const double m = *std::max_element(z.begin(), z.end());
    double s = 0;
    for (double v : z) s += std::exp(v - m);
    const double lse = m + std::log(s);
    std::iota(order.begin(), order.end(), int64_t(0));
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return z[size_t(a)] > z[size_t(b)]; });
    for (int64_t k = 0; k < K; ++k) {
      const size_t i = size_t(r * K + k);
      c.bad_ids += ids[i] != order[size_t(k)];
      c.worst_lp = std::max(c.worst_lp, std::abs(double(lp[i]) - (z[size_t(order[size_t(k)])] - lse)));
    }
  }
}

struct Result {
  std::string name;
  double ms, floor_ms;
};

}  // namespace

int main(int argc, char** argv) {
  int64_t N = 16384;
  int reps = 9;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--n")) N = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  std::string why;
  if (!cuda_available(&why)) {
    std::fprintf(stderr, "bench_topk: CUDA unavailable: %s\n", why.c_str());
    return 1;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB; N = %lld rows\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20, (long long)N);
  try {
    std::unique_ptr<Backend> be = make_cuda_backend(0);
    cudaStream_t stream = static_cast<cudaStream_t>(be->stream_handle());
    std::vector<Result> res;
    Check check;
    std::printf("\n%-32s %10s %10s %8s %10s\n", "topk_logprobs", "ms", "floor ms", "ratio", "GB/s");
    for (DType dt : {DType::BF16, DType::F32})
      for (int64_t V : {int64_t(49152), int64_t(151936)}) {
        Context ctx(*be);
        Tensor* x = ctx.tensor(dt, {N, V}, "logits");
        fill_normal<<<4096, 256, 0, stream>>>(x->data, dt == DType::BF16, N * V, uint64_t(V) + 17, 3.0f);
        CK(cudaGetLastError());
        const size_t bytes = size_t(N) * size_t(V) * dtype_size(dt);
        // The floor: reading the logits once at the copy bandwidth of the same bytes, measured now.
        void* dst = nullptr;
        CK(cudaMalloc(&dst, bytes));
        const float copy_ms = median_ms(
            stream, [&] { CK(cudaMemcpyAsync(dst, x->data, bytes, cudaMemcpyDeviceToDevice, stream)); },
            reps);
        CK(cudaFree(dst));
        const double bw = 2.0 * double(bytes) / (copy_ms * 1e-3);
        const double floor_ms = double(bytes) / bw * 1e3;
        for (int64_t K : {int64_t(8), int64_t(64), int64_t(128)}) {
          const TopKLogprobs o = topk_logprobs(ctx, x, K);
          o.logprobs->flags |= kOutput;
          Graph g(ctx);
          g.forward(o.logprobs);
          const float ms = median_ms(
              stream, [&] { g.compute(); }, reps);
          be->synchronize();  // a device-side error (NaN) would surface here
          check_rows(x, get_data(o.logprobs), get_data_int(o.ids), K, check);
          char name[96];
          std::snprintf(name, sizeof name, "%s V=%lld K=%lld", dtype_name(dt), (long long)V, (long long)K);
          res.push_back({name, ms, floor_ms});
          std::printf("%-32s %10.3f %10.3f %8.3f %10.0f\n", name, ms, floor_ms, ms / floor_ms,
                      double(bytes) / (ms * 1e-3) / 1e9);
          std::fflush(stdout);
        }
        std::printf("  (copy bandwidth %.0f GB/s on %.2f GB)\n", bw / 1e9, double(bytes) / 1e9);
      }
    std::printf("check vs float64 (3 rows per case): %d wrong ids, logprob max abs err %.2e\n", check.bad_ids,
                check.worst_lp);
    std::vector<double> ratios;
    for (const Result& r : res) ratios.push_back(r.ms / r.floor_ms);
    const auto worst = std::max_element(ratios.begin(), ratios.end()) - ratios.begin();
    std::vector<double> sorted = ratios;
    std::sort(sorted.begin(), sorted.end());
    const bool ok = check.bad_ids == 0 && check.worst_lp < 1e-4;
    std::printf("%s topk_logprobs / floor: worst %.2f (%s), median %.2f over %zu cases\n",
                ok ? "ok" : "WRONG", ratios[size_t(worst)], res[size_t(worst)].name.c_str(),
                sorted[sorted.size() / 2], res.size());
    return ok ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_topk: %s\n", e.what());
    return 1;
  }
}
