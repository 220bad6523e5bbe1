// The optimizer ops on the device (src/cuda/cuda_optim.cu) against the CPU kernels (src/ops/optim.cpp):
// AdamW and SGD now and inside a graph with the clip, the norm, the skip of a non-finite step, and the
// trainer's step waiting for the device once. Tolerances are stated at each check; the CPU side is pinned
// bit for bit to the per-parameter update in tests/nn/test_optim_fused.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "cuda_test_util.h"
#include "io/shards.h"
#include "nn/lm.h"

namespace retort::test {
namespace {

class CudaOptimTest : public CudaTest {};

// "p3": built by appending (GCC 12 warns falsely on "p" + std::string).
std::string name(const char* prefix, size_t i) {
  std::string s = prefix;
  s += std::to_string(i);
  return s;
}

std::vector<float> to_f32(const Vec& v) {
  return std::vector<float>(v.begin(), v.end());
}

// Parameters of the given sizes and dtype whose gradients are inputs (loss = Σ sum(p_i · c_i), grad = c_i),
// the same random values on every backend.
struct Multi {
  Multi(Backend& be, const std::vector<int64_t>& sizes, DType dt) : ctx(be), g(ctx) {
    reseed("cuda_optim");
    for (size_t i = 0; i < sizes.size(); ++i) {
      Tensor* p = ctx.param(dt, {sizes[i]}, name("p", i));
      Tensor* c = ctx.input(DType::F32, {sizes[i]}, name("c", i));
      set_data(p, to_f32(random_vec(sizes[i], -1, 1)));
      Tensor* term = sum(ctx, mul(ctx, p, c));
      loss = loss ? add(ctx, loss, term) : term;
      ps.push_back(p);
      cs.push_back(c);
    }
    loss->flags |= kOutput;
    g.backward(loss);
  }
  void gradients(int step, double scale) {
    reseed("cuda_optim_grad" + std::to_string(step));
    for (Tensor* c : cs) set_data(c, to_f32(random_vec(c->nelements(), -scale, scale)));
    g.zero_grad();
    g.compute();
  }
  Context ctx;
  Graph g;
  std::vector<Tensor*> ps, cs;
  Tensor* loss = nullptr;
};

// Sizes that cut into several chunks (kOptChunk = 65,536 elements) and a remainder, and small ones.
const std::vector<int64_t> kSizes = {3 * kOptChunk + 77, 1000, 7, 2 * kOptChunk};

struct StepsRun {
  std::vector<Vec> params, state;  // state: m, v (AdamW) or momentum (SGD) per parameter
  std::vector<std::vector<float>> stats;
};

// kind 0: AdamW, 1: SGD, 2: SGD with momentum; clip < 0: Optimizer::step, else append_step with that clip.
StepsRun run_steps(Backend& be, DType dt, int kind, double clip) {
  Multi pb(be, kSizes, dt);
  AdamWConfig ac;
  ac.lr = 0.02f;
  ac.weight_decay = 0.1f;
  std::unique_ptr<AdamW> adam;
  std::unique_ptr<Sgd> sgd;
  Optimizer* opt = nullptr;
  if (kind == 0) {
    adam = std::make_unique<AdamW>(pb.ps, ac);
    opt = adam.get();
  } else {
    sgd = std::make_unique<Sgd>(pb.ps, SgdConfig{0.05f, kind == 2 ? 0.9f : 0.0f, 0.01f});
    opt = sgd.get();
  }
  Tensor* stats = clip >= 0 ? opt->append_step(pb.g, pb.loss, clip) : nullptr;
  StepsRun r;
  for (int t = 1; t <= 3; ++t) {
    if (stats) {
      opt->begin_step(-1.0f);
      pb.gradients(t, 2.0);
      r.stats.push_back(get_data(stats));
      opt->end_step(r.stats.back()[kStatOk] != 0);
    } else {
      pb.gradients(t, 2.0);
      opt->step(pb.g);
    }
  }
  for (Tensor* p : pb.ps) r.params.push_back(to_f64(get_data(p)));
  if (adam)
    for (size_t i = 0; i < pb.ps.size(); ++i) {
      r.state.push_back(to_f64(get_data(adam->m()[i])));
      r.state.push_back(to_f64(get_data(adam->v()[i])));
    }
  return r;
}

// CUDA against the CPU for every update rule, parameter dtype and clip mode. f32: the same expressions up to
// fused multiply-adds (a few ulp): nmse <= 1e-12. bf16 parameters: a rounded value flips by an ulp (2^-8
// relative) now and then: nmse <= 1e-5. The norm (a float of a double sum in another order): 1e-6
// relative; the clip scale likewise.
TEST_F(CudaOptimTest, UpdatesMatchTheCpu) {
  for (DType dt : {DType::F32, DType::BF16})
    for (int kind = 0; kind < 3; ++kind)
      for (double clip : {-1.0, 0.0, 0.5}) {
        SCOPED_TRACE(testing::Message() << dtype_name(dt)
                                        << (kind == 0   ? " adamw"
                                            : kind == 1 ? " sgd"
                                                        : " sgd+momentum")
                                        << " clip " << clip);
        const StepsRun cpu = run_steps(default_cpu_backend(), dt, kind, clip);
        const StepsRun gpu = run_steps(cuda_backend(), dt, kind, clip);
        const double tol = dt == DType::F32 ? 1e-12 : 1e-5;
        for (size_t i = 0; i < cpu.params.size(); ++i)
          EXPECT_LE(nmse(gpu.params[i], cpu.params[i]), tol) << "p" << i;
        for (size_t i = 0; i < cpu.state.size(); ++i)
          EXPECT_LE(nmse(gpu.state[i], cpu.state[i]), tol) << "state " << i;
        ASSERT_EQ(cpu.stats.size(), gpu.stats.size());
        for (size_t t = 0; t < cpu.stats.size(); ++t) {
          EXPECT_NEAR(gpu.stats[t][kStatNorm], cpu.stats[t][kStatNorm], 1e-6 * cpu.stats[t][kStatNorm]);
          EXPECT_NEAR(gpu.stats[t][kStatScale], cpu.stats[t][kStatScale], 1e-6);
          EXPECT_EQ(gpu.stats[t][kStatOk], 1.0f);
          EXPECT_NEAR(gpu.stats[t][kStatLoss], cpu.stats[t][kStatLoss],
                      1e-4 * std::abs(cpu.stats[t][kStatLoss]) + 1e-4);
          if (clip == 0.5) {
            EXPECT_LT(cpu.stats[t][kStatScale], 1.0f) << "the clip case must clip";
          }
        }
      }
  // The rules differ, or the comparison above could not fail.
  EXPECT_GT(max_abs_diff(run_steps(cuda_backend(), DType::F32, 0, -1).params[1],
                         run_steps(cuda_backend(), DType::F32, 2, -1).params[1]),
            1e-3);
}

// grad_norm and clip_grad_norm over several chunks: CUDA against the CPU to 1e-12 relative (double sums in
// another order), the clipped gradients to nmse 1e-12, and two CUDA runs give the same bits.
TEST_F(CudaOptimTest, GradNormAndClipMatchTheCpuAndRepeat) {
  Multi c(default_cpu_backend(), kSizes, DType::F32), g(cuda_backend(), kSizes, DType::F32);
  c.gradients(1, 3.0);
  g.gradients(1, 3.0);
  const double nc = grad_norm(c.g), ng = grad_norm(g.g);
  EXPECT_NEAR(ng, nc, 1e-12 * nc);
  EXPECT_EQ(ng, grad_norm(g.g)) << "the norm must be bitwise reproducible";
  EXPECT_NEAR(clip_grad_norm(g.g, 1.0), nc, 1e-12 * nc);
  clip_grad_norm(c.g, 1.0);
  for (size_t i = 0; i < c.ps.size(); ++i)
    EXPECT_LE(nmse(to_f64(get_data(g.g.grad(g.ps[i]))), to_f64(get_data(c.g.grad(c.ps[i])))), 1e-12);
  EXPECT_NEAR(grad_norm(g.g), 1.0, 1e-6);
}

// An infinite gradient (sqrt at 0) under a finite loss: the device skips the update (parameters and moments
// keep their bytes, the step count stays) and the stats say why, with nothing read back before the stats.
TEST_F(CudaOptimTest, NonFiniteGradientSkipsTheStepOnTheDevice) {
  Context ctx(cuda_backend());
  Tensor* p = ctx.param(DType::F32, {4}, "p");
  Tensor* q = ctx.param(DType::F32, {3}, "q");
  set_data(p, {0.5f, -1, 2, 0.25f});
  set_data(q, {1, 0, 4});
  Tensor* loss = add(ctx, sum(ctx, mul(ctx, p, p)), sum(ctx, sqrt(ctx, q)));
  loss->flags |= kOutput;
  Graph g(ctx);
  g.backward(loss);
  AdamW opt({p, q}, AdamWConfig{});
  Tensor* stats = opt.append_step(g, loss, 1.0);
  const auto before = get_bytes(p);
  const uint64_t w0 = cuda_backend().host_waits();
  opt.begin_step(0.1f);
  g.compute();
  EXPECT_EQ(cuda_backend().host_waits(), w0) << "nothing may wait for the device before the stats are read";
  const std::vector<float> s = get_data(stats);
  opt.end_step(s[kStatOk] != 0);
  EXPECT_TRUE(std::isfinite(s[kStatLoss]));
  EXPECT_TRUE(std::isinf(s[kStatNorm]));
  EXPECT_EQ(s[kStatOk], 0.0f);
  EXPECT_EQ(get_bytes(p), before);
  EXPECT_EQ(get_data(opt.m()[0]), std::vector<float>(4, 0.0f));
  EXPECT_EQ(opt.steps(), 0);
  set_data(q, {1, 2, 4});
  opt.begin_step(0.1f);
  g.zero_grad();
  g.compute();
  EXPECT_EQ(get_data(stats)[kStatOk], 1.0f);
  opt.end_step(true);
  EXPECT_NE(get_bytes(p), before);
}

// LmTrainer's step on the GPU waits for the device once (the read of its loss and norm), issue 24's target,
// and trains like the CPU: losses within 1e-4 relative over six steps. GEMM timing is off: it waits for its
// timings at a shape's first calls, which is not the steady state this counts.
TEST_F(CudaOptimTest, TrainerStepWaitsForTheDeviceOnce) {
  ScratchDir dir;
  const ShardSet set = make_shards(dir, 48, {3, 4000, 1500, 7, 3});
  TransformerConfig c;
  c.vocab = 48;
  c.context = 8;
  c.layers = 1;
  c.d_model = 16;
  c.heads = 2;
  TrainerOptions o;
  o.steps = 6;
  o.batch = 3;
  o.seq_len = 8;
  o.warmup = 2;
  o.lr = 1e-2f;
  o.seed = 5;
  CudaOptions co;
  co.gemm_tune = GemmTune::Off;
  auto be = make_cuda_backend(0, co);
  std::vector<double> gpu, cpu;
  {
    Context ctx(*be);
    Transformer model(ctx, c, 11);
    LmTrainer tr(ctx, model, set.train, o);
    for (int i = 0; i < o.steps; ++i) {
      const uint64_t w0 = be->host_waits();
      gpu.push_back(tr.step().loss);
      // The first step may wait more (the fused loss sizes its chunks from the free memory once).
      if (i > 0) {
        EXPECT_EQ(be->host_waits() - w0, 1u) << "step " << i + 1;
      }
    }
  }
  CpuBackend cb(2);
  Context ctx(cb);
  Transformer model(ctx, c, 11);
  LmTrainer tr(ctx, model, set.train, o);
  for (int i = 0; i < o.steps; ++i) cpu.push_back(tr.step().loss);
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(gpu[i], cpu[i], 1e-4 * cpu[i]) << "step " << i + 1;
  EXPECT_LT(cpu.back(), cpu.front());
}

}  // namespace
}  // namespace retort::test
