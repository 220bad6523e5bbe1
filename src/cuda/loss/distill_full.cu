// Full-vocabulary distillation rows (see distill_rows.h; the math is row_kernels.h's): student logits against
// teacher logits, forward KL, reverse KL or the generalized JSD, with an optional hard cross-entropy.
//
// The portable kernel: one CTA per row pair, one online pass over the student and teacher rows for the
// normalizers, one pass for the divergence (which also writes the gradient for forward KL, whose gradient
// needs no row-wide sum), and for reverse KL and JSD one more pass for the gradient; re-reads come from L2 or
// HBM. On Hopper the cluster kernel (distill_cluster.cu) keeps the row pair in shared memory instead. Math in
// f32, divergence sums in double like the CPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "distill_full.cuh"

namespace retort::cuda {

namespace {

using namespace distk;

// Full-vocabulary distillation.

// Visits the row pair (student z of T, teacher w of dtype wt): f(j0, z, w, cnt) gets cnt = 8 consecutive
// values from column j0 (16-byte loads of both rows, after a scalar head up to the student row's alignment)
// or cnt = 1 (the head, the tail, or every value when !vec).
template <typename T, typename F>
__device__ __forceinline__ void for_pair(const T* z, const char* w, DType wt, int64_t wsize, int64_t n,
                                         bool vec, F&& f) {
  const int64_t step = blockDim.x;
  auto one = [&](int64_t j) {
    float a[8], c[8];
    a[0] = rowk::to_f<T>(z[j]);
    c[0] = load_f(w + j * wsize, wt);
    f(j, a, c, 1);
  };
  if (!vec) {
    for (int64_t j = threadIdx.x; j < n; j += step) one(j);
    return;
  }
  const int64_t head =
      std::min<int64_t>(n, int64_t((16 - reinterpret_cast<uintptr_t>(z) % 16) % 16 / sizeof(T)));
  for (int64_t j = threadIdx.x; j < head; j += step) one(j);
  const T* zq = z + head;
  const T* wq = reinterpret_cast<const T*>(w) + head;
  const int64_t nv = (n - head) / 8;
  for (int64_t k = threadIdx.x; k < nv; k += step) {
    float a[8], c[8];
    rowk::load8(zq + k * 8, a);
    rowk::load8(wq + k * 8, c);
    f(head + k * 8, a, c, 8);
  }
  for (int64_t j = head + nv * 8 + threadIdx.x; j < n; j += step) one(j);
}

template <typename T, typename G>
__global__ void __launch_bounds__(kThreads)
    distill_kernel(RowBlock b, DistillRows o, ErrorSink err, DistillFlags f) {
  __shared__ Stats2 ssh[32];
  __shared__ double dsh[32];
  const int64_t v = b.V;
  const float temp = o.temperature, inv_t = 1.0f / temp, kt = inv_t * kLog2e;
  const loss::DivergenceSpec dv = o.div;
  const bool fkl = dv.forward_kl();
  const bool want_grad = b.grad != nullptr;
  const DType wt = o.teacher_dtype;
  const int64_t wsize = wt == DType::F32 ? 4 : 2;
  for (int64_t r = blockIdx.x; r < b.rows; r += gridDim.x) {
    const T* zr = static_cast<const T*>(b.logits) + r * b.stride;
    const char* wr = static_cast<const char*>(o.teacher) + r * o.teacher_stride * wsize;
    G* grow = want_grad ? static_cast<G*>(b.grad) + r * b.grad_stride : nullptr;
    const RowLabel lab = row_label(o.labels, r, o.ignore_index, v, err);
    const bool ignored = lab.ignored;
    if (ignored && !b.lse) {
      if (threadIdx.x == 0) write_row_outputs(b, o.hard, o.soft, r, 0.0f, 0.0f, 0.0f);
      if (want_grad) zero_row(grow, v);
      continue;
    }
    // Read before any gradient store: the gradient may alias the logits.
    const float zy = f.want_hard && !ignored ? rowk::to_f<T>(zr[lab.y]) : 0.0f;
    const bool both = f.want_hard && !ignored && temp != 1.0f;

    // One online pass over both rows: the student at T (and at 1 for the hard loss), the teacher at T.
    Stats2 sz = stats_empty(), sw = stats_empty();
    for_pair(zr, wr, wt, wsize, v, f.vec, [&](int64_t, const float* z, const float* w, int cnt) {
      if (cnt == 8) {
        stats_add<8>(sz, z, kt, both);
        if (!ignored) stats_add<8>(sw, w, kt, false);
      } else {
        stats_add<1>(sz, z, kt, both);
        if (!ignored) stats_add<1>(sw, w, kt, false);
      }
    });
    sz = block_stats(sz, kt, ssh);
    const float log_sz = logf(sz.st), log_s1 = both ? logf(sz.s1) : log_sz;
    if (threadIdx.x == 0 && b.lse) b.lse[r] = sz.m * inv_t + log_sz;
    if (ignored) {
      if (threadIdx.x == 0) write_row_outputs(b, o.hard, o.soft, r, 0.0f, 0.0f, 0.0f);
      if (want_grad) zero_row(grow, v);
      continue;
    }
    sw = block_stats(sw, kt, ssh);
    const float log_sw = logf(sw.st);

    const float hard = f.want_hard ? (sz.m - zy) + log_s1 : 0.0f;
    const float scale = want_grad ? grad_scale(b) : 0.0f;
    const float cs = want_grad && o.w_soft != 0.0f ? scale * o.w_soft * temp : 0.0f;
    const float ch = want_grad && f.hard_on ? scale * o.w_hard : 0.0f;
    const Dense hard_grad{sz.m, kt, 0.0f, log_s1 * kLog2e, 0.0f, ch};  // ch·q1_j
    const long long y = f.hard_on ? lab.y : -1;
    auto lq_at = [&](float z) { return (z - sz.m) * inv_t - log_sz; };
    auto lp_at = [&](float w) { return (w - sw.m) * inv_t - log_sw; };
    // Stores cnt gradient values from column j0: 8-wide when the gradient rows line up with the student's.
    auto store = [&](int64_t j0, float* g, int cnt) {
      if (y >= j0 && y < j0 + cnt) g[y - j0] -= ch;
      if (cnt == 8 && f.gvec) {
        rowk::store8(grow + j0, reinterpret_cast<float(&)[8]>(*g));
      } else {
        for (int i = 0; i < cnt; ++i) grow[j0 + i] = rowk::from_f<G>(g[i]);
      }
    };
    double dpart = 0.0, gpart = 0.0;
    if (fkl && want_grad) {
      // Forward KL: dD/dz_j = (q_j − p_j)/T needs no row-wide sum, so loss and gradient share this pass.
      for_pair(zr, wr, wt, wsize, v, f.vec, [&](int64_t j0, const float* z, const float* w, int cnt) {
        float g[8];
        for (int i = 0; i < cnt; ++i) {
          const float lq = lq_at(z[i]), lp = lp_at(w[i]);
          div_term(loss::DivergenceSpec{}, lp, lq, dpart);
          g[i] = cs * (expf(lq) - expf(lp)) + hard_grad.at(z[i]);
        }
        store(j0, g, cnt);
      });
    } else {
      for_pair(zr, wr, wt, wsize, v, f.vec, [&](int64_t, const float* z, const float* w, int cnt) {
        for (int i = 0; i < cnt; ++i) gpart += div_term(dv, lp_at(w[i]), lq_at(z[i]), dpart);
      });
    }
    const double dsum = block_reduce(dpart, SumOp{}, 0.0, dsh);
    const double gsum = block_reduce(gpart, SumOp{}, 0.0, dsh);
    if (!fkl && want_grad) {
      const float gs = float(gsum);
      for_pair(zr, wr, wt, wsize, v, f.vec, [&](int64_t j0, const float* z, const float* w, int cnt) {
        float g[8];
        for (int i = 0; i < cnt; ++i) {
          const float lq = lq_at(z[i]);
          double unused = 0.0;
          const float gj = div_term(dv, lp_at(w[i]), lq, unused);
          g[i] = cs * (gj - expf(lq) * gs) + hard_grad.at(z[i]);
        }
        store(j0, g, cnt);
      });
    }
    const float soft = temp * temp * float(dsum);
    if (threadIdx.x == 0)
      write_row_outputs(b, o.hard, o.soft, r,
                        (f.hard_on ? o.w_hard * hard : 0.0f) + (o.w_soft != 0.0f ? o.w_soft * soft : 0.0f),
                        hard, soft);
  }
}

}  // namespace

void distill_rows(const RowBlock& b, const DistillRows& o, const ErrorSink& err, void* stream) {
  const char* op = "distill_rows";
  check_common(b, o.labels, o.div, o.temperature, o.w_hard, o.w_soft, op);
  RT_CHECK(o.teacher && is_float(o.teacher_dtype) && (b.rows <= 1 || o.teacher_stride >= b.V), op,
           ": need f32 / bf16 / f16 teacher rows of stride >= V = ", b.V, ", got stride ", o.teacher_stride);
  if (b.rows == 0) return;
  DistillFlags f{};
  f.hard_on = o.labels.data && o.w_hard != 0.0f;
  f.want_hard = o.labels.data && (f.hard_on || o.hard);
  auto s = static_cast<cudaStream_t>(stream);
  if (!launch_distill_cluster(b, o, err, f, s)) {
    dispatch(b.dtype, b.grad ? b.grad_dtype : DType::F32, op, [&]<typename T, typename G>() {
      // The portable kernel: 8-wide on row pairs that line up (contiguous [N, 50257] student and teacher rows
      // of one dtype: each row pair shares its misalignment), one by one otherwise.
      DistillFlags fv = f;
      fv.vec = o.teacher_dtype == b.dtype && (b.rows <= 1 || o.teacher_stride == b.stride) &&
               (reinterpret_cast<uintptr_t>(o.teacher) - reinterpret_cast<uintptr_t>(b.logits)) % 16 == 0 &&
               reinterpret_cast<uintptr_t>(b.logits) % sizeof(T) == 0;
      fv.gvec = fv.vec && grad_vec_ok(b.logits, b.stride, sizeof(T), b.grad, b.grad_stride, sizeof(G));
      distill_kernel<T, G><<<grid_for(b.rows), kThreads, 0, s>>>(b, o, err, fv);
    });
  }
  RT_CUDA_LAUNCH_CHECK("distill_kernel");
}

}  // namespace retort::cuda
