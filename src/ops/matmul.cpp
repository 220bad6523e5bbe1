// matmul: batched C = op(A) op(B) with B's batch dims broadcast, f32 result. The shape rule and the backward
// rule live here; the CPU work is the packed GEMM in matmul_kernel.cpp, which reads any strides and float
// dtypes directly, so transposes and views never need a copy first.
#include <algorithm>
#include <string>
#include <vector>

#include "../core/error.h"
#include "../core/op_table.h"
#include "../core/thread_pool.h"
#include "matmul_kernel.h"
#include "ops.h"

namespace retort {

namespace {

// " (read transposed as [M, K] = [3, 4])": how matmul reads an operand, for error messages.
std::string read_as(bool trans, const char* dims, int64_t r, int64_t c) {
  return std::string(trans ? " (read transposed as " : " (read as ") + dims + " = [" + std::to_string(r) +
         ", " + std::to_string(c) + "])";
}

// The GEMM operand for matrix (i2, i3) of x: element (r, c) of op(x), where op transposes when `trans`.
gemm::Operand operand(const Tensor* x, bool trans, int64_t i2, int64_t i3) {
  gemm::Operand o;
  o.data = static_cast<const char*>(x->data) + i2 * int64_t(x->nb[2]) + i3 * int64_t(x->nb[3]);
  o.dtype = x->dtype;
  // Untransposed, rows run along dim 1 and columns along dim 0; transposed, the other way round.
  o.rs = int64_t(trans ? x->nb[0] : x->nb[1]);
  o.cs = int64_t(trans ? x->nb[1] : x->nb[0]);
  return o;
}

void cpu_matmul(Tensor* t, ThreadPool& pool) {
  const Tensor* a = t->src[0];
  const Tensor* b = t->src[1];
  const bool ta = t->ip[0] != 0, tb = t->ip[1] != 0;
  const int64_t m = t->ne[1], n = t->ne[0], k = ta ? a->ne[1] : a->ne[0];
  RT_ASSERT(t->is_contiguous());
  const bool f32_out = t->dtype == DType::F32;
  const int64_t batches = t->ne[2] * t->ne[3];
  const gemm::Kernel kernel = gemm::best_kernel();
  // Two bf16 operands multiply exactly in f32 either way; the bf16 GEMM only changes the order of the f32
  // sums, and where the CPU has bf16 dot products it does twice the work per instruction.
  const bool bf16_pairs = a->dtype == DType::BF16 && b->dtype == DType::BF16 &&
                          gemm::best_bf16_kernel() == gemm::Kernel::Avx512Bf16;
  // Graph::backward's addend (its C): the result is op(A) op(B) + C, C possibly the result's own storage (a
  // parameter's accumulator), read before the GEMM overwrites it; none in a run that starts the accumulator.
  const Tensor* addend = t->src[2] && !t->has(kFresh) ? t->src[2] : nullptr;
  // The GEMM adds into C itself (C is first set to the addend unless it already is the result's storage);
  // only the gemv path, which cannot accumulate, adds a copy of the addend after it.
  bool accumulate = false;
  std::vector<float> c_in;
  if (addend) {
    RT_ASSERT(f32_out && batches == 1 && addend->dtype == DType::F32 && addend->is_contiguous() &&
              addend->nelements() == t->nelements());
    const float* cp = static_cast<const float*>(addend->data);
    float* out = static_cast<float*>(t->data);
    if (gemm::gemv_applies(m, operand(a, ta, 0, 0), operand(b, tb, 0, 0))) {
      c_in.assign(cp, cp + t->nelements());
    } else {
      if (cp != out)
        pool.parallel_for(t->nelements(),
                          [&](int64_t i0, int64_t i1) { std::copy(cp + i0, cp + i1, out + i0); });
      accumulate = true;
    }
  }

  auto one = [&](int64_t batch, ThreadPool* p) {
    const int64_t i2 = batch % t->ne[2], i3 = batch / t->ne[2];
    char* out = static_cast<char*>(t->data) + i2 * t->nb[2] + i3 * t->nb[3];
    // A 16-bit result is accumulated in f32 and rounded once at the end, like a tensor-core GEMM's epilogue.
    std::vector<float> acc(f32_out ? 0 : size_t(m * n));
    float* c = f32_out ? reinterpret_cast<float*>(out) : acc.data();
    const gemm::Operand oa = operand(a, ta, i2, i3), ob = operand(b, tb, i2 % b->ne[2], i3 % b->ne[3]);
    if (bf16_pairs && !gemm::gemv_applies(m, oa, ob))
      gemm::bgemm(m, n, k, oa, ob, c, n, p, gemm::Kernel::Avx512Bf16, accumulate);
    else
      gemm::sgemm(m, n, k, oa, ob, c, n, p, kernel, accumulate);
    if (!f32_out)
      for (int64_t i = 0; i < m * n; ++i) store_f32(out, t->dtype, i, acc[size_t(i)]);
  };
  // Many small matrices (attention heads): one whole GEMM per thread beats splitting each one, which would
  // pay a fork and join per block. Large ones split inside, where the threads share the packed B block.
  const double flops = 2.0 * double(m) * double(n) * double(k);
  const int threads = pool.size();
  const bool per_batch = batches > 1 && (flops < 8.0e6 || batches % threads == 0 || batches >= 4 * threads);
  if (per_batch) {
    pool.parallel_for(batches, [&](int64_t b0, int64_t b1) {
      for (int64_t i = b0; i < b1; ++i) one(i, nullptr);
    });
  } else {
    for (int64_t i = 0; i < batches; ++i) one(i, &pool);
  }
  if (!c_in.empty()) {
    float* out = static_cast<float*>(t->data);
    pool.parallel_for(int64_t(c_in.size()), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) out[i] += c_in[size_t(i)];
    });
  }
}

// With Ã = op(A) [M, K], B̃ = op(B) [K, N] and G = dC [M, N]: dÃ = G B̃ᵀ and dB̃ = Ãᵀ G, each written as one
// matmul whose transpose flags read the stored operands directly (no transposed copies).
void back_matmul(BackwardCtx& bc, Tensor* t, Tensor* g) {
  Context& ctx = bc.ctx;
  Tensor* a = t->src[0];
  Tensor* b = t->src[1];
  const bool ta = t->ip[0] != 0, tb = t->ip[1] != 0;
  // matmul_lowp: the gradient GEMMs take the 16-bit operands' dtype for G too (one rounding, shared by both;
  // none when G already comes in it, from a 16-bit consumer).
  if (t->ip[2] != 0 && g->dtype != a->dtype) g = cast(ctx, g, a->dtype);
  if (bc.needs(a)) {
    Tensor* da;
    if (!ta) {
      da = matmul(ctx, g, b, false, !tb);  // G B̃ᵀ, shaped like A
    } else if (b->ne[2] == a->ne[2] && b->ne[3] == a->ne[3]) {
      da = matmul(ctx, b, g, tb, true);  // (G B̃ᵀ)ᵀ = B̃ Gᵀ, shaped like the stored A [K, M]
    } else {
      // B̃ Gᵀ would put the broadcast operand first, which matmul does not allow: transpose a view instead.
      da = transpose(ctx, matmul(ctx, g, b, false, !tb));
    }
    bc.add(a, da);
  }
  if (bc.needs(b)) {
    // Untransposed: Ãᵀ G [K, N]. Transposed (B stored [N, K]): (Ãᵀ G)ᵀ = Gᵀ Ã.
    Tensor* db = tb ? matmul(ctx, g, a, true, ta) : matmul(ctx, a, g, !ta, false);
    // A broadcast B collects the gradient of every batch it was used in.
    if (!same_shape(db, b)) db = reduce_to(ctx, db, b->ne);
    bc.add(b, db);
  }
  if (t->src[2] && bc.needs(t->src[2])) bc.add(t->src[2], g);  // matmul_add's c
}

}  // namespace

namespace {

Tensor* matmul_node(Context& ctx, Tensor* a, Tensor* b, bool transpose_a, bool transpose_b, DType out) {
  RT_CHECK(a && b, "matmul: null operand");
  RT_CHECK(is_float(a->dtype) && is_float(b->dtype),
           "matmul: operands must be float tensors (f32, bf16, f16), ", "got A ", a->describe(), " and B ",
           b->describe());
  const int64_t m = transpose_a ? a->ne[0] : a->ne[1];
  const int64_t ka = transpose_a ? a->ne[1] : a->ne[0];
  const int64_t kb = transpose_b ? b->ne[0] : b->ne[1];
  const int64_t n = transpose_b ? b->ne[1] : b->ne[0];
  const std::string how_a = read_as(transpose_a, "[M, K]", m, ka);
  const std::string how_b = read_as(transpose_b, "[K, N]", kb, n);
  RT_CHECK(ka == kb, "matmul: inner dimensions differ: A ", a->describe(), how_a, " has K = ", ka, " but B ",
           b->describe(), how_b, " has K = ", kb);
  for (int d = 2; d < kMaxDims; ++d)
    RT_CHECK(b->ne[d] == 1 || b->ne[d] == a->ne[d], "matmul: batch dims of B ", b->describe(),
             " must each be 1 or equal to A's ", a->describe(), " (dim ", d, ": ", b->ne[d], " vs ", a->ne[d],
             "); only B broadcasts");
  const int64_t ne[kMaxDims] = {n, m, a->ne[2], a->ne[3]};
  Tensor* t = ctx.node(Op::Matmul, out, ne);
  t->src[0] = a;
  t->src[1] = b;
  t->ip[0] = transpose_a ? 1 : 0;
  t->ip[1] = transpose_b ? 1 : 0;
  return t;
}

}  // namespace

Tensor* matmul(Context& ctx, Tensor* a, Tensor* b, bool transpose_a, bool transpose_b) {
  return matmul_node(ctx, a, b, transpose_a, transpose_b, DType::F32);
}

Tensor* matmul_lowp(Context& ctx, Tensor* a, Tensor* b, bool transpose_a, bool transpose_b, DType out) {
  RT_CHECK(a && b, "matmul_lowp: null operand");
  RT_CHECK((a->dtype == DType::BF16 || a->dtype == DType::F16) && b->dtype == a->dtype,
           "matmul_lowp: operands must share a 16-bit float dtype (bf16 or f16), got A ", a->describe(),
           " and B ", b->describe());
  RT_CHECK(out == DType::F32 || out == a->dtype,
           "matmul_lowp: the result must be f32 or the operands' dtype ", dtype_name(a->dtype), ", got ",
           dtype_name(out), " for A ", a->describe(), " and B ", b->describe());
  Tensor* t = matmul_node(ctx, a, b, transpose_a, transpose_b, out);
  t->ip[2] = 1;
  return t;
}

Tensor* matmul_add(Context& ctx, Tensor* a, Tensor* b, Tensor* c, bool transpose_a, bool transpose_b) {
  RT_CHECK(a && b && c, "matmul_add: null operand");
  const bool lowp = a->dtype == DType::BF16 || a->dtype == DType::F16;
  Tensor* t = lowp ? matmul_lowp(ctx, a, b, transpose_a, transpose_b) : matmul(ctx, a, b, transpose_a, transpose_b);
  RT_CHECK(t->ne[2] == 1 && t->ne[3] == 1 && c->dtype == DType::F32 && c->is_contiguous() && same_shape(c, t),
           "matmul_add: the addend must be a contiguous f32 tensor shaped like the 2-D result ",
           shape_str(t->ne), ", got ", c->describe(), " for A ", a->describe(), " and B ", b->describe());
  t->src[2] = c;
  return t;
}

void register_matmul_ops(OpTable& t) {
  t[size_t(Op::Matmul)] = {cpu_matmul, back_matmul, true};
}

}  // namespace retort
