// The K-sparse top-K path when the divergence is forward KL (see sparse_forward_kl in cuda_chunk_kernels.h):
// gather, row loss and dhidden in one pass per row, each weight row read once.
#include "cuda_chunk_kernels.h"
#include "sparse_topk.cuh"

namespace retort::cuda::fused {

namespace {

// Forward KL in one pass (sparse_fkl_kernel). With beta = 0 the top-K loss's gradient at
// slot k is g_k = c·(Q_k·S_P − P_k) (Q the student's softmax over the valid slots at T, P the teacher's
// probabilities, S_P = Σ P_k, c = scale·w_soft·T), so
//   dhidden = Σ_k g_k·W_k = c·(S_P·Σ_k Q_k·W_k − Σ_k P_k·W_k),
// and Σ_k Q_k·W_k is an online softmax-weighted sum, as in attention: one CTA per row reads each of the row's
// K weight rows once, for its logit and for both sums, instead of a gather pass by id and a dhidden pass that
// reads them all again. Each thread owns 8 columns (blockDim = H/8 rounded up to a warp); the slots go 8 at a
// time: 8 weight-row loads in flight per thread, the 8 dot products reduced over the block in a fixed order
// (deterministic, chunk-independent). The kernel also writes g [rows, K] (for the dW pass), the per-row
// loss, soft part and LSE, exactly the outputs of the gathered top-K row loss.
constexpr int kFklBatch = 8;

struct FklArgs {
  BD x, w, bias, ids, logprobs, mask, labels, g, dh;
  int64_t v = 0, ignore_index = -100;
  float temperature = 1.0f, w_soft = 1.0f, scale = 1.0f;
  const float* scale_dev = nullptr;
  float *loss = nullptr, *soft = nullptr, *lse = nullptr;
  bool accumulate = false;
};

// The 8 values v[0..8) summed over the warp: afterwards lane L holds the sum of v[i] with
// i = 4·bit4(L) + 2·bit3(L) + bit2(L) (9 shuffles instead of 40).
__device__ __forceinline__ float warp_sum8(float (&v)[8], int lane) {
#pragma unroll
  for (int w = 8, m = 16; w > 1; w >>= 1, m >>= 1) {
    const bool upper = (lane & m) != 0;
#pragma unroll
    for (int i = 0; i < w / 2; ++i) {
      const float send = upper ? v[i] : v[i + w / 2];
      const float keep = upper ? v[i + w / 2] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, m);
    }
  }
  float t = v[0];
  t += __shfl_xor_sync(0xffffffffu, t, 2);
  t += __shfl_xor_sync(0xffffffffu, t, 1);
  return t;
}

template <typename T>
__global__ void __launch_bounds__(512) sparse_fkl_kernel(FklArgs a) {
  extern __shared__ float fkl_smem[];
  const int kk = int(a.g.cols);
  float* s_lp = fkl_smem;                        // [K] teacher log p at T (valid slots)
  float* s_s = s_lp + kk;                        // [K] student logit / T (valid slots)
  int* s_id = reinterpret_cast<int*>(s_s + kk);  // [K] id, or -1
  __shared__ float red[32][kFklBatch];
  __shared__ float s_bcast[4];
  __shared__ double s_dred[32];
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  const int64_t groups = a.x.cols / 8;
  const int64_t c8 = threadIdx.x;
  const bool on = c8 < groups;
  const float inv_t = 1.0f / a.temperature;
  const float scale = a.scale_dev ? a.scale * *a.scale_dev : a.scale;
  for (int64_t r = blockIdx.x; r < a.x.rows; r += gridDim.x) {
    // Slots: validity and id; the teacher's log p at T (renormalized over the valid slots when T != 1).
    float mx = -INFINITY;
    for (int k = threadIdx.x; k < kk; k += blockDim.x) {
      const long long id = slot_id(a.ids, a.logprobs, a.mask, r, k, a.v);
      s_id[k] = int(id);
      const float l = id >= 0 ? load_f(el(a.logprobs, r, k), a.logprobs.dtype) : -INFINITY;
      s_lp[k] = l;
      if (id >= 0) mx = fmaxf(mx, l);
    }
    const bool renorm = a.temperature != 1.0f;
    if (renorm) {
      mx = warp_reduce(mx, MaxOp{});
      if (lane == 0) red[wid][0] = mx;
      __syncthreads();
      if (threadIdx.x == 0) {
        float m = -INFINITY;
        for (int i = 0; i < nw; ++i) m = fmaxf(m, red[i][0]);
        float se = 0.0f;
        for (int k = 0; k < kk; ++k)
          if (s_id[k] >= 0) se += expf((s_lp[k] - m) * inv_t);
        s_bcast[0] = m;
        s_bcast[1] = logf(se);
      }
      __syncthreads();
      const float mu = s_bcast[0], lsp = s_bcast[1];
      for (int k = threadIdx.x; k < kk; k += blockDim.x)
        if (s_id[k] >= 0) s_lp[k] = (s_lp[k] - mu) * inv_t - lsp;
    }
    bool ignored = false;
    if (a.labels.data) ignored = load_i(el(a.labels, r, 0), a.labels.dtype) == a.ignore_index;
    __syncthreads();  // the slot arrays are published

    float h[8], acc_e[8], acc_p[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) h[i] = acc_e[i] = acc_p[i] = 0.0f;
    if (on) rowk::unpack8(load_raw8(reinterpret_cast<const T*>(el(a.x, r, 0)) + c8 * 8), h);
    float m = -INFINITY, ssum = 0.0f, sp = 0.0f;  // the online max and sum of exp(s − m); Σ P
    for (int k0 = 0; k0 < kk; k0 += kFklBatch) {
      const int nb = min(kFklBatch, kk - k0);
      Raw8<T> raw[kFklBatch] = {};
      float part[kFklBatch];
#pragma unroll
      for (int u = 0; u < kFklBatch; ++u) {
        const int id = u < nb ? s_id[k0 + u] : -1;
        if (on && id >= 0) raw[u] = load_raw8(reinterpret_cast<const T*>(el(a.w, id, 0)) + c8 * 8);
      }
#pragma unroll
      for (int u = 0; u < kFklBatch; ++u) {
        float wv[8];
        rowk::unpack8(raw[u], wv);  // zeros for a padding slot or an idle thread
        float d = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) d = fmaf(h[i], wv[i], d);
        part[u] = d;
      }
      const float ws = warp_sum8(part, lane);
      if ((lane & 3) == 0) red[wid][((lane >> 4) & 1) * 4 + ((lane >> 3) & 1) * 2 + ((lane >> 2) & 1)] = ws;
      __syncthreads();
      if (threadIdx.x < nb) {
        const int k = k0 + threadIdx.x;
        float z = 0.0f;
        for (int i = 0; i < nw; ++i) z += red[i][threadIdx.x];
        if (s_id[k] >= 0 && a.bias.data) z += load_f(el(a.bias, 0, s_id[k]), a.bias.dtype);
        s_s[k] = z * inv_t;
      }
      __syncthreads();
      // Online update with the batch's valid slots (every thread the same m and sum).
      float mb = m;
      for (int u = 0; u < nb; ++u)
        if (s_id[k0 + u] >= 0) mb = fmaxf(mb, s_s[k0 + u]);
      if (mb != m) {
        const float f = m == -INFINITY ? 0.0f : expf(m - mb);
        ssum *= f;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc_e[i] *= f;
        m = mb;
      }
#pragma unroll
      for (int u = 0; u < kFklBatch; ++u) {
        if (u >= nb || s_id[k0 + u] < 0) continue;
        const float e = expf(s_s[k0 + u] - m), pk = expf(s_lp[k0 + u]);
        ssum += e;
        sp += pk;
        float wv[8];
        rowk::unpack8(raw[u], wv);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          acc_e[i] = fmaf(e, wv[i], acc_e[i]);
          acc_p[i] = fmaf(pk, wv[i], acc_p[i]);
        }
      }
    }
    const bool any = ssum > 0.0f;  // some valid slot
    const float lse = any ? m + logf(ssum) : 0.0f;
    // Divergence D = Σ P·(log P − log Q) and the slot gradients; thread k its slots, summed in double.
    const float c = ignored || !any ? 0.0f : scale * a.w_soft * a.temperature;
    double dpart = 0.0;
    for (int k = threadIdx.x; k < kk; k += blockDim.x) {
      float gk = 0.0f;
      if (s_id[k] >= 0) {
        const float lq = s_s[k] - lse, pk = expf(s_lp[k]);
        dpart += double(pk * (s_lp[k] - lq));
        gk = c * (expf(lq) * sp - pk);
      }
      *reinterpret_cast<float*>(el(a.g, r, k)) = gk;
    }
    dpart = warp_reduce(dpart, SumOp{});
    if (lane == 0) s_dred[wid] = dpart;
    if (on) {
      float* drow = reinterpret_cast<float*>(el(a.dh, r, 0)) + c8 * 8;
      float out[8];
      if (a.accumulate) load8(drow, out);
      const float inv_s = any ? 1.0f / ssum : 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float d = c * (sp * (acc_e[i] * inv_s) - acc_p[i]);
        out[i] = a.accumulate ? out[i] + d : d;
      }
      store8(drow, out);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      double dsum = 0.0;
      for (int i = 0; i < nw; ++i) dsum += s_dred[i];
      const float soft = ignored ? 0.0f : a.temperature * a.temperature * float(dsum);
      if (a.loss) a.loss[r] = a.w_soft != 0.0f ? a.w_soft * soft : 0.0f;
      if (a.soft) a.soft[r] = soft;
      if (a.lse) a.lse[r] = lse;
    }
    __syncthreads();  // the slot arrays and red are rewritten by the next row
  }
}

}  // namespace

bool sparse_forward_kl(CudaExec& ex, const Block& hidden, const Block& w, const Block& bias,
                       const loss::TopKSide& side, const Block& g, const SparseKlOut& out,
                       const Block& dhidden, bool accumulate_dhidden) {
  const int64_t h = hidden.cols, kk = g.cols, es = int64_t(dtype_size(hidden.dtype));
  const bool ok = side.div.forward_kl() && side.w_hard == 0.0f && side.normalize_topk && !side.ids.empty() &&
                  hidden.dtype == w.dtype && h % 8 == 0 && h / 8 <= 512 && kk <= 4096 &&
                  int64_t(hidden.col_stride) == es && int64_t(w.col_stride) == es && aligned16(hidden) &&
                  aligned16(w) && !dhidden.empty() && dhidden.col_stride == sizeof(float) &&
                  aligned16(dhidden) && g.dtype == DType::F32 && g.col_stride == sizeof(float) &&
                  (hidden.dtype == DType::BF16 || hidden.dtype == DType::F16 || hidden.dtype == DType::F32);
  if (!ok) return false;
  if (hidden.rows == 0) return true;
  FklArgs a;
  a.x = bd(hidden);
  a.w = bd(w);
  a.bias = bd(bias);
  a.ids = bd(side.ids);
  a.logprobs = bd(side.logprobs);
  a.mask = bd(side.mask);
  a.labels = bd(side.labels);
  a.g = bd(g);
  a.dh = bd(dhidden);
  a.v = w.rows;
  a.ignore_index = side.ignore_index;
  a.temperature = side.temperature;
  a.w_soft = side.w_soft;
  a.scale = out.grad_scale;
  a.scale_dev = out.grad_scale_dev;
  a.loss = out.loss;
  a.soft = out.soft;
  a.lse = out.lse;
  a.accumulate = accumulate_dhidden;
  const int threads = int((h / 8 + 31) / 32 * 32);
  const unsigned grid = unsigned(std::min<int64_t>(hidden.rows, int64_t(ex.sm_count) * (2048 / threads)));
  const size_t smem = size_t(kk) * (2 * sizeof(float) + sizeof(int));
  if (hidden.dtype == DType::BF16)
    sparse_fkl_kernel<__nv_bfloat16><<<grid, threads, smem, ex.stream>>>(a);
  else if (hidden.dtype == DType::F16)
    sparse_fkl_kernel<__half><<<grid, threads, smem, ex.stream>>>(a);
  else
    sparse_fkl_kernel<float><<<grid, threads, smem, ex.stream>>>(a);
  RT_CUDA_LAUNCH_CHECK("sparse_fkl_kernel");
  return true;
}

}  // namespace retort::cuda::fused
