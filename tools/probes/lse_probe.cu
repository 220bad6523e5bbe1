// clang-format off
// The softmax-epilogue GEMM of the fused losses (src/cuda/loss/softmax_chunk.h) against cuBLAS: the library's
// own kernel, which writes E = exp(z − shift) in bf16 and each row's partial sums per 256-column tile from its
// epilogue (z = x·Wᵀ never stored), checked against cuBLAS's f32 product in float64 (E element by element,
// NaN-poisoned first; the partial sums) and timed alternated with cuBLAS's bf16 GEMM of the same shape, with E
// written (a gradient step) and without (a forward pass). Not part of the build; on a GPU machine, after
// building retort with -Dsm_arch=90 into build-gpu:
//     nvcc -std=c++20 -O3 -gencode arch=compute_90a,code=sm_90a -Isrc -Ibuild-gpu -o /tmp/lse_probe \
//         tools/probes/lse_probe.cu -Lbuild-gpu/src -lretort -lcublas && LD_LIBRARY_PATH=build-gpu/src /tmp/lse_probe
// H100, session 18, the kernel as first written (then a copy here; the plain-GEMM variant it also timed
// wrote z instead of E): every element and partial sum within bf16 rounding; plain GEMM 0.95-1.03x cuBLAS;
// with the exp epilogue 4096 x 50304 x 768 (CE small chunk) 0.559 ms against 0.501 (1.116), 2048 x 128256 x
// 2048 (top-K chunk) 1.593 against 1.508 (1.056), 2048 x 128256 x 4096 (CE chunk) 3.008 against 2.970
// (1.013); sums only 0.98-1.01.
// clang-format on
#include <cublas_v2.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "cuda/loss/softmax_chunk.h"
#include "sm90_probe.cuh"

using retort::cuda::SoftmaxGemm;

// shift[m] = z at one column of the row (as z at the label would be), from the f32 reference.
__global__ void make_shift(const float* zref, int M, int N, int v, float* shift) {
  const int m = blockIdx.x * blockDim.x + threadIdx.x;
  if (m < M) shift[m] = zref[size_t(m) * N + (size_t(m) * 7919u) % v];
}

// Entries of E off by more than bf16 rounding allows (NaN counts), and the worst relative error.
__global__ void check_e(const __nv_bfloat16* e, const float* zref, const float* shift, int M, int N, int v,
                        unsigned long long* bad, float* worst) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < size_t(M) * N;
       i += size_t(gridDim.x) * blockDim.x) {
    const int m = int(i / N), n = int(i % N);
    const double want = n < v ? std::exp(double(zref[i]) - double(shift[m])) : 0.0;
    const double got = __bfloat162float(e[i]);
    const double err = std::fabs(got - want) / (std::fabs(want) + 1e-30);
    if (!(err <= 1.0 / 128 || std::fabs(got - want) <= 1e-6)) atomicAdd(bad, 1ull);
    atomicMax(reinterpret_cast<int*>(worst), __float_as_int(float(fmin(err, 1e30))));
  }
}

// Partial sums [row, tile] against float64 sums of the reference.
__global__ void check_part(const float* part, const float* zref, const float* shift, int M, int N, int v,
                           int nt, unsigned long long* bad, float* worst) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < M * nt; i += gridDim.x * blockDim.x) {
    const int m = i / nt, nb = i % nt;
    double s = 0;
    for (int n = nb * 256; n < min(N, (nb + 1) * 256); ++n)
      if (n < v) s += std::exp(double(zref[size_t(m) * N + n]) - double(shift[m]));
    const double got = part[i], err = std::fabs(got - s) / (s + 1e-30);
    if (!(err <= 1e-4)) atomicAdd(bad, 1ull);
    atomicMax(reinterpret_cast<int*>(worst), __float_as_int(float(fmin(err, 1e30))));
  }
}

void run(int M, int N, int v, int K, float scale) {
  __nv_bfloat16 *a, *b, *e, *cref;
  float *zref, *shift, *part, *worst;
  unsigned long long* bad;
  const int nt = int(retort::cuda::softmax_tiles(N));
  CK(cudaMalloc(&a, size_t(M) * K * 2));
  CK(cudaMalloc(&b, size_t(N) * K * 2));
  CK(cudaMalloc(&e, size_t(M) * N * 2));
  CK(cudaMalloc(&cref, size_t(M) * N * 2));
  CK(cudaMalloc(&zref, size_t(M) * N * 4));
  CK(cudaMalloc(&shift, size_t(M) * 4));
  CK(cudaMalloc(&part, size_t(M) * nt * 4));
  CK(cudaMalloc(&bad, 8));
  CK(cudaMalloc(&worst, 4));
  fill<<<1024, 256>>>(a, size_t(M) * K, 1, scale);
  fill<<<1024, 256>>>(b, size_t(N) * K, 2, scale);
  CK(cudaMemset(b + size_t(v) * K, 0, size_t(N - v) * K * 2));  // the padded vocabulary rows
  cublasHandle_t h;
  cublasCreate(&h);
  const float one = 1.0f, zero = 0.0f;
  cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, b, CUDA_R_16BF, K, a, CUDA_R_16BF, K, &zero, zref,
               CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  make_shift<<<(M + 255) / 256, 256>>>(zref, M, N, v, shift);
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  auto theirs = [&] {
    cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, b, CUDA_R_16BF, K, a, CUDA_R_16BF, K, &zero,
                 cref, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  std::printf("M %d N %d (v %d) K %d\n", M, N, v, K);
  for (int variant = 0; variant < 4; ++variant) {
    const bool write = variant < 2;
    const auto sched = variant % 2 == 0 ? retort::cuda::SoftmaxSchedule::PingPong
                                        : retort::cuda::SoftmaxSchedule::Cooperative;
    SoftmaxGemm g;
    g.schedule = sched;
    g.x = a;
    g.ldx = K;
    g.w = b;
    g.ldw = K;
    g.rows = M;
    g.h = K;
    g.wrows = N;
    g.v = v;
    g.e = write ? e : nullptr;
    g.lde = N;
    g.shift = shift;
    g.part = part;
    auto ours = [&] { retort::cuda::softmax_gemm(g, sms, nullptr); };
    CK(cudaMemset(e, 0xff, size_t(M) * N * 2));
    CK(cudaMemset(part, 0xff, size_t(M) * nt * 4));
    ours();
    CK(cudaDeviceSynchronize());
    unsigned long long nbad = 0, pbad = 0;
    float w = 0, pw = 0;
    if (write) {
      CK(cudaMemset(bad, 0, 8));
      CK(cudaMemset(worst, 0, 4));
      check_e<<<2048, 256>>>(e, zref, shift, M, N, v, bad, worst);
      CK(cudaMemcpy(&nbad, bad, 8, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(&w, worst, 4, cudaMemcpyDeviceToHost));
    }
    CK(cudaMemset(bad, 0, 8));
    CK(cudaMemset(worst, 0, 4));
    check_part<<<1024, 256>>>(part, zref, shift, M, N, v, nt, bad, worst);
    CK(cudaMemcpy(&pbad, bad, 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&pw, worst, 4, cudaMemcpyDeviceToHost));
    double t_ours = 0, t_cublas = 0;
    for (int rep = 0; rep < 3; ++rep) {  // alternated
      t_ours += time_ms(ours) / 3;
      t_cublas += time_ms(theirs) / 3;
    }
    CK(cudaGetLastError());
    std::printf(
        "  %-10s %-11s %.3f ms (%.0f TFLOP/s), cuBLAS bf16 %.3f ms, ratio %.3f | E off %llu (worst rel "
        "%.2g), "
        "partial sums off %llu (worst rel %.2g)\n",
        write ? "E and sums" : "sums only", variant % 2 == 0 ? "ping-pong" : "cooperative", t_ours,
        2.0 * M * N * double(K) / t_ours * 1e-9, t_cublas, t_ours / t_cublas, nbad, double(w), pbad,
        double(pw));
  }
  cublasDestroy(h);
  for (void* p : {static_cast<void*>(a), static_cast<void*>(b), static_cast<void*>(e),
                  static_cast<void*>(cref), static_cast<void*>(zref), static_cast<void*>(shift),
                  static_cast<void*>(part), static_cast<void*>(bad), static_cast<void*>(worst)})
    cudaFree(p);
}

int main(int argc, char** argv) {
  if (!retort::cuda::softmax_epilogue_supported(0)) {
    std::printf(
        "the softmax-epilogue GEMM does not run here (needs an sm_90a build and a compute 9.0 device)\n");
    return 1;
  }
  // Entries of x and W uniform in ±scale/2, so z spreads over a few units, as a model's logits do.
  if (argc > 1 && std::string(argv[1]) == "small") {  // the CE-small chunk alone (for a profiler)
    run(4096, 50304, 50257, 768, 0.5f);
    return 0;
  }
  run(300, 1024, 1000, 72, 1.0f);          // odd rows and K, a padded column tail
  run(4096, 50304, 50257, 768, 0.5f);      // CE small chunk
  run(2048, 128256, 128256, 2048, 0.35f);  // top-K chunk
  run(2048, 128256, 128256, 4096, 0.25f);  // CE chunk
  return 0;
}
