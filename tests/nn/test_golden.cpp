// Golden test: retort's Transformer against a float64 reference computed outside retort
// (tools/golden/make_golden.py; PyTorch, or its NumPy twin) from the same initial parameters and batches
// (tests/data/golden/inputs.safetensors): the logits, the loss and every parameter gradient of two tiny
// models, then ten training steps as examples/train.cpp takes them (clip, cosine lr, AdamW), step by step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "golden_spec.h"
#include "harness.h"

#ifndef RETORT_GOLDEN_DIR
#define RETORT_GOLDEN_DIR "tests/data/golden"
#endif

namespace retort {
namespace {

namespace fs = std::filesystem;

const std::string kDir = RETORT_GOLDEN_DIR;

// The fixture to compare with: PyTorch's when it has been generated, else the committed NumPy one.
std::string fixture_path() {
  for (const char* name : {"fixture_torch.safetensors", "fixture_numpy.safetensors"}) {
    const std::string p = kDir + "/" + name;
    if (fs::exists(p)) return p;
  }
  return "";
}

std::vector<float> floats(const SafeTensors& st, const std::string& name) {
  const SafeTensors::Entry& e = st.entry(name);
  EXPECT_EQ(e.dtype, DType::F32) << name;
  std::vector<float> v(e.nbytes / sizeof(float));
  std::memcpy(v.data(), st.bytes(name).data(), e.nbytes);
  return v;
}

std::vector<int64_t> ints(const SafeTensors& st, const std::string& name, size_t begin, size_t count) {
  EXPECT_EQ(st.dtype(name), DType::I32) << name;
  std::vector<int32_t> all(st.entry(name).nbytes / sizeof(int32_t));
  std::memcpy(all.data(), st.bytes(name).data(), st.entry(name).nbytes);
  EXPECT_LE(begin + count, all.size()) << name;
  return std::vector<int64_t>(all.begin() + long(begin), all.begin() + long(begin + count));
}

// max |got - want| / max |want|: the error relative to the tensor's scale, so that entries near zero do not
// dominate.
double rel_to_max(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double err = 0, scale = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    err = std::max(err, std::abs(double(got[i]) - double(want[i])));
    scale = std::max(scale, std::abs(double(want[i])));
  }
  return err / std::max(scale, 1e-30);
}

class Golden : public ::testing::TestWithParam<golden::ModelSpec> {
 protected:
  void SetUp() override {
    const std::string inputs = kDir + "/inputs.safetensors";
    if (!fs::exists(inputs))
      GTEST_SKIP() << "inputs not generated: build tests/golden_inputs and run it with " << inputs;
    fixture_ = fixture_path();
    if (fixture_.empty())
      GTEST_SKIP() << "fixture not generated yet: run tools/golden/make_golden.py on a machine with PyTorch";
    in_ = std::make_unique<SafeTensors>(inputs);
    ref_ = std::make_unique<SafeTensors>(fixture_);
    std::printf("[ golden   ] %s: %s (%s)\n", GetParam().name.c_str(), fixture_.c_str(),
                ref_->metadata().count("generator") ? ref_->metadata().at("generator").c_str() : "?");
    RecordProperty("fixture", fixture_);
  }

  // A model in ctx with the initial parameters of the inputs file.
  std::unique_ptr<Transformer> load_model(Context& ctx) {
    auto m = std::make_unique<Transformer>(ctx, GetParam().config, 0);
    for (Tensor* p : m->parameters()) in_->load_into(p, golden::param_key(GetParam().name, p->name));
    return m;
  }

  std::string key(const std::string& what) const { return GetParam().name + "/" + what; }

  std::string fixture_;
  std::unique_ptr<SafeTensors> in_, ref_;
};

TEST_P(Golden, LogitsLossAndEveryGradient) {
  CpuBackend be(2);
  Context ctx(be);
  auto model = load_model(ctx);
  const int64_t B = golden::kBatch, T = golden::kSeq;
  Tensor* tokens = ctx.input(DType::I32, {B, T}, "tokens");
  Tensor* targets = ctx.input(DType::I32, {B, T}, "targets");
  in_->load_into(tokens, "tokens");
  in_->load_into(targets, "targets");
  Tensor* logits = model->forward(ctx, tokens);
  Tensor* loss = lm_loss(ctx, logits, targets, golden::kIgnoreIndex);
  logits->flags |= kOutput;
  Graph g(ctx);
  g.forward(logits);
  g.backward(loss);
  g.compute();

  const double e_logits = rel_to_max(get_data(logits), floats(*ref_, key("logits")));
  const double e_loss = rel_to_max(get_data(loss), floats(*ref_, key("loss")));
  EXPECT_LT(e_logits, golden::kTolLogits);
  EXPECT_LT(e_loss, golden::kTolLoss)
      << "loss " << get_data(loss)[0] << " vs " << floats(*ref_, key("loss"))[0];
  double worst = 0;
  std::string worst_name;
  for (Tensor* p : model->parameters()) {
    const Tensor* gp = g.grad(p);
    ASSERT_NE(gp, nullptr) << p->name;
    const double e = rel_to_max(get_data(gp), floats(*ref_, key("grad/" + p->name)));
    EXPECT_LT(e, golden::kTolGrad) << "gradient of " << p->name;
    if (e > worst) worst = e, worst_name = p->name;
  }
  EXPECT_EQ(model->parameters().size(), size_t(GetParam().config.tie_embeddings ? 20 : 21));
  std::printf("[ golden   ] %s: logits %.1e, loss %.1e, worst gradient %.1e (%s), relative to max |ref|\n",
              GetParam().name.c_str(), e_logits, e_loss, worst, worst_name.c_str());
}

// Ten steps of examples/train.cpp's loop on the training batches; each step's loss (before its update),
// gradient norm and learning rate, then the loss of the evaluation batch after the last update.
TEST_P(Golden, TenAdamWSteps) {
  CpuBackend be(2);
  Context ctx(be);
  auto model = load_model(ctx);
  const golden::TrainSpec tr;
  const int64_t B = golden::kBatch, T = golden::kSeq;
  Tensor* tokens = ctx.input(DType::I32, {B, T}, "tokens");
  Tensor* targets = ctx.input(DType::I32, {B, T}, "targets");
  Tensor* loss = lm_loss(ctx, model->forward(ctx, tokens), targets, golden::kIgnoreIndex);
  Graph g(ctx);
  g.backward(loss);
  AdamWConfig cfg;
  cfg.lr = tr.lr_max;
  cfg.beta1 = tr.beta1;
  cfg.beta2 = tr.beta2;
  cfg.eps = tr.eps;
  cfg.weight_decay = tr.weight_decay;
  AdamW opt(g.params(), cfg);

  std::vector<float> losses, norms, lrs;
  const size_t n = size_t(B * T);
  for (int64_t step = 1; step <= tr.steps; ++step) {
    set_data_int(tokens, ints(*in_, "train_tokens", size_t(step - 1) * n, n));
    set_data_int(targets, ints(*in_, "train_targets", size_t(step - 1) * n, n));
    g.zero_grad();
    g.compute();
    losses.push_back(get_data(loss)[0]);
    norms.push_back(float(clip_grad_norm(g, tr.clip)));
    lrs.push_back(cosine_lr(step, tr.warmup, tr.total, tr.lr_max, tr.lr_min));
    opt.step(g, lrs.back());
  }
  in_->load_into(tokens, "tokens");
  in_->load_into(targets, "targets");
  g.compute();
  const std::vector<float> final_loss = get_data(loss);

  const auto want_losses = floats(*ref_, key("train_losses"));
  const double e_losses = rel_to_max(losses, want_losses);
  const double e_norms = rel_to_max(norms, floats(*ref_, key("train_grad_norms")));
  const double e_lrs = rel_to_max(lrs, floats(*ref_, key("train_lrs")));
  const double e_final = rel_to_max(final_loss, floats(*ref_, key("final_loss")));
  for (size_t i = 0; i < losses.size(); ++i)
    EXPECT_LT(std::abs(losses[i] - want_losses[i]), golden::kTolTrainLoss * want_losses[0])
        << "step " << i + 1 << ": loss " << losses[i] << ", reference " << want_losses[i];
  EXPECT_LT(e_losses, golden::kTolTrainLoss);
  EXPECT_LT(e_norms, golden::kTolTrainLoss);
  EXPECT_LT(e_lrs, 1e-6);
  EXPECT_LT(e_final, golden::kTolTrainLoss);
  // The run must learn something, or matching it would prove little about the updates.
  EXPECT_LT(final_loss[0], floats(*ref_, key("loss"))[0]);
  std::printf(
      "[ golden   ] %s: losses %.4f -> %.4f (final %.4f); rel. error: losses %.1e, grad norms %.1e, "
      "lrs %.1e, final %.1e\n",
      GetParam().name.c_str(), losses.front(), losses.back(), final_loss[0], e_losses, e_norms, e_lrs,
      e_final);
}

INSTANTIATE_TEST_SUITE_P(Models, Golden, ::testing::ValuesIn(golden::model_specs()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace retort
