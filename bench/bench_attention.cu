// flash_attention on the GPU: forward and forward + backward of the graph op (the backward's three kernels:
// row sums, dk/dv, dq) at the issue's shapes (B 32, heads 8, T 512 and 2048, head dim 64 and 128, causal),
// bf16, timed with CUDA events (median of --reps samples), with TFLOP/s counted as FlashAttention does
// (causal: half the square; forward 4·B·H·T²·D / 2, backward 2.5× that). bench/peers/attention_sdpa.py
// times PyTorch's flash SDPA at the same shapes.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "retort.h"

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));        \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

using namespace retort;

namespace {

__global__ void fill(__nv_bfloat16* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t h = (uint64_t(i) + seed) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    p[i] = __float2bfloat16_rn(float((h >> 40) & 0xffff) / 32768.0f - 1.0f);
  }
}

float median_ms(cudaStream_t s, const std::function<void()>& fn, int reps) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 2; ++i) fn();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a, s));
    fn();
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 9;
  for (int i = 1; i + 1 < argc; i += 2)
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  std::string why;
  if (!cuda_available(&why)) {
    std::fprintf(stderr, "bench_attention: CUDA unavailable: %s\n", why.c_str());
    return 1;
  }
  std::unique_ptr<Backend> be = make_cuda_backend(0);
  cudaStream_t stream = static_cast<cudaStream_t>(be->stream_handle());
  std::printf("%-28s %9s %9s %9s %9s %9s\n", "flash_attention bf16 causal", "fwd ms", "fwd TF/s", "bwd ms",
              "bwd TF/s", "f+b ms");
  struct Shape {
    int64_t B, T, H, D, KV;
  };
  // The issue's shapes, then SmolLM2-135M's (the teacher: 9 query heads reading 3 kv heads).
  for (Shape s : {Shape{32, 512, 8, 64, 8}, Shape{32, 512, 8, 128, 8}, Shape{8, 2048, 8, 64, 8},
                  Shape{8, 2048, 8, 128, 8}, Shape{32, 2048, 8, 64, 8}, Shape{32, 2048, 8, 128, 8},
                  Shape{32, 1024, 9, 64, 3}}) {
    Context ctx(*be);
    Tensor* q = ctx.param(DType::BF16, {s.B, s.T, s.H, s.D}, "q");
    Tensor* k = ctx.param(DType::BF16, {s.B, s.T, s.KV, s.D}, "k");
    Tensor* v = ctx.param(DType::BF16, {s.B, s.T, s.KV, s.D}, "v");
    const int64_t n = s.B * s.T * s.H * s.D;
    uint64_t seed = 1;
    for (Tensor* t : {q, k, v})
      fill<<<1024, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(t->data), t->nelements(), seed++);
    CK(cudaGetLastError());
    const float scale = 1.0f / std::sqrt(float(s.D));
    Tensor* out = flash_attention(ctx, q, k, v, scale);
    out->flags |= kOutput;
    Graph fwd(ctx);
    fwd.forward(out);
    const float fwd_ms = median_ms(stream, [&] { fwd.compute(); }, reps);
    // The backward from a given upstream gradient: sum(out · w) with w bf16 makes do = w.
    Tensor* w = ctx.input(DType::BF16, {s.B, s.T, s.H, s.D}, "w");
    fill<<<1024, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(w->data), n, 99);
    Graph both(ctx);
    Tensor* out2 = flash_attention(ctx, q, k, v, scale);
    both.forward(out2);
    both.backward(sum(ctx, mul(ctx, out2, w)));
    const float both_ms = median_ms(stream, [&] { both.compute(); }, reps);
    be->synchronize();
    const double flops = 4.0 * double(s.B) * double(s.H) * double(s.T) * double(s.T) * double(s.D) / 2.0;
    const float bwd_ms = both_ms - fwd_ms;
    char name[64];
    std::snprintf(name, sizeof name, "B%lld T%lld H%lld D%lld%s", (long long)s.B, (long long)s.T, (long long)s.H,
                  (long long)s.D, s.KV == s.H ? "" : " KV3");
    std::printf("%-28s %9.3f %9.1f %9.3f %9.1f %9.3f\n", name, fwd_ms, flops / (fwd_ms * 1e-3) / 1e12, bwd_ms,
                2.5 * flops / (bwd_ms * 1e-3) / 1e12, both_ms);
    std::fflush(stdout);
  }
  return 0;
}
