// Row-loss benchmark on the GPU: each row loss at N = 8192, V = 151936, bf16 logits, forward and
// forward+backward, against the floor measured in the same run: the bytes the op must move (read the logits
// once; write the gradient once when asked) over the device's measured copy bandwidth. Also checks a sample
// of rows against a float64 CPU reference, so a fast wrong kernel cannot pass.
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

#include "cuda/loss/distill_rows.h"
#include "cuda/loss/row_losses.h"

using namespace retort;
using namespace retort::cuda;

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

namespace {

__global__ void fill_normal_bf16(__nv_bfloat16* p, int64_t n, uint64_t seed, float sd) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t h = (uint64_t(i) + seed) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    float u1 = (float((h >> 40) & 0xffffff) + 0.5f) / 16777216.0f;
    float u2 = (float((h >> 16) & 0xffffff) + 0.5f) / 16777216.0f;
    p[i] = __float2bfloat16_rn(sd * sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2));
  }
}

// Median over `reps` samples of the time per call, each sample timing `inner` calls back to back: as in a
// training step, the host queues the next launch while the GPU runs this one, so host-side launch work is
// hidden unless it is longer than the kernel.
float median_ms(const std::function<void()>& fn, int reps = 15, int inner = 4) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) fn();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a));
    for (int j = 0; j < inner; ++j) fn();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms / float(inner));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

float bf(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Row {
  std::vector<double> z;
};

double lse_of(const std::vector<double>& z) {
  double m = -INFINITY;
  for (double v : z) m = std::max(m, v);
  double s = 0;
  for (double v : z) s += std::exp(v - m);
  return m + std::log(s);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t N = 8192, V = 151936;
  if (argc > 2) {
    N = std::atoll(argv[1]);
    V = std::atoll(argv[2]);
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  const size_t bytes = size_t(N) * V * 2;
  __nv_bfloat16 *x, *g;
  CK(cudaMalloc(&x, bytes));
  CK(cudaMalloc(&g, bytes));
  fill_normal_bf16<<<4096, 256>>>(x, N * V, 1234, 2.0f);
  CK(cudaGetLastError());
  // Measured bandwidth: a device-to-device copy of the same size, counting bytes read and written.
  float copy_ms = median_ms([&] { CK(cudaMemcpyAsync(g, x, bytes, cudaMemcpyDeviceToDevice)); });
  double bw = 2.0 * bytes / (copy_ms * 1e-3);
  std::printf("copy bandwidth: %.0f GB/s (%.3f ms for %.2f GB read + written)\n", bw / 1e9, copy_ms,
              2.0 * bytes / 1e9);

  float set_ms = median_ms([&] { CK(cudaMemsetAsync(g, 1, bytes)); });
  std::printf("memset (write only): %.0f GB/s\n", bytes / (set_ms * 1e-3) / 1e9);
  int *labels, *ids, *err;
  float *loss, *lse, *inv, *out, *up, *total;
  const int64_t K = 64;
  CK(cudaMalloc(&labels, N * 4));
  CK(cudaMalloc(&ids, N * K * 4));
  CK(cudaMalloc(&err, 4));
  CK(cudaMalloc(&loss, N * 4));
  CK(cudaMalloc(&lse, N * 4));
  CK(cudaMalloc(&inv, 4));
  CK(cudaMalloc(&total, 4));
  CK(cudaMalloc(&out, N * K * 4));
  CK(cudaMalloc(&up, N * K * 4));
  std::vector<int> hl(N), hid(N * K);
  std::vector<float> hup(N * K);
  srand(7);
  for (int64_t i = 0; i < N; ++i) hl[i] = (i % 17 == 5) ? -100 : int(rand() % V);
  for (int64_t i = 0; i < N * K; ++i) hid[i] = int(rand() % V);
  for (int64_t i = 0; i < N * K; ++i) hup[i] = float(rand()) / RAND_MAX - 0.5f;
  CK(cudaMemcpy(labels, hl.data(), N * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(ids, hid.data(), N * K * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(up, hup.data(), N * K * 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(err, 0, 4));

  RowBlock b;
  b.logits = x;
  b.dtype = DType::BF16;
  b.rows = N;
  b.V = V;
  b.stride = V;
  b.loss = loss;
  b.lse = lse;
  RowBlock bg = b;
  bg.grad = g;
  bg.grad_dtype = DType::BF16;
  bg.grad_stride = V;
  bg.scale_dev = inv;
  CrossEntropyRows ce;
  ce.labels = labels;
  EntropyRows en;
  SelectiveRows sel1, selK;
  sel1.ids = ids;  // K = 1 uses the first column's layout: give it its own contiguous [N,1] view below
  sel1.K = 1;
  sel1.out = out;
  selK.ids = ids;
  selK.K = K;
  selK.out = out;
  std::vector<int> hid1(N);
  for (int64_t i = 0; i < N; ++i) hid1[i] = hid[i * K];
  int* ids1;
  CK(cudaMalloc(&ids1, N * 4));
  CK(cudaMemcpy(ids1, hid1.data(), N * 4, cudaMemcpyHostToDevice));
  sel1.ids = ids1;

  struct Result {
    std::string name;
    double ms, floor_ms;
  };
  std::vector<Result> res;
  const double read_floor = bytes / bw * 1e3, rw_floor = 2.0 * bytes / bw * 1e3;
  auto run = [&](const std::string& name, double floor, const std::function<void()>& fn) {
    double ms = median_ms(fn);
    res.push_back({name, ms, floor});
  };
  run("cross_entropy fwd", read_floor, [&] {
    count_valid_rows(labels, DType::I32, N, -100, 1.0f, inv, nullptr, nullptr);
    cross_entropy_rows(b, ce, err, nullptr);
    sum_rows_scalar(loss, N, inv, 1.0f, total, nullptr);
  });
  run("cross_entropy fwd+bwd", rw_floor, [&] {
    count_valid_rows(labels, DType::I32, N, -100, 1.0f, inv, nullptr, nullptr);
    cross_entropy_rows(bg, ce, err, nullptr);
    sum_rows_scalar(loss, N, inv, 1.0f, total, nullptr);
  });
  run("entropy fwd", read_floor, [&] { entropy_rows(b, en, nullptr); });
  run("entropy fwd+bwd", rw_floor, [&] {
    RowBlock t = bg;
    t.scale_dev = nullptr;
    t.scale = 1.0f / N;
    entropy_rows(t, en, nullptr);
  });
  run("selective_log_softmax K=1 fwd", read_floor,
      [&] { selective_log_softmax_rows(b, sel1, err, nullptr); });
  run("selective_log_softmax K=64 fwd", read_floor,
      [&] { selective_log_softmax_rows(b, selK, err, nullptr); });
  SelectiveRows selKb = selK;
  selKb.upstream = up;
  RowBlock bsel = bg;
  bsel.scale_dev = nullptr;
  run("selective_log_softmax K=64 bwd", rw_floor,
      [&] { selective_log_softmax_rows(bsel, selKb, err, nullptr); });
  run("selective_log_softmax K=64 fwd+bwd", rw_floor, [&] {
    selective_log_softmax_rows(b, selK, err, nullptr);
    selective_log_softmax_rows(bsel, selKb, err, nullptr);
  });

  // ---- distillation: top-K (K = 64, forward KL, w_hard = 0.5 with labels) and full vocabulary (JSD 0.5)
  // ----
  float* lp;
  CK(cudaMalloc(&lp, N * K * 4));
  {
    std::vector<float> hlp(N * K);
    for (int64_t i = 0; i < N * K; ++i) hlp[i] = -1.0f - 4.0f * float(rand()) / RAND_MAX;
    CK(cudaMemcpy(lp, hlp.data(), N * K * 4, cudaMemcpyHostToDevice));
  }
  TopKRows tk;
  tk.ids = {ids, DType::I32, K * 4, 4};
  tk.logprobs = {lp, DType::F32, K * 4, 4};
  tk.labels = {labels, DType::I32, 4, 0};
  tk.K = K;
  tk.w_hard = 0.5f;
  tk.w_soft = 1.0f;
  ErrorSink sink;
  run("topk_kd K=64 (+0.5 CE) fwd", read_floor, [&] {
    count_valid_rows(labels, DType::I32, N, -100, 1.0f, inv, nullptr, nullptr);
    topk_distill_rows(b, tk, sink, nullptr);
    sum_rows_scalar(loss, N, inv, 1.0f, total, nullptr);
  });
  // With a workspace (as the topk_kd op and the fused loss pass): cross-entropy rows between a slot gather
  // and a slot fixup (one read of each row); without: the top-K kernel, which reads each row twice.
  void* tk_scratch = nullptr;
  CK(cudaMalloc(&tk_scratch, topk_scratch_bytes(N, K)));
  TopKRows tkw = tk;
  tkw.scratch = tk_scratch;
  run("topk_kd K=64 (+0.5 CE) fwd+bwd", rw_floor, [&] {
    count_valid_rows(labels, DType::I32, N, -100, 1.0f, inv, nullptr, nullptr);
    topk_distill_rows(bg, tkw, sink, nullptr);
    sum_rows_scalar(loss, N, inv, 1.0f, total, nullptr);
  });
  run("topk_kd fwd+bwd, top-K kernel", rw_floor, [&] {
    count_valid_rows(labels, DType::I32, N, -100, 1.0f, inv, nullptr, nullptr);
    topk_distill_rows(bg, tk, sink, nullptr);
    sum_rows_scalar(loss, N, inv, 1.0f, total, nullptr);
  });
  __nv_bfloat16* teacher;
  CK(cudaMalloc(&teacher, bytes));
  fill_normal_bf16<<<4096, 256>>>(teacher, N * V, 999, 2.0f);
  CK(cudaGetLastError());
  DistillRows dr;
  dr.teacher = teacher;
  dr.teacher_dtype = DType::BF16;
  dr.teacher_stride = V;
  dr.div.beta = 0.5f;
  // Floors: read student and teacher once (and write the gradient once).
  run("distill JSD(0.5) fwd (student+teacher)", 2 * read_floor, [&] { distill_rows(b, dr, sink, nullptr); });
  run("distill JSD(0.5) fwd+bwd", 3 * read_floor, [&] {
    RowBlock t = bg;
    t.scale_dev = nullptr;
    t.scale = 1.0f / N;
    distill_rows(t, dr, sink, nullptr);
  });
  DistillRows dkl = dr;
  dkl.div.beta = 0.0f;
  run("distill forward-KL fwd+bwd", 3 * read_floor, [&] {
    RowBlock t = bg;
    t.scale_dev = nullptr;
    t.scale = 1.0f / N;
    distill_rows(t, dkl, sink, nullptr);
  });
  CK(cudaDeviceSynchronize());
  int herr;
  CK(cudaMemcpy(&herr, err, 4, cudaMemcpyDeviceToHost));

  // ---- correctness on sampled rows against float64 --------------------------------------------------------
  const int kCheck = 8;
  std::vector<uint16_t> hx(V), hg(V);
  std::vector<float> hloss(N), hlse(N), hout(N * K);
  double worst_loss = 0, worst_grad = 0, worst_sel = 0;
  // Cross-entropy forward + backward, mean over valid rows.
  count_valid_rows(labels, DType::I32, N, -100, 1.0f, inv, nullptr, nullptr);
  cross_entropy_rows(bg, ce, err, nullptr);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(hloss.data(), loss, N * 4, cudaMemcpyDeviceToHost));
  int nvalid = 0;
  for (int64_t i = 0; i < N; ++i) nvalid += hl[i] != -100;
  for (int c = 0; c < kCheck; ++c) {
    int64_t r = (c * 1013 + 5) % N;
    CK(cudaMemcpy(hx.data(), x + r * V, V * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hg.data(), g + r * V, V * 2, cudaMemcpyDeviceToHost));
    std::vector<double> z(V);
    for (int64_t j = 0; j < V; ++j) z[j] = bf(hx[j]);
    double L = lse_of(z);
    double ref = hl[r] == -100 ? 0.0 : L - z[hl[r]];
    worst_loss = std::max(worst_loss, std::abs(ref - hloss[r]) / std::max(1.0, std::abs(ref)));
    for (int64_t j = 0; j < V; ++j) {
      double gr = hl[r] == -100 ? 0.0 : (std::exp(z[j] - L) - (j == hl[r])) / nvalid;
      double got = bf(hg[j]);
      worst_grad = std::max(worst_grad, std::abs(got - gr) / (1.0 / nvalid));
    }
  }
  // Selective log-softmax forward at K = 64.
  selective_log_softmax_rows(b, selK, err, nullptr);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(hout.data(), out, N * K * 4, cudaMemcpyDeviceToHost));
  for (int c = 0; c < kCheck; ++c) {
    int64_t r = (c * 733 + 11) % N;
    CK(cudaMemcpy(hx.data(), x + r * V, V * 2, cudaMemcpyDeviceToHost));
    std::vector<double> z(V);
    for (int64_t j = 0; j < V; ++j) z[j] = bf(hx[j]);
    double L = lse_of(z);
    for (int64_t k = 0; k < K; ++k)
      worst_sel = std::max(worst_sel, std::abs(z[hid[r * K + k]] - L - hout[r * K + k]));
  }
  std::printf(
      "check vs float64 (%d rows): CE loss rel err %.2e, CE grad err %.2e (units of 1/valid rows, "
      "bf16 output), selective logprob abs err %.2e, error flag %d\n",
      kCheck, worst_loss, worst_grad, worst_sel, herr);

  std::printf("\n%-38s %10s %10s %8s\n", "op (N=8192, V=151936, bf16)", "ms", "floor ms", "ratio");
  for (auto& r : res)
    std::printf("%-38s %10.3f %10.3f %8.3f\n", r.name.c_str(), r.ms, r.floor_ms, r.ms / r.floor_ms);
  return 0;
}
