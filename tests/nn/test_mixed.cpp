// Mixed precision (TransformerConfig::compute_dtype): with bf16 compute the logits, the losses of every loss
// head and every parameter gradient stay close to the f32 model's with the same weights; every matmul, and
// every gradient GEMM, really reads 16-bit operands while the parameters and their gradients stay f32; a few
// steps of training lower the loss; checkpoints load across compute dtypes; matmul_lowp checks its operands.
// The f32 path itself is pinned bit-for-bit by the golden test (tests/nn/test_golden.cpp) and the resume
// test.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "../io/io_test_util.h"
#include "core/cpu_backend.h"
#include "io/shards.h"
#include "nn/lm.h"
#include "ops/ops.h"

namespace retort {
namespace {

using test::expect_error;
using test::ScratchDir;

TransformerConfig small(DType compute, bool tied = true, int64_t kv_heads = 0) {
  TransformerConfig c;
  c.vocab = 37;  // not a power of two, so no shape lines up by accident
  c.context = 12;
  c.layers = 2;
  c.d_model = 32;
  c.heads = 4;
  c.kv_heads = kv_heads;
  c.d_ff = 48;
  c.tie_embeddings = tied;
  c.compute_dtype = compute;
  return c;
}

std::vector<int64_t> random_ids(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> d(0, vocab - 1);
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// Weights larger than the init's 0.02 (the same for every compute dtype), so attention is far from uniform
// and the MLP far from linear: rounding errors then have something to grow through.
void spread_weights(Transformer& m) {
  std::mt19937_64 rng(17);
  std::normal_distribution<float> nd(0.0f, 0.15f);
  for (Tensor* p : m.parameters()) {
    std::vector<float> v(static_cast<size_t>(p->nelements()));
    for (auto& x : v) x = p->n_dims() == 1 ? 1.0f + nd(rng) : nd(rng);
    set_data(p, v);
  }
}

struct Outcome {
  double loss = 0;
  std::vector<float> logits;              // forward() runs only
  std::vector<std::vector<float>> grads;  // per parameter, the model's order
  int64_t lowp_matmuls = 0;               // matmul nodes (forward and gradient) with 16-bit operands
  int64_t f32_matmuls = 0;
  bool params_f32 = true, grads_f32 = true;
};

const int64_t kB = 2, kT = 10;

// Builds the model in `compute`, the loss `head` makes from it, runs forward and backward once.
using Head = std::function<Tensor*(Context&, Transformer&, Tensor* tokens, Tensor* targets, Tensor** logits)>;

Outcome run(const TransformerConfig& cfg, const Head& head) {
  CpuBackend be(2);
  Context ctx(be);
  Transformer m(ctx, cfg, 3);
  spread_weights(m);
  Tensor* tokens = ctx.input(DType::I32, {kB, kT}, "tokens");
  Tensor* targets = ctx.input(DType::I32, {kB, kT}, "targets");
  set_data_int(tokens, random_ids(kB * kT, cfg.vocab, 7));
  set_data_int(targets, random_ids(kB * kT, cfg.vocab, 8));
  Tensor* logits = nullptr;
  Tensor* loss = head(ctx, m, tokens, targets, &logits);
  if (logits) logits->flags |= kOutput;
  Graph g(ctx);
  if (logits) g.forward(logits);
  g.backward(loss);
  g.zero_grad();
  g.compute();
  Outcome r;
  r.loss = get_data(loss)[0];
  if (logits) r.logits = get_data(logits);
  for (Tensor* p : m.parameters()) {
    r.grads.push_back(get_data(g.grad(p)));
    r.params_f32 = r.params_f32 && p->dtype == DType::F32;
    r.grads_f32 = r.grads_f32 && g.grad(p)->dtype == DType::F32;
  }
  for (const Tensor* n : g.nodes()) {
    if (n->op != Op::Matmul) continue;
    const bool lowp = n->src[0]->dtype == cfg.compute_dtype && n->src[1]->dtype == cfg.compute_dtype;
    (lowp && cfg.compute_dtype != DType::F32 ? r.lowp_matmuls : r.f32_matmuls) += 1;
  }
  return r;
}

// max |a - b| / max |b|.
double rel_max(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
    s = std::max(s, std::fabs(double(b[i])));
  }
  return d / s;
}

// ‖a - b‖ / ‖b‖.
double rel_norm(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    s += double(b[i]) * double(b[i]);
  }
  return std::sqrt(d / s);
}

// bf16 keeps 8 significant bits (relative rounding 2^-9 ≈ 2e-3 per operand); through two blocks of ~a dozen
// roundings each, the logits and the loss land within 2e-2 of f32's (relative to the largest logit / the
// loss) and each parameter's gradient within 5e-2 (relative norm). A missing or wrong gradient path — a
// dropped cast backward, a gradient left in bf16 storage — is off by O(1), and bf16 itself must show: the
// bf16 run has to differ from f32 by more than f32 rounding (1e-6), or it did not run in bf16.
constexpr double kLogitTol = 2e-2, kLossTol = 2e-2, kGradTol = 5e-2;

void expect_close(const Outcome& lo, const Outcome& f32, const TransformerConfig& cfg, const char* what) {
  EXPECT_TRUE(lo.params_f32 && lo.grads_f32) << what << ": the master weights and their gradients stay f32";
  EXPECT_EQ(f32.lowp_matmuls, 0) << what;
  EXPECT_GT(lo.lowp_matmuls, 0) << what;
  EXPECT_NEAR(lo.loss, f32.loss, kLossTol * std::fabs(f32.loss)) << what;
  EXPECT_GT(std::fabs(lo.loss - f32.loss), 1e-6 * std::fabs(f32.loss)) << what << ": no bf16 rounding shows";
  double logit_err = -1;
  if (!f32.logits.empty()) {
    const double e = logit_err = rel_max(lo.logits, f32.logits);
    EXPECT_LT(e, kLogitTol) << what << ": logits";
    EXPECT_GT(e, 1e-6) << what << ": logits show no bf16 rounding";
  }
  ASSERT_EQ(lo.grads.size(), f32.grads.size());
  double worst = 0;
  for (size_t i = 0; i < lo.grads.size(); ++i) {
    const double e = rel_norm(lo.grads[i], f32.grads[i]);
    worst = std::max(worst, e);
    EXPECT_LT(e, kGradTol) << what << ": gradient of parameter " << i;
  }
  std::printf(
      "[ mixed    ] %s (%s): loss %.6f vs f32 %.6f, logits %s, worst gradient %.2e (relative), %lld "
      "16-bit matmuls\n",
      what, dtype_name(cfg.compute_dtype), lo.loss, f32.loss,
      logit_err < 0 ? "(fused)" : std::to_string(logit_err).c_str(), worst, (long long)lo.lowp_matmuls);
}

Tensor* logits_ce(Context& ctx, Transformer& m, Tensor* tokens, Tensor* targets, Tensor** logits) {
  *logits = m.forward(ctx, tokens);
  return lm_loss(ctx, *logits, targets);
}

TEST(MixedPrecision, Bf16LogitsLossAndGradientsCloseToF32) {
  for (const bool tied : {true, false}) {
    const Outcome f = run(small(DType::F32, tied), logits_ce);
    const Outcome b = run(small(DType::BF16, tied), logits_ce);
    EXPECT_EQ(b.f32_matmuls, 0) << "every matmul, forward and backward, must read 16-bit operands";
    expect_close(b, f, small(DType::BF16, tied), tied ? "logits head, tied" : "logits head, untied");
  }
}

TEST(MixedPrecision, Bf16GroupedQueryAttentionAndF16) {
  const Outcome f = run(small(DType::F32, true, 2), logits_ce);
  const Outcome b = run(small(DType::BF16, true, 2), logits_ce);
  expect_close(b, f, small(DType::BF16, true, 2), "grouped-query attention");
  // f16 has 11 significant bits: closer still, and at these magnitudes nothing over- or underflows.
  const Outcome h = run(small(DType::F16), logits_ce);
  const Outcome f2 = run(small(DType::F32), logits_ce);
  expect_close(h, f2, small(DType::F16), "f16");
}

TEST(MixedPrecision, FusedLossHeadsInBf16) {
  const Head ce = [](Context& ctx, Transformer& m, Tensor* tokens, Tensor* targets, Tensor**) {
    return lm_cross_entropy(ctx, m, tokens, targets).loss;
  };
  expect_close(run(small(DType::BF16), ce), run(small(DType::F32), ce), small(DType::BF16), "fused CE");

  const int64_t K = 6, N = kB * kT, V = small(DType::F32).vocab;
  auto topk = [&](bool sparse) -> Head {
    return [=](Context& ctx, Transformer& m, Tensor* tokens, Tensor* targets, Tensor**) {
      // A teacher's top-K: distinct random ids, log-softmax of random values, sorted best first.
      std::mt19937_64 rng(23);
      std::normal_distribution<float> nd(0.0f, 2.0f);
      std::vector<int64_t> ids;
      std::vector<float> lp;
      for (int64_t r = 0; r < N; ++r) {
        std::vector<int64_t> perm(static_cast<size_t>(V));
        for (int64_t v = 0; v < V; ++v) perm[size_t(v)] = v;
        std::shuffle(perm.begin(), perm.end(), rng);
        std::vector<float> z(static_cast<size_t>(V));
        for (auto& x : z) x = nd(rng);
        std::sort(z.begin(), z.end(), std::greater<float>());
        double s = 0;
        for (float x : z) s += std::exp(double(x));
        for (int64_t k = 0; k < K; ++k) {
          ids.push_back(perm[size_t(k)]);
          lp.push_back(float(double(z[size_t(k)]) - std::log(s)));
        }
      }
      Tensor* t_ids = ctx.input(DType::I32, {N, K}, "t_ids");
      Tensor* t_lp = ctx.input(DType::F32, {N, K}, "t_lp");
      set_data_int(t_ids, ids);
      set_data(t_lp, lp);
      TopKDistillOptions o;
      o.w_hard = sparse ? 0.0f : 0.5f;
      o.w_soft = sparse ? 1.0f : 0.5f;
      o.normalize_topk = sparse;
      return lm_topk_distill(ctx, m, tokens, targets, t_ids, t_lp, nullptr, o).loss;
    };
  };
  expect_close(run(small(DType::BF16), topk(false)), run(small(DType::F32), topk(false)), small(DType::BF16),
               "fused top-K KD + CE");
  expect_close(run(small(DType::BF16), topk(true)), run(small(DType::F32), topk(true)), small(DType::BF16),
               "fused top-K KD, K-sparse");
}

// Random-ish shards with structure to learn (each token likely follows from the previous one).
ShardSet make_shards(const ScratchDir& dir, int64_t vocab) {
  std::mt19937 rng(3);
  std::vector<int32_t> toks(4000);
  for (size_t i = 0; i < toks.size(); ++i)
    toks[i] = i > 0 && rng() % 4 ? int32_t((toks[i - 1] * 7 + 3) % vocab) : int32_t(rng() % uint32_t(vocab));
  ShardWriteOptions o;
  o.val_fraction = 0.1;
  return write_shards(toks, dir.file("d"), vocab, o);
}

TEST(MixedPrecision, Bf16TrainingLowersTheLossLikeF32) {
  ScratchDir dir;
  const ShardSet set = make_shards(dir, 37);
  TrainerOptions o;
  o.steps = 30;
  o.batch = 4;
  o.seq_len = 12;
  o.warmup = 3;
  o.lr = 1e-2f;
  o.min_lr = 1e-3f;
  o.seed = 5;
  auto train = [&](DType dt, double* val) {
    CpuBackend be(2);
    Context ctx(be);
    Transformer m(ctx, small(dt), 9);
    LmTrainer tr(ctx, m, set.train, o);
    LmEvaluator ev(ctx, m, set.val, 4, 12, 0);
    std::vector<double> losses;
    for (int64_t s = 0; s < o.steps; ++s) losses.push_back(tr.step().loss);
    *val = ev.run();
    for (const Tensor* p : m.parameters()) EXPECT_EQ(p->dtype, DType::F32);
    return losses;
  };
  double val_b = 0, val_f = 0;
  const auto b = train(DType::BF16, &val_b);
  const auto f = train(DType::F32, &val_f);
  auto tail = [](const std::vector<double>& v) {
    return (v[v.size() - 1] + v[v.size() - 2] + v[v.size() - 3]) / 3;
  };
  std::printf("[ mixed    ] training: bf16 %.4f -> %.4f (val %.4f), f32 %.4f -> %.4f (val %.4f)\n", b[0],
              tail(b), val_b, f[0], tail(f), val_f);
  EXPECT_NEAR(b[0], std::log(37.0), 0.3);
  EXPECT_LT(tail(b), b[0] - 1.0) << "bf16 training did not lower the loss";
  // The same run in f32 ends within a few percent: the updates went to the f32 master weights.
  EXPECT_NEAR(tail(b), tail(f), 0.05 * tail(f));
  EXPECT_NEAR(val_b, val_f, 0.05 * val_f);
}

TEST(MixedPrecision, CheckpointsLoadAcrossComputeDtypes) {
  ScratchDir dir;
  const ShardSet set = make_shards(dir, 37);
  TrainerOptions o;
  o.steps = 2;
  o.batch = 2;
  o.seq_len = 12;
  o.warmup = 1;
  const std::string path = dir.file("b.safetensors");
  std::vector<std::vector<uint8_t>> saved;
  {
    CpuBackend be(1);
    Context ctx(be);
    Transformer m(ctx, small(DType::BF16), 4);
    LmTrainer tr(ctx, m, set.train, o);
    tr.step();
    tr.save(path);
    for (const Tensor* p : m.parameters()) saved.push_back(get_bytes(p));
  }
  const Checkpoint ck(path);
  EXPECT_EQ(ck.config().compute_dtype, DType::F32) << "the compute dtype is not part of the checkpoint";
  for (DType dt : {DType::F32, DType::BF16}) {
    CpuBackend be(1);
    Context ctx(be);
    Transformer m(ctx, small(dt), 99);
    ck.load_model(m);
    for (size_t i = 0; i < saved.size(); ++i) EXPECT_EQ(get_bytes(m.parameters()[i]), saved[i]);
    LmTrainer tr(ctx, m, set.train, o);
    tr.resume(ck);
    EXPECT_EQ(tr.steps_done(), 1);
  }
}

// A forward-only model's frozen 16-bit weights give the very logits of the per-run casts (both round to
// nearest even; the out and down projections then add into the residual stream in their GEMMs, x + Σ either
// way), with no cast node left in the graph; in f32 freezing does nothing; the copies are taken once, so
// later parameter changes do not reach them.
TEST(MixedPrecision, FrozenWeightsGiveTheCastForwardsLogits) {
  for (const bool tied : {true, false}) {
    for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
      CpuBackend be(2);
      Context ctx(be);
      Transformer m(ctx, small(dt, tied, 2), 5);
      spread_weights(m);
      Tensor* tokens = ctx.input(DType::I32, {2, 12}, "tokens");
      set_data_int(tokens, random_ids(24, 37, 3));
      size_t addends = 0;
      const auto run = [&](size_t* casts) {
        Tensor* logits = m.forward(ctx, tokens);
        Graph g(ctx);
        g.forward(logits);
        g.compute();
        *casts = 0;
        addends = 0;
        for (const Tensor* n : g.nodes()) {
          *casts += n->op == Op::Cont && n->dtype != n->src[0]->dtype && (n->src[0]->flags & kParam);
          addends += n->op == Op::Matmul && n->src[2] != nullptr;
        }
        return get_data(logits);
      };
      size_t casts_before = 0, casts_after = 0;
      const std::vector<float> before = run(&casts_before);
      m.freeze_weights();
      m.freeze_weights();  // idempotent
      const std::vector<float> after = run(&casts_after);
      ASSERT_EQ(before.size(), after.size());
      for (size_t i = 0; i < before.size(); ++i) ASSERT_EQ(before[i], after[i]) << dtype_name(dt) << " at " << i;
      if (dt == DType::F32) {
        EXPECT_EQ(casts_before, 0u);
        continue;
      }
      EXPECT_GT(casts_before, 0u) << "the unfrozen 16-bit forward casts its weights";
      EXPECT_EQ(casts_after, 0u) << dtype_name(dt) << ": a frozen forward reads its copies";
      EXPECT_EQ(addends, 4u) << "two layers, each adding wo and w_down into the stream in their GEMMs";
      // The copies are a snapshot: zeroing the f32 matmul weights leaves the frozen forward as it was (the
      // embedding's rows are still gathered from the f32 parameter).
      for (Tensor* p : m.parameters())
        if (p->n_dims() == 2 && p != m.embedding()) set_data(p, std::vector<float>(size_t(p->nelements()), 0.0f));
      EXPECT_EQ(run(&casts_after), after);
    }
  }
}

TEST(MixedPrecision, AFrozenModelIsNotTrained) {
  ScratchDir dir;
  const ShardSet set = make_shards(dir, 37);
  TrainerOptions o;
  o.steps = 1;
  o.batch = 2;
  o.seq_len = 12;
  CpuBackend be(1);
  Context ctx(be);
  Transformer m(ctx, small(DType::BF16), 4);
  m.freeze_weights();
  ASSERT_TRUE(m.frozen());
  expect_error([&] { LmTrainer tr(ctx, m, set.train, o); }, {"trainer", "frozen"});
}

TEST(MixedPrecision, BadDtypesThrow) {
  TransformerConfig c = small(DType::I32);
  expect_error([&] { (void)c.resolved(); }, {"compute_dtype", "i32"});
  CpuBackend be(1);
  Context ctx(be);
  Tensor* a = ctx.input(DType::F32, {3, 4}, "a");
  Tensor* b = ctx.input(DType::BF16, {5, 4}, "b");
  expect_error([&] { matmul_lowp(ctx, a, b, false, true); }, {"matmul_lowp", "[3, 4]", "16-bit"});
  Tensor* h = ctx.input(DType::F16, {3, 4}, "h");
  expect_error([&] { matmul_lowp(ctx, h, b, false, true); }, {"matmul_lowp", "f16", "bf16"});
}

// matmul_lowp's forward is matmul's exactly; its gradients equal matmul's with the upstream gradient rounded
// to bf16 (computed here by hand), which differ from the unrounded ones.
TEST(MixedPrecision, MatmulLowpRoundsTheUpstreamGradient) {
  CpuBackend be(1);
  Context ctx(be);
  const int64_t M = 5, K = 7, N = 6;
  Tensor* a = ctx.param(DType::F32, {M, K}, "a");
  Tensor* b = ctx.param(DType::F32, {N, K}, "b");
  Tensor* w = ctx.input(DType::F32, {M, N}, "w");  // loss = sum(C ⊙ w): dC = w
  std::mt19937_64 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto fill_rand = [&](Tensor* t) {
    std::vector<float> v(static_cast<size_t>(t->nelements()));
    for (auto& x : v) x = nd(rng);
    set_data(t, v);
    return v;
  };
  fill_rand(a);
  fill_rand(b);
  const std::vector<float> wv = fill_rand(w);
  Tensor* ab = cast(ctx, a, DType::BF16);
  Tensor* bb = cast(ctx, b, DType::BF16);
  Tensor* c = matmul_lowp(ctx, ab, bb, false, true);
  Tensor* c_plain = matmul(ctx, ab, bb, false, true);
  c->flags |= kOutput;
  c_plain->flags |= kOutput;
  Graph g(ctx);
  g.forward(c);
  g.forward(c_plain);
  g.backward(sum(ctx, mul(ctx, c, w)));
  g.zero_grad();
  g.compute();
  EXPECT_EQ(get_data(c), get_data(c_plain));
  std::vector<float> bv = get_data(b);  // the bf16 operand, as f32
  for (float& x : bv) x = bf16_to_f32(f32_to_bf16(x));
  std::vector<double> da(size_t(M * K), 0.0), da_unrounded(size_t(M * K), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const float gw = wv[size_t(m * N + n)];
      const double gr = bf16_to_f32(f32_to_bf16(gw));
      for (int64_t k = 0; k < K; ++k) {
        da[size_t(m * K + k)] += gr * bv[size_t(n * K + k)];
        da_unrounded[size_t(m * K + k)] += double(gw) * bv[size_t(n * K + k)];
      }
    }
  const std::vector<float> ga = get_data(g.grad(a));
  double err = 0, diff = 0;
  for (size_t i = 0; i < ga.size(); ++i) {
    err = std::max(err, std::fabs(ga[i] - da[i]));
    diff = std::max(diff, std::fabs(da[i] - da_unrounded[i]));
  }
  EXPECT_LT(err, 1e-5);
  EXPECT_GT(diff, 1e-4) << "the rounding of the gradient would not show: pick other values";
}

}  // namespace
}  // namespace retort
