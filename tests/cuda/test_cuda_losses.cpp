// The loss backend's ops on CUDA beyond their case lists (cross_entropy_loss, entropy and
// selective_log_softmax run the CPU's lists in test_cuda_loss_cases.cpp): bad labels and ids raise
// retort::Error at the next synchronize or at the next run that finds the faulting work done (with no host
// wait in between), non-finite teacher logprobs are reported, and logits_grad runs the CPU's case list.
// Without a usable device every test skips with the reason.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <thread>
#include <tuple>

#include "cuda_loss_check.h"
#include "logits_grad_cases.h"

namespace retort::test {
namespace {

class CudaLosses : public CudaTest {};

// ---- bad labels and ids -------------------------------------------------------------------------------

bool mentions(const std::string& msg, const std::string& part) {
  return msg.find(part) != std::string::npos;
}

// Computes g on the device and expects the next synchronize to throw naming every part, once; the backend
// then works again.
void expect_device_error(Graph& g, const std::vector<std::string>& parts) {
  Backend& be = cuda_backend();
  g.compute();
  const std::string msg = error_of([&] { be.synchronize(); });
  for (const std::string& p : parts) EXPECT_TRUE(mentions(msg, p)) << "'" << p << "' not in: " << msg;
  EXPECT_NO_THROW(be.synchronize());  // reported once, then cleared
}

// A run only queues work: a bad label is reported by the next run once the faulting work is done, with no
// host wait anywhere (the Python bindings rely on this); that run does not happen, and the one after it does.
TEST_F(CudaLosses, FaultReportedByTheNextRunWithoutHostWait) {
  Backend& be = cuda_backend();
  Context ctx(be);
  Tensor* x = ctx.input(DType::F32, {4, 6}, "logits");
  set_data(x, std::vector<float>(24, 0.25f));
  Tensor* y = ctx.input(DType::I32, {4}, "labels");
  set_data_int(y, {0, 9, 5, 3});
  Tensor* loss = cross_entropy_loss(ctx, x, y).loss;
  loss->flags |= kOutput;
  Graph g(ctx);
  g.forward(loss);
  be.synchronize();
  const uint64_t w0 = be.host_waits();
  EXPECT_NO_THROW(g.compute());  // the fault is recorded on the device, not seen by the host yet
  EXPECT_EQ(be.host_waits(), w0);
  // The device finishes a 4 x 6 loss long before this; the backend itself must not wait.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::string msg = error_of([&] { g.compute(); });
  for (const char* part : {"cross_entropy_loss", "label 9", "[0, 6)", "next run"})
    EXPECT_TRUE(mentions(msg, part)) << "'" << part << "' not in: " << msg;
  EXPECT_EQ(be.host_waits(), w0) << "reporting the fault must not wait for the device";
  set_data_int(y, {0, -100, 5, 3});
  g.compute();
  EXPECT_NEAR(get_data(loss)[0], std::log(6.0), 1e-6);  // reported once: the good run reads back
  EXPECT_NO_THROW(be.synchronize());
}

TEST_F(CudaLosses, BadLabelsAndIdsRaiseErrors) {
  Backend& be = cuda_backend();
  Context ctx(be);
  Tensor* x = ctx.input(DType::F32, {4, 6}, "logits");
  set_data(x, std::vector<float>(24, 0.25f));
  Tensor* y = ctx.input(DType::I32, {4}, "labels");
  Tensor* ids = ctx.input(DType::I32, {4, 3}, "ids");
  Tensor* lp = ctx.input(DType::F32, {4, 3}, "lp");
  set_data(lp, std::vector<float>(12, -1.0f));

  {  // cross-entropy
    Tensor* loss = cross_entropy_loss(ctx, x, y).loss;
    loss->flags |= kOutput;
    Graph g(ctx);
    g.forward(loss);
    set_data_int(y, {0, 9, 5, 3});
    expect_device_error(g, {"cross_entropy_loss", "label 9", "[0, 6)"});
    set_data_int(y, {0, -100, 5, 3});
    g.compute();
    EXPECT_NEAR(get_data(loss)[0], std::log(6.0), 1e-6);  // equal logits: log V for each valid row
  }
  {  // top-K: an id out of range in a valid slot throws, the same id in a masked slot is padding
    set_data_int(y, {0, 1, 2, 3});
    set_data_int(ids, {0, 1, 2, 3, 4, 5, 0, 6, 1, 2, 2, 2});
    Tensor* mask = ctx.input(DType::I32, {4, 3}, "mask");
    set_data_int(mask, {1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1});
    Tensor* bad = topk_kd(ctx, x, ids, lp, nullptr, y).loss;
    bad->flags |= kOutput;
    Graph g(ctx);
    g.forward(bad);
    expect_device_error(g, {"topk_kd", "id 6", "[0, 6)"});
    Tensor* ok = topk_kd(ctx, x, ids, lp, mask, y).loss;
    ok->flags |= kOutput;
    Graph g2(ctx);
    g2.forward(ok);
    g2.compute();
    EXPECT_NO_THROW(be.synchronize());
    EXPECT_TRUE(std::isfinite(get_data(ok)[0]));
    set_data_int(y, {0, 1, 2, 7});
    expect_device_error(g2, {"topk_kd", "label 7", "[0, 6)"});
  }
  {  // distill
    Tensor* teacher = ctx.input(DType::F32, {4, 6}, "teacher");
    set_data(teacher, std::vector<float>(24, 0.5f));
    DistillOptions o;
    o.w_hard = 0.5f;
    Tensor* loss = distill(ctx, x, teacher, y, o).loss;
    loss->flags |= kOutput;
    Graph g(ctx);
    g.forward(loss);
    set_data_int(y, {-7, 1, 2, 3});
    expect_device_error(g, {"distill", "label -7", "[0, 6)"});
  }
  {  // selective log-softmax
    set_data_int(ids, {0, 1, 2, 3, 4, 5, 0, 1, 2, -2, 2, 2});
    Tensor* out = selective_log_softmax(ctx, x, ids);
    out->flags |= kOutput;
    Graph g(ctx);
    g.forward(out);
    expect_device_error(g, {"selective_log_softmax", "id -2", "[0, 6)"});
  }
}

TEST_F(CudaLosses, NonFiniteTeacherLogprobsRaiseErrors) {
  // A NaN or +inf teacher logprob in a valid slot would drop out of the loss and show only in the gradient;
  // the device reports it as the CPU does (tests/ops/test_fused_linear_topk.cpp), on each kernel that reads
  // the slots: the general row kernel (forward; the gradient at T = 2), the rows run as cross-entropy rows
  // (the gradient with labels at T = 1) and the gathered form. The same value in a masked slot is padding.
  Backend& be = cuda_backend();
  Context ctx(be);
  Tensor* x = ctx.input(DType::F32, {4, 6}, "logits");
  set_data(x, std::vector<float>(24, 0.25f));
  Tensor* xg = ctx.input(DType::F32, {4, 3}, "gathered");
  set_data(xg, std::vector<float>(12, 0.5f));
  Tensor* y = ctx.input(DType::I32, {4}, "labels");
  set_data_int(y, {0, 1, 2, 3});
  Tensor* ids = ctx.input(DType::I32, {4, 3}, "ids");
  set_data_int(ids, {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5});
  Tensor* mask = ctx.input(DType::I32, {4, 3}, "mask");
  set_data_int(mask, {1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1});
  for (DType lp_dt : {DType::F32, DType::BF16}) {
    Tensor* lp = ctx.input(lp_dt, {4, 3}, "lp");
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      SCOPED_TRACE(std::string(dtype_name(lp_dt)) + " " + std::to_string(bad));
      std::vector<float> lpv(12, -1.5f);
      lpv[7] = bad;  // row 2, slot 1
      set_data(lp, lpv);
      TopKDistillOptions t2;
      t2.temperature = 2.0f;
      struct Way {
        const char* op;
        Tensor* root;
      };
      const std::vector<Way> ways = {
          {"topk_kd", topk_kd(ctx, x, ids, lp, nullptr, y).loss},
          {"topk_kd", logits_grad(ctx, topk_kd(ctx, x, ids, lp, nullptr, y).loss)},
          {"topk_kd", logits_grad(ctx, topk_kd(ctx, x, ids, lp, nullptr, y, t2).loss)},
          {"topk_kl_gathered", topk_kl_gathered(ctx, xg, lp, nullptr).loss},
          {"topk_kl_gathered", logits_grad(ctx, topk_kl_gathered(ctx, xg, lp, nullptr).loss)},
      };
      for (const Way& w : ways) {
        SCOPED_TRACE(w.op);
        w.root->flags |= kOutput;
        Graph g(ctx);
        g.forward(w.root);
        expect_device_error(g, {w.op, "teacher logprob", "row 2 slot 1"});
      }
      Tensor* masked = topk_kd(ctx, x, ids, lp, mask, y).loss;
      masked->flags |= kOutput;
      Graph gm(ctx);
      gm.forward(logits_grad(ctx, masked));
      gm.compute();
      EXPECT_NO_THROW(be.synchronize());
      EXPECT_TRUE(std::isfinite(get_data(masked)[0]));
    }
  }
}

// logits_grad on the device: the same case list as the CPU's (tests/ops/logits_grad_cases.h), and the
// device's f32 gradient against the CPU's.
TEST_F(CudaLosses, LogitsGradEveryLossAndDtype) {
  check_logits_grad_cases(cuda_backend());
  for (const LogitsGradCase& c : logits_grad_cases()) {
    SCOPED_TRACE(c.name);
    const Vec cpu = logits_grad_on(default_cpu_backend(), c, DType::BF16, DType::F32, false, false);
    const Vec gpu = logits_grad_on(cuda_backend(), c, DType::BF16, DType::F32, false, false);
    EXPECT_LE(nmse(gpu, cpu), kCpuTol);
  }
}

}  // namespace
}  // namespace retort::test
