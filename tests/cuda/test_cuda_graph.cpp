// CUDA Graph replay (CudaOptions::graphs): a graph that runs again unchanged is recorded at its second run
// and replayed from then on. A replayed run must equal an eagerly launched one bit for bit, see the inputs the
// host wrote before it, and be recorded afresh when anything a launch reads from the host changes.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "core/graph.h"
#include "cuda_test_util.h"
#include "io/shards.h"
#include "nn/lm.h"

namespace retort::test {
namespace {

class CudaGraphTest : public CudaTest {};

// A 16-bit student (flash attention, the fused top-K loss, the fused optimizer) trained for a few steps on
// teacher data that changes every step.
struct TrainRun {
  std::vector<double> losses, norms;
  std::vector<std::vector<uint8_t>> params;  // every parameter's bytes after the last step
  uint64_t waits_after_first = 0;            // host waits of the steps after the first
};

TrainRun train(Backend& be, const ShardSet& set, int steps, const std::function<void(int)>& after_step = {}) {
  TransformerConfig c;
  c.vocab = 96;
  c.context = 16;
  c.layers = 2;
  c.d_model = 64;
  c.heads = 4;
  c.kv_heads = 2;
  c.compute_dtype = DType::BF16;
  TrainerOptions o;
  o.steps = steps;
  o.batch = 3;
  o.seq_len = 16;
  o.warmup = 2;
  o.lr = 1e-2f;
  o.seed = 9;
  o.clip = 1.0f;
  DistillHead head;
  head.enabled = true;
  head.k = 4;
  head.opts.w_hard = 0.5f;
  head.opts.w_soft = 0.5f;
  Context ctx(be);
  Transformer model(ctx, c, 3);
  LmTrainer tr(ctx, model, set.train, o, head);
  const int64_t N = o.batch * o.seq_len;
  int step = 0;
  const auto fill = [&](const Batch&) {
    std::mt19937 rng(uint32_t(100 + step));
    std::vector<int64_t> ids(size_t(N * head.k));
    std::vector<float> lp(ids.size()), mask(ids.size(), 1.0f);
    for (int64_t r = 0; r < N; ++r)
      for (int64_t j = 0; j < head.k; ++j) {
        ids[size_t(r * head.k + j)] = (r * 7 + j * 13 + step) % c.vocab;
        lp[size_t(r * head.k + j)] = -1.0f - float(j) - float(rng() % 100) / 100.0f;
      }
    set_data_int(tr.teacher_ids(), ids);
    set_data(tr.teacher_logprobs(), lp);
    set_data(tr.teacher_mask(), mask);
  };
  TrainRun r;
  for (step = 0; step < steps; ++step) {
    const uint64_t w0 = be.host_waits();
    const LmTrainer::StepResult s = tr.step(fill);
    if (step > 0) r.waits_after_first += be.host_waits() - w0;
    r.losses.push_back(s.loss);
    r.norms.push_back(s.grad_norm);
    if (after_step) after_step(step);
  }
  for (Tensor* p : model.parameters()) {
    std::vector<uint8_t> bytes(p->nbytes());
    be.read(bytes.data(), p->data, bytes.size());
    r.params.push_back(std::move(bytes));
  }
  return r;
}

CudaOptions untimed(bool graphs) {
  CudaOptions o;
  o.gemm_tune = GemmTune::Off;  // the same cuBLASLt algorithms on both backends
  o.graphs = graphs;
  return o;
}

TEST_F(CudaGraphTest, ReplayedTrainingStepsEqualEagerOnesBitForBit) {
  ScratchDir dir;
  const ShardSet set = make_shards(dir, 96, {7, 6000, 2000, 5, 1});
  const int steps = 8;
  auto eager_be = make_cuda_backend(0, untimed(false));
  auto graph_be = make_cuda_backend(0, untimed(true));
  const TrainRun eager = train(*eager_be, set, steps);
  const TrainRun replayed = train(*graph_be, set, steps);
  const CudaGraphStats gs = cuda_graph_stats(*graph_be);
  // Step 1 runs eagerly, step 2 is recorded (and launched from the recording), steps 3.. replay it.
  EXPECT_EQ(gs.captures, 1u) << gs.last_failure;
  EXPECT_EQ(gs.replays, size_t(steps - 2));
  EXPECT_EQ(gs.failures, 0u) << gs.last_failure;
  EXPECT_EQ(cuda_graph_stats(*eager_be).captures, 0u);
  for (int i = 0; i < steps; ++i) {
    EXPECT_EQ(eager.losses[size_t(i)], replayed.losses[size_t(i)]) << "step " << i + 1;
    EXPECT_EQ(eager.norms[size_t(i)], replayed.norms[size_t(i)]) << "step " << i + 1;
  }
  ASSERT_EQ(eager.params.size(), replayed.params.size());
  for (size_t i = 0; i < eager.params.size(); ++i)
    EXPECT_TRUE(eager.params[i] == replayed.params[i]) << "parameter " << i << " differs after " << steps << " steps";
  // The loss moved: the steps did train (a replay that skipped the update would leave it flat).
  EXPECT_NE(replayed.losses.front(), replayed.losses.back());
  // A replayed step still waits for the device once: the read of its loss.
  EXPECT_EQ(replayed.waits_after_first, uint64_t(steps - 1));
}

// With GEMM timing on, recording waits for the fused loss's GEMMs to be timed the second time (after
// LtTuned::kSettleSeconds under load), then records and replays.
TEST_F(CudaGraphTest, RecordingWaitsForTheGemmTimingsToSettle) {
  ScratchDir dir;
  const ShardSet set = make_shards(dir, 96, {7, 6000, 2000, 5, 1});
  CudaOptions o;
  o.gemm_tune = GemmTune::All;
  auto be = make_cuda_backend(0, o);
  size_t captures_before_settle = 0;
  train(*be, set, 7, [&](int step) {
    if (step == 3) {
      captures_before_settle = cuda_graph_stats(*be).captures;
      std::this_thread::sleep_for(std::chrono::milliseconds(2200));
    }
  });
  ASSERT_GT(cuda_tuned_gemms(*be), 0u) << "the fused loss timed no GEMM: the test checks nothing";
  EXPECT_EQ(captures_before_settle, 0u);
  const CudaGraphStats gs = cuda_graph_stats(*be);
  EXPECT_EQ(gs.captures, 1u) << gs.last_failure;
  EXPECT_GE(gs.replays, 1u);
  EXPECT_EQ(gs.failures, 0u) << gs.last_failure;
}

// A forward graph replayed over new inputs gives what an eager run gives for each input, and a node whose
// parameter the host changed is recorded afresh.
TEST_F(CudaGraphTest, ReplaysSeeNewInputsAndChangedParameters) {
  auto eager_be = make_cuda_backend(0, untimed(false));
  auto graph_be = make_cuda_backend(0, untimed(true));
  auto run = [&](Backend& be, float factor, const std::vector<std::vector<float>>& inputs) {
    Context ctx(be);
    Tensor* x = ctx.input(DType::F32, {8, 33}, "x");
    Tensor* w = ctx.input(DType::F32, {33, 17}, "w");
    std::vector<float> wv(33 * 17);
    for (size_t i = 0; i < wv.size(); ++i) wv[i] = float(int(i % 13) - 6) / 8.0f;
    set_data(w, wv);
    Tensor* s = scale(ctx, x, 1.5f);
    Tensor* y = softmax(ctx, matmul(ctx, s, w));
    y->flags |= kOutput;
    Graph g(ctx);
    g.forward(y);
    std::vector<std::vector<float>> outs;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (i == inputs.size() - 1) s->fp[0] = factor;  // the last run: a parameter the launch reads
      set_data(x, inputs[i]);
      g.compute();
      outs.push_back(get_data(y));
    }
    return outs;
  };
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(-2, 2);
  std::vector<std::vector<float>> inputs(6, std::vector<float>(8 * 33));
  for (auto& v : inputs)
    for (float& f : v) f = u(rng);
  const auto eager = run(*eager_be, 0.25f, inputs);
  const auto replayed = run(*graph_be, 0.25f, inputs);
  for (size_t i = 0; i < inputs.size(); ++i)
    EXPECT_TRUE(eager[i] == replayed[i]) << "run " << i + 1;
  const CudaGraphStats gs = cuda_graph_stats(*graph_be);
  // Runs 1 (eager), 2 (recorded), 3-5 (replayed), 6 (changed: eager again).
  EXPECT_EQ(gs.captures, 1u) << gs.last_failure;
  EXPECT_EQ(gs.replays, 3u);
  EXPECT_NE(eager[5], eager[4]);
}

}  // namespace
}  // namespace retort::test
