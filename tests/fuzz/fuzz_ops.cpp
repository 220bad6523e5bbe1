// libFuzzer harness for the public ops (src/ops/ops.h, src/ops/loss/losses.h, src/ops/loss/fused_linear.h)
// on the CPU backend. The input is a little program: a few small leaves (every dtype, parameters or not, with
// values that include NaN, ±inf, ±1e4 and ids outside the vocabulary), then up to 12 op calls on them and on
// earlier results, with sizes, starts, axes and options drawn mostly from the overflow edges (2^31, 2^32,
// 2^48, 2^62, INT64_MAX, negatives), and shapes from views, permutes and slices, so strided operands reach
// every kernel. The last result is computed (and, when a parameter reaches it, differentiated through sum())
// when its plan and its arithmetic are small enough to run in a moment. A retort::Error anywhere is the
// expected answer to a bad call; any other exception, an internal assertion, a crash or a sanitizer report
// is a finding. Run it with tools/fuzz.sh (seeds: tests/fuzz/seeds_ops.cpp).
// SOURCES: src/core/*.cpp src/ops/*.cpp src/ops/loss/*.cpp src/cuda/cuda_stub.cpp
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <typeinfo>
#include <vector>

#include "core/cpu_backend.h"
#include "core/graph.h"
#include "fuzz_util.h"
#include "ops/loss/fused_linear.h"
#include "ops/loss/losses.h"
#include "ops/ops.h"

namespace {

using namespace retort;

constexpr const char* kName = "fuzz_ops";
constexpr int64_t kMaxLeafElements = 4096;
constexpr size_t kMaxArenaBytes = size_t(4) << 20;  // a larger plan is built but not run
constexpr double kMaxWork = double(1 << 24);        // multiply-adds of the plan's GEMMs and row passes

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
// Sizes around every width a size computation could wrap at.
constexpr int64_t kEdges[] = {0,
                              -1,
                              -2,
                              -100,
                              kI64Min,
                              kI64Max,
                              kI64Max - 1,
                              int64_t(1) << 31,
                              (int64_t(1) << 31) - 1,
                              (int64_t(1) << 31) + 1,
                              int64_t(1) << 32,
                              (int64_t(1) << 32) - 1,
                              (int64_t(1) << 32) + 1,
                              int64_t(1) << 48,
                              (int64_t(1) << 48) + 1,
                              int64_t(1) << 62,
                              (int64_t(1) << 62) + 1,
                              int64_t(1) << 61,
                              int64_t(1) << 30,
                              int64_t(1) << 20,
                              65536,
                              8193,
                              2049};
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kFloats[] = {0.0f,   -0.0f, 1.0f,  -1.0f, 0.5f,    2.0f,  1e-30f, 1e30f,
                             1e4f,   -1e4f, NAN,   kInf,  -kInf,   3e38f, 1e-45f, 100.0f,
                             -0.5f,  0.3f,  1.5f,  7.0f,  -3.0f,   0.25f, 1e-6f,  65504.0f,
                             -1e30f, 0.1f,  0.01f, 30.0f, 1.0001f, 0.75f, -2.0f,  4.0f};
constexpr DType kDtypes[] = {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64};
constexpr Reduction kReductions[] = {Reduction::Mean, Reduction::Sum, Reduction::None};

// Reads the input front to back; past the end every read is 0.
class Bytes {
 public:
  Bytes(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  bool empty() const { return i_ >= n_; }
  uint8_t u8() { return i_ < n_ ? d_[i_++] : 0; }
  bool flag() { return u8() & 1; }
  int64_t raw64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | u8();
    return int64_t(v);
  }
  // Mostly small (what a working call uses), else an edge, else any 64-bit value.
  int64_t size() {
    const uint8_t b = u8();
    if (b < 160) return b % 10;
    if (b < 240) return kEdges[b % std::size(kEdges)];
    return raw64();
  }
  // A small count in [1, hi], or now and then an edge.
  int64_t dim(int64_t hi) {
    const uint8_t b = u8();
    return b < 224 ? 1 + b % hi : kEdges[b % std::size(kEdges)];
  }
  float real() {
    const uint8_t b = u8();
    if (b < 192) return kFloats[b % std::size(kFloats)];
    uint32_t bits = 0;
    for (int i = 0; i < 4; ++i) bits = bits << 8 | u8();
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }

 private:
  const uint8_t* d_;
  size_t n_, i_ = 0;
};

// Elements of a public shape, or -1 when a dim is < 1 or the count passes kMaxLeafElements.
int64_t small_count(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d < 1 || d > kMaxLeafElements) return -1;
    n *= d;
    if (n > kMaxLeafElements) return -1;
  }
  return n;
}

Shape read_shape(Bytes& in, int64_t hi) {
  Shape s(size_t(1 + in.u8() % 5));  // 5 dims must be refused
  for (int64_t& d : s) d = in.dim(hi);
  return s;
}

struct Program {
  Context& ctx;
  Bytes& in;
  std::vector<Tensor*> pool;

  Tensor* pick() { return pool.empty() ? nullptr : pool[in.u8() % pool.size()]; }
  // A tensor of the pool, or null (the optional inputs) now and then.
  Tensor* maybe() { return in.u8() < 200 ? pick() : nullptr; }
  Reduction reduction() { return kReductions[in.u8() % 3]; }
  void keep(Tensor* t) {
    if (t) pool.push_back(t);
  }
  void keep(const LossOutputs& o) {
    for (Tensor* t : {o.loss, o.per_row, o.lse, o.hard, o.soft}) keep(t);
  }

  void leaf() {
    const DType dt = kDtypes[in.u8() % std::size(kDtypes)];
    const Shape shape = read_shape(in, 9);
    const int64_t n = small_count(shape);
    if (n < 0) {
      // Only sizes past what a backend can address are asked for: a smaller large one would really be
      // allocated. They must be refused before anything is.
      double bytes = double(dtype_size(dt));
      for (int64_t d : shape) bytes *= double(d);
      bool bad_dim = false;
      for (int64_t d : shape) bad_dim |= d < 1;
      if (!bad_dim && bytes <= 0x1p48) return;
      try {
        ctx.tensor(dt, shape);
      } catch (const Error& e) {
        fuzz::check_error(kName, e);
        return;
      }
      fuzz::finding(kName, "leaf", "a leaf of shape with a bad or huge size was made");
    }
    const bool param = is_float(dt) && in.flag();
    Tensor* t = param ? ctx.param(dt, shape, "p") : ctx.input(dt, shape, "x");
    if (is_float(dt)) {
      std::vector<float> v(static_cast<size_t>(n));
      const uint8_t mode = in.u8();
      for (int64_t i = 0; i < n; ++i)
        v[size_t(i)] = mode < 128 ? float(int(in.u8()) - 128) / 32.0f : in.real();
      set_data(t, v);
    } else {
      std::vector<int64_t> v(static_cast<size_t>(n));
      const uint8_t mode = in.u8();
      for (int64_t i = 0; i < n; ++i) v[size_t(i)] = mode < 192 ? int64_t(in.u8() % 12) - 1 : in.size();
      set_data_int(t, v);
    }
    keep(t);
  }

  FusedLinearOptions fused() {
    FusedLinearOptions f;
    const uint8_t b = in.u8();
    if (b & 1) f.chunk_rows = in.size();
    if (b & 2) f.logits_budget = size_t(in.size());
    f.grad_hidden = !(b & 4);
    f.grad_weight = !(b & 8);
    f.grad_bias = !(b & 16);
    if (b & 32) f.logits_dtype = kDtypes[in.u8() % std::size(kDtypes)];
    return f;
  }
  TopKDistillOptions topk_options() {
    TopKDistillOptions o;
    o.beta = in.flag() ? in.real() : float(in.u8() % 3) / 2.0f;
    o.temperature = in.flag() ? in.real() : 1.0f + float(in.u8() % 3);
    o.normalize_topk = in.flag();
    o.w_hard = in.flag() ? in.real() : 0.0f;
    o.w_soft = in.flag() ? in.real() : 1.0f;
    o.ignore_index = in.flag() ? in.size() : -1;
    o.reduction = reduction();
    const uint8_t b = in.u8();
    o.return_per_row = b & 1;
    o.return_lse = b & 2;
    o.return_parts = b & 4;
    return o;
  }
  DistillOptions distill_options() {
    const TopKDistillOptions t = topk_options();
    DistillOptions o;
    o.beta = t.beta;
    o.temperature = t.temperature;
    o.w_hard = t.w_hard;
    o.w_soft = t.w_soft;
    o.ignore_index = t.ignore_index;
    o.reduction = t.reduction;
    o.return_per_row = t.return_per_row;
    o.return_lse = t.return_lse;
    o.return_parts = t.return_parts;
    return o;
  }
  CrossEntropyOptions ce_options() {
    CrossEntropyOptions o;
    o.ignore_index = in.flag() ? in.size() : -1;
    o.label_smoothing = in.flag() ? in.real() : 0.0f;
    o.z_loss = in.flag() ? in.real() : 0.0f;
    o.softcap = in.flag() ? in.real() : 0.0f;
    o.reduction = reduction();
    const uint8_t b = in.u8();
    o.return_per_row = b & 1;
    o.return_lse = b & 2;
    return o;
  }
  void ne4(int64_t ne[kMaxDims]) {
    for (int i = 0; i < kMaxDims; ++i) ne[i] = in.u8() < 200 ? 1 + in.u8() % 8 : in.size();
  }

  // One op call on tensors of the pool.
  void op() {
    const uint8_t code = in.u8();
    Tensor* a = pick();
    if (!a) return;
    switch (code % 57) {
      case 0:
        keep(reshape(ctx, a, read_shape(in, 12)));
        break;
      case 1: {
        const int p0 = int(in.size()), p1 = int(in.size()), p2 = int(in.size()), p3 = int(in.size());
        keep(permute(ctx, a, p0, p1, p2, p3));
        break;
      }
      case 2:
        keep(transpose(ctx, a));
        break;
      case 3: {
        const int dim = int(in.size());
        const int64_t start = in.size(), len = in.size();
        keep(slice(ctx, a, dim, start, len));
        break;
      }
      case 4:
        keep(contiguous(ctx, a));
        break;
      case 5:
        keep(cast(ctx, a, kDtypes[in.u8() % std::size(kDtypes)]));
        break;
      case 6:
        keep(concat(ctx, a, pick(), int(in.size())));
        break;
      case 7: {
        int64_t ne[kMaxDims];
        ne4(ne);
        keep(fill(ctx, kDtypes[in.u8() % std::size(kDtypes)], ne, in.real()));
        break;
      }
      case 8:
        keep(add(ctx, a, pick()));
        break;
      case 9:
        keep(sub(ctx, a, pick()));
        break;
      case 10:
        keep(mul(ctx, a, pick()));
        break;
      case 11:
        keep(div(ctx, a, pick()));
        break;
      case 12:
        keep(scale(ctx, a, in.real()));
        break;
      case 13:
        keep(neg(ctx, a));
        break;
      case 14:
        keep(exp(ctx, a));
        break;
      case 15:
        keep(log(ctx, a));
        break;
      case 16:
        keep(sqrt(ctx, a));
        break;
      case 17:
        keep(rsqrt(ctx, a));
        break;
      case 18:
        keep(tanh(ctx, a));
        break;
      case 19:
        keep(relu(ctx, a));
        break;
      case 20:
        keep(gelu(ctx, a));
        break;
      case 21:
        keep(silu(ctx, a));
        break;
      case 22:
        keep(sum_rows(ctx, a));
        break;
      case 23:
        keep(mean_rows(ctx, a));
        break;
      case 24:
        keep(max_rows(ctx, a));
        break;
      case 25:
        keep(sum(ctx, a));
        break;
      case 26:
        keep(mean(ctx, a));
        break;
      case 27:
        keep(max(ctx, a));
        break;
      case 28: {
        int64_t ne[kMaxDims];
        ne4(ne);
        keep(repeat(ctx, a, ne));
        break;
      }
      case 29: {
        int64_t ne[kMaxDims];
        ne4(ne);
        keep(reduce_to(ctx, a, ne));
        break;
      }
      case 30: {
        const uint8_t t = in.u8();
        keep(matmul(ctx, a, pick(), t & 1, t & 2));
        break;
      }
      case 31: {
        const uint8_t t = in.u8();
        keep(matmul_lowp(ctx, a, pick(), t & 1, t & 2));
        break;
      }
      case 32:
        keep(get_rows(ctx, a, pick()));
        break;
      case 33: {
        Tensor* src = pick();
        keep(set_rows(ctx, a, src, pick()));
        break;
      }
      case 34:
        keep(softmax(ctx, a));
        break;
      case 35:
        keep(log_softmax(ctx, a));
        break;
      case 36: {
        const float s = in.real();
        keep(causal_softmax(ctx, a, s, in.size()));
        break;
      }
      case 37: {
        const TopKLogprobs r = topk_logprobs(ctx, a, in.size());
        keep(r.logprobs);
        keep(r.ids);
        break;
      }
      case 38:
        keep(rms_norm(ctx, a, in.real()));
        break;
      case 39:
        keep(layer_norm(ctx, a, in.real()));
        break;
      case 40: {
        Tensor* pos = pick();
        const RopeMode mode = in.flag() ? RopeMode::Neox : RopeMode(in.size());
        keep(rope(ctx, a, pos, mode, in.real()));
        break;
      }
      case 41:
        keep(cross_entropy(ctx, a, pick(), in.size()));
        break;
      case 42:
        keep(cross_entropy_loss(ctx, a, pick(), ce_options()));
        break;
      case 43: {
        Tensor *ids = pick(), *lp = pick(), *mask = maybe(), *labels = maybe();
        keep(topk_kd(ctx, a, ids, lp, mask, labels, topk_options()));
        break;
      }
      case 44: {
        Tensor *lp = pick(), *mask = maybe();
        TopKKLOptions o;
        o.temperature = in.flag() ? in.real() : 1.0f;
        o.reduction = reduction();
        o.return_per_row = in.flag();
        o.return_lse = in.flag();
        keep(topk_kl_gathered(ctx, a, lp, mask, o));
        break;
      }
      case 45: {
        Tensor *teacher = pick(), *labels = maybe();
        keep(distill(ctx, a, teacher, labels, distill_options()));
        break;
      }
      case 46: {
        const float t = in.flag() ? in.real() : 1.0f;
        keep(entropy(ctx, a, t, reduction()));
        break;
      }
      case 47:
        keep(selective_log_softmax(ctx, a, pick()));
        break;
      case 48: {
        const DType dt = kDtypes[in.u8() % std::size(kDtypes)];
        keep(logits_grad(ctx, a, dt, in.flag()));
        break;
      }
      case 49: {
        Tensor* g = pick();
        keep(selective_log_softmax_grad(ctx, a, g, kDtypes[in.u8() % std::size(kDtypes)]));
        break;
      }
      case 50: {
        Tensor *w = pick(), *bias = maybe(), *labels = pick();
        const CrossEntropyOptions o = ce_options();
        keep(fused_linear_cross_entropy(ctx, a, w, bias, labels, o, fused()));
        break;
      }
      case 51: {
        Tensor *w = pick(), *bias = maybe(), *ids = pick(), *lp = pick(), *mask = maybe(), *labels = maybe();
        const TopKDistillOptions o = topk_options();
        keep(fused_linear_topk_kd(ctx, a, w, bias, ids, lp, mask, labels, o, fused()));
        break;
      }
      case 52: {
        Tensor *w = pick(), *bias = maybe(), *th = pick(), *tw = pick(), *tb = maybe(), *labels = maybe();
        const DistillOptions o = distill_options();
        keep(fused_linear_distill(ctx, a, w, bias, th, tw, tb, labels, o, fused()));
        break;
      }
      case 53: {
        Tensor *w = pick(), *bias = maybe();
        const float t = in.flag() ? in.real() : 1.0f;
        const Reduction r = reduction();
        keep(fused_linear_entropy(ctx, a, w, bias, t, r, fused()));
        break;
      }
      case 54: {
        Tensor *w = pick(), *bias = maybe(), *ids = pick();
        keep(fused_linear_selective_log_softmax(ctx, a, w, bias, ids, fused()));
        break;
      }
      case 55:
        keep(reshape(ctx, a, {in.size(), in.size()}));
        break;
      case 56: {
        Tensor *w = pick(), *targets = maybe();
        TopKLogprobsOptions o;
        o.ignore_index = in.flag() ? -100 : in.size();
        o.return_lse = in.flag();
        const TopKLogprobsOutputs r = fused_linear_topk_logprobs(ctx, a, w, in.size(), targets, o, fused());
        keep(r.logprobs);
        keep(r.ids);
        keep(r.nll_sum);
        keep(r.lse);
        break;
      }
    }
  }
};

// The multiply-adds a plan costs, roughly: every node's elements times the row it reads, and the GEMMs of
// matmuls and fused linear losses in full.
double work_of(const std::vector<Tensor*>& nodes) {
  double w = 0;
  for (const Tensor* t : nodes) {
    double n = double(t->nelements());
    double row = 1;
    for (const Tensor* s : t->src)
      if (s) row = std::max(row, double(s->ne[0]));
    if (t->op == Op::Matmul) n *= row;
    if (t->op >= Op::FusedLinearCrossEntropy && t->op <= Op::FusedLinearBack) {
      const Tensor* h = t->src[0];
      const Tensor* wt = t->src[1];
      n = 4.0 * double(h->nelements()) * double(wt->ne[1]) * (t->src[4] ? 2.0 : 1.0);
    }
    w += n + double(t->nelements()) * row;
  }
  return w;
}

void run(Context& ctx, Tensor* root, bool diff) {
  Graph g(ctx);
  g.forward(root);
  if (diff && is_float(root->dtype)) {
    bool has_param = false;
    for (Tensor* t : g.nodes()) has_param |= t->has(kParam);
    if (has_param) {
      Tensor* loss = root->nelements() == 1 && root->dtype == DType::F32 ? root : sum(ctx, root);
      g.forward(loss);
      g.backward(loss);
    }
  }
  if (g.plan().arena_bytes > kMaxArenaBytes || work_of(g.nodes()) > kMaxWork) return;
  g.compute();
  (void)get_bytes(root);
  for (Tensor* p : g.params()) (void)get_data(g.grad(p));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // One thread: the kernels' results do not depend on it, and runs stay reproducible and fast.
  static CpuBackend backend(1);
  Bytes in(data, size);
  Context ctx(backend);
  Program prog{ctx, in, {}};
  try {
    const int leaves = 1 + in.u8() % 4;
    for (int i = 0; i < leaves; ++i) {
      try {
        prog.leaf();
      } catch (const Error& e) {
        fuzz::check_error(kName, e);
      }
    }
    for (int i = 0; i < 12 && !in.empty(); ++i) {
      try {
        prog.op();
      } catch (const Error& e) {
        fuzz::check_error(kName, e);
      }
    }
    if (!prog.pool.empty()) {
      try {
        run(ctx, prog.pool.back(), in.flag());
      } catch (const Error& e) {
        fuzz::check_error(kName, e);
      }
    }
  } catch (const std::exception& e) {
    fuzz::finding(kName, "not a retort::Error", std::string(typeid(e).name()) + ": " + e.what());
  }
  return 0;
}
