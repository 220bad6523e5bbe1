// The scheduler's contract with its executors and the fused nodes' place in the graph: the calls a chunk
// makes (three GEMMs for the student, one more for an online teacher, none on the K-sparse path), that the
// scheduler never touches executor memory itself (a device backend can reuse it unchanged), results that do
// not depend on the thread count, the single-pass gradient, the recomputing backward for per-row upstream
// gradients, and the switches that turn gradients off.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#if defined(__unix__)
#include <sys/mman.h>
#endif

#include "ops/loss/chunk_scheduler.h"
#include "test_fused_linear_ref.h"

namespace retort::test {
namespace {

// Wraps an executor (or none) and records every call; with no inner executor nothing is computed, so any
// memory may stand in for the data.
class Recorder : public loss::ChunkExecutor {
 public:
  explicit Recorder(loss::ChunkExecutor* inner, void* fake_scratch = nullptr)
      : inner_(inner), fake_scratch_(fake_scratch) {}
  std::vector<std::string> calls;
  int64_t max_logits_rows = 0;  // the most rows any GEMM wrote at once into a [rows, V] block
  int64_t v = 0;

  int64_t validate(const loss::LossSpec& s, int64_t rows, int64_t vv, Reduction red,
                   const std::string& what) override {
    calls.push_back("validate");
    v = vv;
    return inner_ ? inner_->validate(s, rows, vv, red, what) : rows;
  }
  void* scratch(size_t bytes) override {
    calls.push_back("scratch");
    return inner_ ? inner_->scratch(bytes) : fake_scratch_;
  }
  void gemm(const loss::Block& a, bool ta, const loss::Block& b, bool tb, const loss::Block& c, float alpha,
            float beta) override {
    calls.push_back(beta == 0.0f ? "gemm" : "gemm+=");
    if (c.cols == v) max_logits_rows = std::max(max_logits_rows, c.rows);
    if (inner_) inner_->gemm(a, ta, b, tb, c, alpha, beta);
  }
  void add_bias(const loss::Block& c, const loss::Block& bias) override {
    calls.push_back("bias");
    if (inner_) inner_->add_bias(c, bias);
  }
  void column_sums(const loss::Block& g, const loss::Block& d, bool acc) override {
    calls.push_back(acc ? "colsum+=" : "colsum");
    if (inner_) inner_->column_sums(g, d, acc);
  }
  void scale_rows(const loss::Block& g, const loss::Block& u) override {
    calls.push_back("scale_rows");
    if (inner_) inner_->scale_rows(g, u);
  }
  void zero(const loss::Block& b) override {
    calls.push_back("zero");
    if (inner_) inner_->zero(b);
  }
  void row_loss(const loss::LossSpec& s, const loss::Block& x, const loss::RowOut& o) override {
    calls.push_back(o.grad.empty() ? "loss" : "loss+grad");
    if (inner_) inner_->row_loss(s, x, o);
  }
  void reduce(const float* p, int64_t n, float scale, float* out) override {
    calls.push_back("reduce");
    if (inner_) inner_->reduce(p, n, scale, out);
  }
  void gather_logits(const loss::Block& h, const loss::Block& w, const loss::Block& b,
                     const loss::TopKSide& s, const loss::Block& o) override {
    calls.push_back("gather");
    if (inner_) inner_->gather_logits(h, w, b, s, o);
  }
  void scatter_grads(const loss::Block& g, const loss::Block& h, const loss::Block& w,
                     const loss::TopKSide& s, const loss::SparseGrads& o) override {
    calls.push_back("scatter");
    if (inner_) inner_->scatter_grads(g, h, w, s, o);
  }

  size_t auto_bytes = 0;  // > 0: the automatic budget this executor reports
  loss::ExecutorCaps caps() const override {
    loss::ExecutorCaps c = inner_ ? inner_->caps() : loss::ExecutorCaps{};
    if (auto_bytes) c.auto_budget = auto_bytes;
    return c;
  }

  int count(const std::string& what) const { return int(std::count(calls.begin(), calls.end(), what)); }

 private:
  loss::ChunkExecutor* inner_;
  void* fake_scratch_;
};

// Host data for a scheduler problem: hidden [n, h], weight [v, h], bias [v], labels, top-K side data and
// gradients, all f32 / i32.
struct HostProblem {
  int64_t n = 10, h = 8, v = 37, k = 4, ht = 5;
  std::vector<float> hidden, weight, bias, lp, th, tw, dh, dw, db, loss;
  std::vector<int32_t> labels, ids;

  explicit HostProblem(const std::string& key) {
    reseed(key);
    auto fill = [](std::vector<float>& x, int64_t count, double lo, double hi) {
      for (double d : random_vec(count, lo, hi)) x.push_back(float(d));
    };
    fill(hidden, n * h, -2, 2);
    fill(weight, v * h, -1, 1);
    fill(bias, v, -0.5, 0.5);
    fill(lp, n * k, -4, -0.1);
    fill(th, n * ht, -2, 2);
    fill(tw, v * ht, -1, 1);
    for (int64_t x : random_ints(n, -1, v)) labels.push_back(int32_t(x));
    for (int64_t x : random_ints(n * k, 0, v)) ids.push_back(int32_t(x));
    dh.assign(size_t(n * h), -1);
    dw.assign(size_t(v * h), -1);
    db.assign(size_t(v), -1);
    loss.assign(1, -1);
  }

  loss::FusedLinearProblem problem(loss::LossKind kind, int64_t chunk) {
    loss::FusedLinearProblem p;
    p.hidden = loss::Block::dense(hidden.data(), DType::F32, n, h);
    p.weight = loss::Block::dense(weight.data(), DType::F32, v, h);
    p.bias = loss::Block::dense(bias.data(), DType::F32, 1, v);
    p.spec.kind = kind;
    const loss::Block lab{labels.data(), DType::I32, n, 1, sizeof(int32_t), sizeof(int32_t)};
    p.spec.ce.labels = lab;
    p.spec.ce.ignore_index = -1;
    p.spec.topk.ids = loss::Block::dense(ids.data(), DType::I32, n, k);
    p.spec.topk.logprobs = loss::Block::dense(lp.data(), DType::F32, n, k);
    p.spec.topk.labels = lab;
    p.spec.topk.ignore_index = -1;
    p.spec.distill.labels = lab;
    p.spec.distill.ignore_index = -1;
    if (kind == loss::LossKind::Distill) {
      p.teacher_hidden = loss::Block::dense(th.data(), DType::F32, n, ht);
      p.teacher_weight = loss::Block::dense(tw.data(), DType::F32, v, ht);
    }
    p.loss = loss.data();
    p.dhidden = loss::Block::dense(dh.data(), DType::F32, n, h);
    p.dweight = loss::Block::dense(dw.data(), DType::F32, v, h);
    p.dbias = loss::Block::dense(db.data(), DType::F32, 1, v);
    p.chunk_rows = chunk;
    p.what = "test";
    return p;
  }
};

ThreadPool& pool() {
  return default_cpu_backend().pool();
}

// logits_budget 0 is the executor's automatic budget, asked once per call; an explicit one is kept.
TEST(FusedLinearScheduler, AutomaticBudgetComesFromTheExecutor) {
  HostProblem hp("sched_auto");
  auto cpu = loss::make_cpu_chunk_executor(pool());
  const size_t row = 128 * sizeof(float);  // V = 37 padded to 128, f32 logits
  for (auto [bytes, rows] :
       {std::pair<size_t, int64_t>{3 * row, 3}, {5 * row + 7, 5}, {size_t(1) << 30, 10}}) {
    Recorder rec(cpu.get());
    rec.auto_bytes = bytes;
    loss::FusedLinearProblem p = hp.problem(loss::LossKind::CrossEntropy, 0);
    p.logits_budget = kFusedLinearAutoBudget;
    loss::run_fused_linear(rec, p);
    EXPECT_EQ(rec.max_logits_rows, rows) << bytes;
    Recorder fixed(cpu.get());
    fixed.auto_bytes = bytes;
    p.logits_budget = 2 * row;
    loss::run_fused_linear(fixed, p);
    EXPECT_EQ(fixed.max_logits_rows, 2) << bytes;
  }
  // The rule: an eighth of the free memory, clamped per backend.
  EXPECT_EQ(fused_linear_auto_budget(0, kFusedLinearAutoMaxGpu), kFusedLinearAutoMin);
  EXPECT_EQ(fused_linear_auto_budget(size_t(4) << 30, kFusedLinearAutoMaxGpu), size_t(512) << 20);
  EXPECT_EQ(fused_linear_auto_budget(size_t(80) << 30, kFusedLinearAutoMaxGpu), kFusedLinearAutoMaxGpu);
  EXPECT_EQ(fused_linear_auto_budget(size_t(80) << 30, kFusedLinearAutoMaxCpu), kFusedLinearAutoMaxCpu);
  // The CPU executor's own: within those bounds.
  const size_t b = cpu->caps().auto_budget;
  EXPECT_GE(b, kFusedLinearAutoMin);
  EXPECT_LE(b, kFusedLinearAutoMaxCpu);
}

TEST(FusedLinearScheduler, CallsPerChunk) {
  HostProblem hp("sched_calls");
  auto cpu = loss::make_cpu_chunk_executor(pool());
  // Cross-entropy, 10 rows in chunks of 4: three chunks of logits GEMM, bias, loss with gradient, dhidden
  // GEMM, dW GEMM (the first overwrites, the others accumulate), bias column sums.
  {
    Recorder rec(cpu.get());
    loss::run_fused_linear(rec, hp.problem(loss::LossKind::CrossEntropy, 4));
    const std::vector<std::string> chunk0 = {"gemm", "bias", "loss+grad", "gemm", "gemm", "colsum"};
    const std::vector<std::string> later = {"gemm", "bias", "loss+grad", "gemm", "gemm+=", "colsum+="};
    std::vector<std::string> want = {"validate", "scratch"};
    want.insert(want.end(), chunk0.begin(), chunk0.end());
    for (int i = 0; i < 2; ++i) want.insert(want.end(), later.begin(), later.end());
    want.push_back("reduce");
    EXPECT_EQ(rec.calls, want);
    EXPECT_EQ(rec.max_logits_rows, 4);
  }
  // Forward only: one GEMM per chunk.
  {
    Recorder rec(cpu.get());
    loss::FusedLinearProblem p = hp.problem(loss::LossKind::CrossEntropy, 3);
    p.dhidden = p.dweight = p.dbias = {};
    loss::run_fused_linear(rec, p);
    EXPECT_EQ(rec.count("gemm"), 4);
    EXPECT_EQ(rec.count("loss"), 4);
    EXPECT_EQ(rec.count("gemm+="), 0);
  }
  // Online teacher: one more GEMM per chunk (no teacher bias here: no second bias call).
  {
    Recorder rec(cpu.get());
    loss::run_fused_linear(rec, hp.problem(loss::LossKind::Distill, 5));
    EXPECT_EQ(rec.count("gemm") + rec.count("gemm+="), 2 * 4);
    EXPECT_EQ(rec.count("bias"), 2);
  }
  // K-sparse top-K: no GEMM at all; the first chunk's scatter overwrites dW and dbias (no zeroing pass),
  // the later ones add slot by slot.
  {
    Recorder rec(cpu.get());
    loss::FusedLinearProblem p = hp.problem(loss::LossKind::TopK, 4);
    p.spec.topk.normalize_topk = true;
    EXPECT_TRUE(loss::plan_chunks(p).sparse);
    loss::run_fused_linear(rec, p);
    EXPECT_EQ(rec.count("gemm") + rec.count("gemm+="), 0);
    EXPECT_EQ(rec.count("zero"), 0);
    EXPECT_EQ(rec.count("gather"), 3);
    EXPECT_EQ(rec.count("scatter"), 3);
    // The hard loss (or the full LSE) needs the whole row: back to the GEMMs.
    p.spec.topk.w_hard = 0.5f;
    EXPECT_FALSE(loss::plan_chunks(p).sparse);
  }
}

#if defined(__unix__)
// Every pointer the scheduler holds addresses memory the host cannot read or write (PROT_NONE), and the
// executor computes nothing: the run completes only if the scheduler never dereferences executor memory, as
// a device backend requires.
TEST(FusedLinearScheduler, NeverTouchesExecutorMemory) {
  const size_t bytes = size_t(1) << 24;
  void* m = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  char* base = static_cast<char*>(m);
  const int64_t n = 50, h = 16, v = 1000, k = 8;
  for (loss::LossKind kind : {loss::LossKind::CrossEntropy, loss::LossKind::TopK, loss::LossKind::Distill,
                              loss::LossKind::Entropy, loss::LossKind::SelectiveLogSoftmax}) {
    for (bool sparse : {false, true}) {
      loss::FusedLinearProblem p;
      p.spec.kind = kind;
      p.hidden = loss::Block::dense(base, DType::BF16, n, h);
      p.weight = loss::Block::dense(base + 4096, DType::F32, v, h);
      p.bias = loss::Block::dense(base + 8192, DType::F32, 1, v);
      const loss::Block lab = loss::Block::dense(base + 12288, DType::I32, n, 1);
      p.spec.ce.labels = p.spec.topk.labels = p.spec.distill.labels = lab;
      p.spec.topk.ids = p.spec.selective.ids = loss::Block::dense(base + 16384, DType::I32, n, k);
      p.spec.topk.logprobs = p.spec.selective.values = loss::Block::dense(base + 32768, DType::F32, n, k);
      p.spec.topk.normalize_topk = sparse;
      p.spec.selective.lse = reinterpret_cast<const float*>(base + 40960);
      if (kind == loss::LossKind::Distill) {
        p.teacher_hidden = p.hidden;
        p.teacher_weight = p.weight;
        p.teacher_bias = p.bias;
      }
      p.loss = p.hard = p.soft = reinterpret_cast<float*>(base + 45056);
      p.lse = reinterpret_cast<float*>(base + 49152);
      p.dhidden = loss::Block::dense(base + 65536, DType::F32, n, h);
      p.dweight = loss::Block::dense(base + 131072, DType::F32, v, h);
      p.dbias = loss::Block::dense(base + 262144, DType::F32, 1, v);
      p.row_upstream = sparse ? loss::Block::dense(base + 270000, DType::F32, n, 1) : loss::Block{};
      p.reduction = sparse ? Reduction::None : Reduction::Mean;
      p.chunk_rows = 7;
      Recorder rec(nullptr, base + (size_t(1) << 20));
      loss::run_fused_linear(rec, p);
      EXPECT_GT(rec.calls.size(), 8u) << loss::loss_kind_name(kind);
    }
  }
  munmap(m, bytes);
}
#endif

// The CPU executor splits work so that each element is computed by one thread in a fixed order: one thread
// and all threads give the same bits.
TEST(FusedLinearScheduler, ThreadCountDoesNotChangeResults) {
  for (loss::LossKind kind : {loss::LossKind::CrossEntropy, loss::LossKind::TopK, loss::LossKind::Distill})
    for (bool normalize : {false, true}) {
      std::vector<float> got[2];
      for (int t = 0; t < 2; ++t) {
        HostProblem hp("sched_threads");
        ThreadPool tp(t == 0 ? 1 : 3);
        auto ex = loss::make_cpu_chunk_executor(tp);
        loss::FusedLinearProblem p = hp.problem(kind, 3);
        p.spec.topk.normalize_topk = normalize;
        loss::run_fused_linear(*ex, p);
        got[t] = hp.loss;
        got[t].insert(got[t].end(), hp.dh.begin(), hp.dh.end());
        got[t].insert(got[t].end(), hp.dw.begin(), hp.dw.end());
        got[t].insert(got[t].end(), hp.db.begin(), hp.db.end());
      }
      EXPECT_EQ(got[0], got[1]) << loss::loss_kind_name(kind) << (normalize ? " normalized" : "");
    }
}

// An executor that keeps the count "on the device": validate() returns kCountOnDevice, and row_loss() and
// reduce() multiply the mean's 1/count in themselves, as a CUDA executor that never waits would.
class DeferredCount : public Recorder {
 public:
  explicit DeferredCount(loss::ChunkExecutor* inner) : Recorder(inner), inner_(inner) {}
  int64_t validate(const loss::LossSpec& s, int64_t rows, int64_t vv, Reduction red,
                   const std::string& what) override {
    const int64_t count = Recorder::validate(s, rows, vv, red, what);
    inv_ = red == Reduction::Mean ? (count > 0 ? 1.0f / float(count) : 0.0f) : 1.0f;
    return kCountOnDevice;
  }
  void row_loss(const loss::LossSpec& s, const loss::Block& x, const loss::RowOut& o) override {
    loss::RowOut scaled = o;
    scaled.grad_scale *= inv_;
    inner_->row_loss(s, x, scaled);
  }
  void reduce(const float* p, int64_t n, float scale, float* out) override {
    inner_->reduce(p, n, scale * inv_, out);
  }

 private:
  loss::ChunkExecutor* inner_;
  float inv_ = 1.0f;
};

TEST(FusedLinearScheduler, CountMayStayOnTheDevice) {
  for (loss::LossKind kind : {loss::LossKind::CrossEntropy, loss::LossKind::TopK, loss::LossKind::Distill})
    for (Reduction red : {Reduction::Mean, Reduction::Sum}) {
      std::vector<float> got[2];
      for (int t = 0; t < 2; ++t) {
        HostProblem hp("sched_deferred");
        auto cpu = loss::make_cpu_chunk_executor(pool());
        loss::FusedLinearProblem p = hp.problem(kind, 4);
        p.reduction = red;
        if (t == 0) {
          loss::run_fused_linear(*cpu, p);
        } else {
          DeferredCount ex(cpu.get());
          loss::run_fused_linear(ex, p);
        }
        got[t] = hp.loss;
        got[t].insert(got[t].end(), hp.dh.begin(), hp.dh.end());
        got[t].insert(got[t].end(), hp.dw.begin(), hp.dw.end());
      }
      EXPECT_EQ(got[0], got[1]) << loss::loss_kind_name(kind) << " " << red_name(red);
    }
}

bool has_op(const GraphResult& r, Op op) {
  return std::find(r.ops.begin(), r.ops.end(), op) != r.ops.end();
}

// Scalar losses differentiate in their forward pass (no second pass, and no multiply when the upstream is
// the graph's constant seed); a per-row upstream gradient gets the recomputing backward.
TEST(FusedLinearGraph, BackwardShapes) {
  std::vector<LossInput> in = {hidden_in(6, 4), weight_in(9, 4), bias_in(9),
                               LossInput({6}, DType::I32, false, 0, 9)};
  const std::vector<Vec> vals = draw_values("flgraph_shapes", in);
  auto build = [](Reduction red) {
    return [red](Context& ctx, const std::vector<Tensor*>& x) {
      CrossEntropyOptions o;
      o.reduction = red;
      return std::vector<Tensor*>{fused_linear_cross_entropy(ctx, x[0], x[1], x[2], x[3], o).loss};
    };
  };
  const GraphResult unit = run_graph(in, vals, build(Reduction::Mean), Seed::Unit);
  EXPECT_FALSE(has_op(unit, Op::Mul));
  EXPECT_FALSE(has_op(unit, Op::FusedLinearBack));
  const GraphResult weighted = run_graph(in, vals, build(Reduction::Sum), Seed::Weighted);
  EXPECT_TRUE(has_op(weighted, Op::Mul));
  EXPECT_FALSE(has_op(weighted, Op::FusedLinearBack));
  const GraphResult per_row = run_graph(in, vals, build(Reduction::None), Seed::Weighted);
  EXPECT_TRUE(has_op(per_row, Op::FusedLinearBack));
  // One fused node per forward: the logits never appear as a graph tensor.
  EXPECT_FALSE(has_op(unit, Op::Matmul));
}

// Switching a gradient off: that input gets zeros from this loss, the others are unchanged.
TEST(FusedLinearGraph, GradientSwitches) {
  std::vector<LossInput> in = {hidden_in(8, 5), weight_in(12, 5), bias_in(12),
                               LossInput({8}, DType::I32, false, 0, 12)};
  const std::vector<Vec> vals = draw_values("flgraph_switch", in);
  auto run = [&](int off, Reduction red) {
    return run_graph(
        in, vals,
        [off, red](Context& ctx, const std::vector<Tensor*>& x) {
          FusedLinearOptions f;
          f.chunk_rows = 3;
          f.grad_hidden = off != 0;
          f.grad_weight = off != 1;
          f.grad_bias = off != 2;
          CrossEntropyOptions o;
          o.reduction = red;
          return std::vector<Tensor*>{fused_linear_cross_entropy(ctx, x[0], x[1], x[2], x[3], o, f).loss};
        },
        red == Reduction::None ? Seed::Weighted : Seed::Unit);
  };
  for (Reduction red : {Reduction::Mean, Reduction::None}) {
    const GraphResult all = run(-1, red);
    for (int off = 0; off < 3; ++off) {
      const GraphResult r = run(off, red);
      ASSERT_EQ(r.grads.size(), 3u);
      for (int i = 0; i < 3; ++i) {
        if (i == off) {
          EXPECT_EQ(r.grads[size_t(i)], Vec(all.grads[size_t(i)].size(), 0.0))
              << "gradient " << i << " is off";
          EXPECT_GT(nmse(all.grads[size_t(i)], Vec(all.grads[size_t(i)].size(), 0.0)), 0.0);
        } else {
          EXPECT_EQ(r.grads[size_t(i)], all.grads[size_t(i)]) << "gradient " << i << " changed with " << off;
        }
      }
    }
  }
}

// The loss feeds further ops (a weighted sum with another loss) and gets its upstream from them.
TEST(FusedLinearGraph, LossInsideALargerGraph) {
  std::vector<LossInput> in = {hidden_in(9, 6), weight_in(15, 6), LossInput({9}, DType::I32, false, 0, 15),
                               LossInput({9, 3}, DType::I32, false, 0, 15),
                               LossInput({9, 3}, DType::F32, false, -3, -0.2)};
  const std::vector<Vec> vals = draw_values("flgraph_mix", in);
  auto build = [](bool fused) {
    return [fused](Context& ctx, const std::vector<Tensor*>& x) {
      // h = tanh(hidden) is computed in the graph: gradients flow on through the fused node into it.
      Tensor* h = tanh(ctx, x[0]);
      TopKDistillOptions o;
      o.normalize_topk = true;
      Tensor *ce, *kd;
      if (fused) {
        ce = fused_linear_cross_entropy(ctx, h, x[1], nullptr, x[2], {}).loss;
        kd = fused_linear_topk_kd(ctx, h, x[1], nullptr, x[3], x[4], nullptr, nullptr, o).loss;
      } else {
        Tensor* z = matmul(ctx, h, x[1], false, true);
        ce = cross_entropy_loss(ctx, z, x[2], {}).loss;
        kd = topk_kd(ctx, z, x[3], x[4], nullptr, nullptr, o).loss;
      }
      return std::vector<Tensor*>{add(ctx, scale(ctx, ce, 0.3f), mul(ctx, kd, kd))};
    };
  };
  expect_close(run_graph(in, vals, build(true), Seed::Unit), run_graph(in, vals, build(false), Seed::Unit),
               1e-11, "ce + kd²");
}

// Every gradient of a leaf goes straight into its accumulator (OpInfo::accumulate_aux): the hidden gradient
// by its GEMM (dense path) or the K-sparse update, the weight gradient by its GEMM or the sorted scatter,
// the bias by the column sums — no Accumulate node, no [V, H] copy. The first run after zero_grad()
// overwrites (beta = 0; the sparse update writes every row), later runs add; the gradient equals the
// unfused graph's.
void expect_gradients_accumulate_in_place(bool sparse) {
  reseed(sparse ? "flgraph_accum_sparse" : "flgraph_accum");
  const int64_t n = 7, h = 5, v = 11, kk = 3;
  const Vec hv = random_vec(n * h), wv = random_vec(v * h), bv = random_vec(v);
  const std::vector<int64_t> yv = random_ints(n, 0, v), idv = random_ints(n * kk, 0, v);
  const Vec lpv = random_vec(n * kk, -3.0, -0.2);
  auto run = [&](bool fused, int runs, bool zero_between, int64_t* accumulate_nodes) {
    Context ctx(default_cpu_backend());
    Tensor* x = ctx.param(DType::F32, {n, h}, "hidden");
    Tensor* w = ctx.param(DType::F32, {v, h}, "weight");
    Tensor* b = ctx.param(DType::F32, {v}, "bias");
    Tensor* y = ctx.input(DType::I32, {n}, "labels");
    Tensor* ids = ctx.input(DType::I32, {n, kk}, "ids");
    Tensor* lp = ctx.input(DType::F32, {n, kk}, "logprobs");
    set_data(x, std::vector<float>(hv.begin(), hv.end()));
    set_data(w, std::vector<float>(wv.begin(), wv.end()));
    set_data(b, std::vector<float>(bv.begin(), bv.end()));
    set_data_int(y, yv);
    set_data_int(ids, idv);
    set_data(lp, std::vector<float>(lpv.begin(), lpv.end()));
    FusedLinearOptions f;
    f.chunk_rows = 3;
    TopKDistillOptions o;
    o.normalize_topk = true;
    o.w_hard = 0.0f;  // with normalize_topk: the K-sparse path
    Tensor* loss = nullptr;
    if (sparse)
      loss =
          fused
              ? fused_linear_topk_kd(ctx, x, w, b, ids, lp, nullptr, nullptr, o, f).loss
              : topk_kd(ctx, add(ctx, matmul(ctx, x, w, false, true), b), ids, lp, nullptr, nullptr, o).loss;
    else
      loss = fused ? fused_linear_cross_entropy(ctx, x, w, b, y, {}, f).loss
                   : cross_entropy_loss(ctx, add(ctx, matmul(ctx, x, w, false, true), b), y, {}).loss;
    Graph g(ctx);
    g.backward(loss);
    // Poison: the first run after zero_grad() starts the in-place accumulators as NaN, so an element the
    // fused op does not overwrite shows.
    g.set_poison(true);
    g.zero_grad();
    for (int i = 0; i < runs; ++i) {
      if (zero_between) g.zero_grad();
      g.compute();
    }
    *accumulate_nodes = 0;
    for (const Tensor* t : g.nodes()) *accumulate_nodes += t->op == Op::Accumulate;
    std::vector<Vec> out;
    for (Tensor* p : {x, w, b}) out.push_back(to_f64(get_data(g.grad(p))));
    return out;
  };
  int64_t acc_fused = 0, acc_plain = 0, unused = 0;
  const std::vector<Vec> once = run(true, 1, false, &acc_fused);
  const std::vector<Vec> plain = run(false, 1, false, &acc_plain);
  EXPECT_EQ(acc_fused, 0) << "no gradient goes through an Accumulate node";
  EXPECT_EQ(acc_plain, 1);  // the bias's: x's and w's gradient GEMMs add into their accumulators themselves
  const std::vector<Vec> twice = run(true, 2, false, &unused);
  const std::vector<Vec> zeroed = run(true, 3, true, &unused);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_LT(nmse(once[i], plain[i]), 1e-10) << "gradient " << i << " vs the unfused graph";
    Vec doubled = once[i];
    for (double& d : doubled) d *= 2;
    EXPECT_LT(nmse(twice[i], doubled), 1e-12) << "gradient " << i << " accumulates over runs";
    EXPECT_EQ(zeroed[i], once[i]) << "gradient " << i << " after zero_grad";
    EXPECT_GT(nmse(once[i], Vec(once[i].size(), 0.0)), 0.0);
  }
}

TEST(FusedLinearGraph, GradientsAccumulateInPlace) {
  expect_gradients_accumulate_in_place(false);
}
TEST(FusedLinearGraph, SparseGradientsAccumulateInPlace) {
  expect_gradients_accumulate_in_place(true);
}

}  // namespace
}  // namespace retort::test
