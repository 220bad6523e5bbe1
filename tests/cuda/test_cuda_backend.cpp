// The CUDA backend itself: availability and its reason, copies, the caching allocator's statistics, poison
// mode, device-side errors surfacing as retort::Error, bitwise reproducibility, and a 2-layer MLP trained a
// few steps on both backends (the optimizer ops: test_cuda_optim.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "cuda_test_util.h"

namespace retort::test {
namespace {

bool mentions(const std::string& msg, const std::string& part) {
  return msg.find(part) != std::string::npos;
}

// Not a CudaTest: it checks the unavailable path too, then skips there (visibly) like every other test.
TEST(CudaAvailability, GivesAReasonOrAWorkingBackend) {
  std::string why = "unset";
  const bool ok = cuda_available(&why);
  if (!ok) {
    EXPECT_FALSE(why.empty());
    EXPECT_NE(why, "unset");
    const std::string msg = error_of([] { make_cuda_backend(0); });
    EXPECT_TRUE(mentions(msg, "cuda")) << msg;
    EXPECT_THROW(cuda_memory_stats(default_cpu_backend()), Error);
    EXPECT_THROW(cuda_softmax_epilogue_stats(default_cpu_backend()), Error);
    GTEST_SKIP() << "CUDA unavailable: " << why;
  }
  EXPECT_TRUE(why.empty()) << why;
  auto be = make_cuda_backend(0);
  EXPECT_EQ(be->name(), "cuda:0");
  EXPECT_FALSE(be->is_host());
  const std::string msg = error_of([] { make_cuda_backend(1 << 20); });
  EXPECT_TRUE(mentions(msg, "does not exist")) << msg;
  const std::string cpu = error_of([] { cuda_memory_stats(default_cpu_backend()); });
  EXPECT_TRUE(mentions(cpu, "not a CUDA backend")) << cpu;
  // A GEMM tuning mode out of range, and a bad RETORT_GEMM_TUNE, name themselves.
  CudaOptions bad_tune;
  bad_tune.gemm_tune = GemmTune(7);
  const std::string tmsg = error_of([&] { make_cuda_backend(0, bad_tune); });
  EXPECT_TRUE(mentions(tmsg, "gemm_tune") && mentions(tmsg, "got 7")) << tmsg;
  ASSERT_EQ(setenv("RETORT_GEMM_TUNE", "3", 1), 0);
  const std::string emsg = error_of([] { make_cuda_backend(0); });
  unsetenv("RETORT_GEMM_TUNE");
  EXPECT_TRUE(mentions(emsg, "RETORT_GEMM_TUNE=3 must be 0")) << emsg;
  // The profile switches take 0 or 1 and nothing else.
  ASSERT_EQ(setenv("RETORT_OP_PROFILE", "yes", 1), 0);
  const std::string pmsg = error_of([] { make_cuda_backend(0); });
  unsetenv("RETORT_OP_PROFILE");
  EXPECT_TRUE(mentions(pmsg, "RETORT_OP_PROFILE=yes must be 0 or 1")) << pmsg;
  CudaOptions bad_pp;
  bad_pp.softmax_pingpong = 2;
  const std::string ppmsg = error_of([&] { make_cuda_backend(0, bad_pp); });
  EXPECT_TRUE(mentions(ppmsg, "softmax_pingpong") && mentions(ppmsg, "got 2")) << ppmsg;
  const std::string scpu = error_of([] { cuda_softmax_epilogue_stats(default_cpu_backend()); });
  EXPECT_TRUE(mentions(scpu, "cuda_softmax_epilogue_stats") && mentions(scpu, "not a CUDA backend")) << scpu;
}

class CudaBackendTest : public CudaTest {};

TEST_F(CudaBackendTest, WriteReadAndFillBytesRoundTrip) {
  Backend& be = cuda_backend();
  auto buf = be.alloc(1000);
  std::vector<uint8_t> in(1000), out(1000, 0);
  for (size_t i = 0; i < in.size(); ++i) in[i] = uint8_t(i * 7 + 3);
  be.write(buf->data(), in.data(), in.size());
  be.read(out.data(), buf->data(), out.size());
  EXPECT_EQ(in, out);
  be.fill_bytes(static_cast<char*>(buf->data()) + 10, 0xab, 20);
  be.read(out.data(), buf->data(), out.size());
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], i >= 10 && i < 30 ? 0xab : in[i]) << i;
}

TEST_F(CudaBackendTest, AllocatorTracksUsePeakAndCache) {
  auto be = make_cuda_backend(0);
  const size_t big = size_t(10) << 20;
  const CudaMemoryStats s0 = cuda_memory_stats(*be);
  {
    auto b1 = be->alloc(big);
    const CudaMemoryStats s1 = cuda_memory_stats(*be);
    EXPECT_GE(s1.bytes_in_use, s0.bytes_in_use + big);
    EXPECT_EQ(s1.device_allocs, s0.device_allocs + 1);
    EXPECT_GE(s1.peak_bytes, s1.bytes_in_use);
    {
      auto b2 = be->alloc(big);
      EXPECT_GE(cuda_memory_stats(*be).peak_bytes, s0.bytes_in_use + 2 * big);
    }
  }
  const CudaMemoryStats s3 = cuda_memory_stats(*be);
  EXPECT_EQ(s3.bytes_in_use, s0.bytes_in_use);  // everything went back
  EXPECT_GE(s3.bytes_cached, 2 * big);          // ... into the cache, not to the device
  EXPECT_GE(s3.peak_bytes, s0.bytes_in_use + 2 * big);
  EXPECT_EQ(s3.bytes_reserved, s3.bytes_in_use + s3.bytes_cached);
  {
    auto b3 = be->alloc(big - 1000);  // same bin: served from the cache
    const CudaMemoryStats s4 = cuda_memory_stats(*be);
    EXPECT_EQ(s4.device_allocs, s3.device_allocs);
    EXPECT_EQ(s4.alloc_calls, s3.alloc_calls + 1);
  }
  cuda_reset_peak(*be);
  const CudaMemoryStats s5 = cuda_memory_stats(*be);
  EXPECT_EQ(s5.peak_bytes, s5.bytes_in_use);
  EXPECT_LT(s5.peak_bytes, s3.peak_bytes);

  // A graph's arena and tensors raise the peak again; the reset peak is not a stale number.
  {
    Context ctx(*be);
    Tensor* x = ctx.input(DType::F32, {512, 1024}, "x");
    set_data(x, std::vector<float>(size_t(x->nelements()), 0.5f));
    Tensor* y = sum(ctx, exp(ctx, x));
    y->flags |= kOutput;
    Graph g(ctx);
    g.forward(y);
    g.compute();
    EXPECT_NEAR(get_data(y)[0], 512.0 * 1024.0 * std::exp(0.5), 1.0);
    EXPECT_GE(cuda_memory_stats(*be).peak_bytes, s5.bytes_in_use + size_t(2) * 512 * 1024 * 4);
  }
  cuda_empty_cache(*be);
  const CudaMemoryStats s6 = cuda_memory_stats(*be);
  EXPECT_EQ(s6.bytes_cached, 0u);
  EXPECT_EQ(s6.bytes_reserved, s6.bytes_in_use);
}

TEST_F(CudaBackendTest, BuffersMayOutliveTheirBackend) {
  std::shared_ptr<Buffer> keep;
  {
    auto be = make_cuda_backend(0);
    keep = be->alloc(4096);
    std::vector<float> v(1024, 1.5f);
    be->write(keep->data(), v.data(), 4096);
    be->synchronize();
  }
  keep.reset();  // returns the block to an allocator the buffer kept alive; must not crash
  SUCCEED();
}

TEST_F(CudaBackendTest, PoisonFillsNaNAndEveryKernelOverwritesIt) {
  Backend& be = cuda_backend();
  Context ctx(be);
  Tensor* t = ctx.tensor(DType::F32, {3, 5}, "t");
  be.fill_bytes(t->data, 0xff, t->nbytes());
  for (float v : get_data(t)) EXPECT_TRUE(std::isnan(v));
  Tensor* b = ctx.tensor(DType::BF16, {4}, "b");
  be.fill_bytes(b->data, 0xff, b->nbytes());
  for (float v : get_data(b)) EXPECT_TRUE(std::isnan(v));

  // The same graph with and without poison gives the same finite values.
  Tensor* x = ctx.input(DType::F32, {6, 9}, "x");
  reseed("poison");
  Vec xv = random_vec(x->nelements());
  set_data(x, std::vector<float>(xv.begin(), xv.end()));
  Tensor* y = softmax(ctx, add(ctx, mul(ctx, x, x), sum_rows(ctx, x)));
  y->flags |= kOutput;
  std::vector<float> plain, poisoned;
  for (bool poison : {false, true}) {
    Graph g(ctx);
    g.forward(y);
    g.set_poison(poison);
    g.compute();
    (poison ? poisoned : plain) = get_data(y);
  }
  EXPECT_EQ(plain, poisoned);
  for (float v : poisoned) EXPECT_TRUE(std::isfinite(v));
}

TEST_F(CudaBackendTest, OutOfRangeIdsThrowAtSynchronizeAndTheBackendRecovers) {
  Backend& be = cuda_backend();
  Context ctx(be);
  Tensor* table = ctx.tensor(DType::F32, {5, 4}, "table");
  std::vector<float> tv(20);
  for (size_t i = 0; i < tv.size(); ++i) tv[i] = float(i);
  set_data(table, tv);
  Tensor* ids = ctx.input(DType::I32, {3}, "ids");
  Tensor* out = get_rows(ctx, table, ids);
  out->flags |= kOutput;
  Graph g(ctx);
  g.forward(out);
  for (int64_t bad : {7, 5, -1}) {
    set_data_int(ids, {1, bad, 2});
    g.compute();
    const std::string msg = error_of([&] { be.synchronize(); });
    EXPECT_TRUE(mentions(msg, "get_rows")) << msg;
    EXPECT_TRUE(mentions(msg, "id " + std::to_string(bad))) << msg;
    EXPECT_TRUE(mentions(msg, "[0, 5)")) << msg;
    EXPECT_NO_THROW(be.synchronize());  // reported once, then cleared
  }
  set_data_int(ids, {4, 0, 2});
  g.compute();
  const std::vector<float> got = get_data(out);
  const std::vector<float> want = {16, 17, 18, 19, 0, 1, 2, 3, 8, 9, 10, 11};
  EXPECT_EQ(got, want);

  // read() reports it too (get_data reads).
  set_data_int(ids, {0, 0, 100});
  g.compute();
  const std::string msg = error_of([&] { get_data(out); });
  EXPECT_TRUE(mentions(msg, "id 100")) << msg;
}

// read_later as teacher-cache pipelines it: batch s's reads are queued, batch s+1 is queued (overwriting the
// graph's output), then s's reads are taken — they hold batch s's values, of several sizes (pinned pool).
TEST_F(CudaBackendTest, ReadLaterHoldsItsBatchWhileTheNextRuns) {
  Backend& be = cuda_backend();
  Context ctx(be);
  const int64_t rows = 70000;  // a 1.1 MB f32 result beside a small one
  Tensor* table = ctx.tensor(DType::F32, {6, 4}, "table");
  std::vector<float> tv(24);
  for (size_t i = 0; i < tv.size(); ++i) tv[i] = float(i) + 0.5f;
  set_data(table, tv);
  Tensor* ids = ctx.input(DType::I32, {rows}, "ids");
  Tensor* big = get_rows(ctx, table, ids);
  Tensor* small = sum(ctx, big);
  big->flags |= kOutput;
  small->flags |= kOutput;
  Graph g(ctx);
  g.forward(small);
  std::vector<TensorRead> held_big, held_small;
  std::vector<int64_t> first;
  for (int64_t s = 0; s < 5; ++s) {
    std::vector<int64_t> v(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) v[size_t(i)] = (i * 7 + s) % 6;
    first.push_back(v[0]);
    set_data_int(ids, v);
    g.compute();
    held_big.push_back(read_later(big));
    held_small.push_back(read_later(small));
  }
  const uint64_t waits = be.host_waits();
  for (int64_t s = 0; s < 5; ++s) {
    const auto* b = static_cast<const float*>(held_big[size_t(s)].wait());
    ASSERT_EQ(held_big[size_t(s)].size(), size_t(rows * 4) * sizeof(float));
    double want = 0;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < 4; ++j) {
        const float w = tv[size_t(((i * 7 + s) % 6) * 4 + j)];
        want += w;
        if (i < 3 || i == rows - 1) ASSERT_EQ(b[i * 4 + j], w) << "batch " << s << " row " << i;
      }
    EXPECT_EQ(b[0], tv[size_t(first[size_t(s)] * 4)]);
    const float got = static_cast<const float*>(held_small[size_t(s)].wait())[0];
    EXPECT_NEAR(got, want, 1e-5 * want) << "batch " << s;
  }
  EXPECT_EQ(be.host_waits() - waits, 10u);  // one per pending read, none when queued
  EXPECT_THROW(TensorRead().wait(), Error);

  // A device fault of the work before the read surfaces at its wait.
  std::vector<int64_t> bad(size_t(rows), 1);
  bad[5] = 9;
  set_data_int(ids, bad);
  g.compute();
  TensorRead r = read_later(small);
  const std::string msg = error_of([&] { r.wait(); });
  EXPECT_TRUE(mentions(msg, "get_rows") && mentions(msg, "id 9")) << msg;
  EXPECT_NO_THROW(be.synchronize());
}

TEST_F(CudaBackendTest, OutOfRangeLabelsThrowAndIgnoredOnesDoNot) {
  Backend& be = cuda_backend();
  Context ctx(be);
  Tensor* logits = ctx.input(DType::F32, {4, 6}, "logits");
  set_data(logits, std::vector<float>(24, 0.25f));
  Tensor* labels = ctx.input(DType::I64, {4}, "labels");
  Tensor* loss = cross_entropy(ctx, logits, labels, -100);
  loss->flags |= kOutput;
  Graph g(ctx);
  g.forward(loss);
  set_data_int(labels, {0, -100, 5, 3});
  g.compute();
  EXPECT_NEAR(get_data(loss)[0], std::log(6.0), 1e-6);
  set_data_int(labels, {0, 9, 5, 3});
  g.compute();
  const std::string msg = error_of([&] { be.synchronize(); });
  EXPECT_TRUE(mentions(msg, "cross_entropy")) << msg;
  EXPECT_TRUE(mentions(msg, "label 9")) << msg;
  EXPECT_TRUE(mentions(msg, "[0, 6)")) << msg;
  set_data_int(labels, {-100, -100, -100, -100});
  g.compute();
  EXPECT_EQ(get_data(loss)[0], 0.0f);  // all rows ignored: 0, not NaN
}

TEST_F(CudaBackendTest, ReductionsAndEmbeddingGradientsAreBitwiseReproducible) {
  CompareCase c;
  c.name = "repro";
  // Many ids hit the same few rows: a float-atomic scatter would sum them in a different order each run.
  c.inputs = {{Shape{6, 33}, DType::F32, true, -1, 1},
              {Shape{4000}, DType::I32, false, 0, 6},
              {Shape{4000, 33}, DType::F32, false, -1, 1}};
  c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
    Tensor* e = get_rows(ctx, in[0], in[1]);
    return sum_rows(ctx, mul(ctx, e, in[2]));
  };
  GraphResult a = run_graph(cuda_backend(), c);
  GraphResult b = run_graph(cuda_backend(), c);
  EXPECT_EQ(a.out, b.out);
  ASSERT_EQ(a.grads.size(), 1u);
  EXPECT_EQ(a.grads[0], b.grads[0]);
  EXPECT_TRUE(compare_with_cpu(c));
}

// A 2-layer MLP with a cross-entropy loss, trained a few SGD-with-momentum steps; returns the loss of
// each step. (SGD keeps CPU/CUDA rounding differences as small as they are; AdamW would turn a gradient that
// is ~1e-9 on one backend and -1e-9 on the other into updates of opposite sign. AdamW is compared above.)
std::vector<double> train_mlp(Backend& be, std::vector<Vec>* first_grads) {
  reseed("mlp");
  Context ctx(be);
  const int64_t B = 16, in = 12, hidden = 32, classes = 5;
  Tensor* x = ctx.input(DType::F32, {B, in}, "x");
  Tensor* labels = ctx.input(DType::I32, {B}, "labels");
  Tensor* w1 = ctx.param(DType::F32, {hidden, in}, "w1");
  Tensor* b1 = ctx.param(DType::F32, {hidden}, "b1");
  Tensor* w2 = ctx.param(DType::F32, {classes, hidden}, "w2");
  Tensor* b2 = ctx.param(DType::F32, {classes}, "b2");
  for (Tensor* t : {x, w1, b1, w2, b2}) {
    Vec v = random_vec(t->nelements(), -0.5, 0.5);
    set_data(t, std::vector<float>(v.begin(), v.end()));
  }
  set_data_int(labels, random_ints(B, 0, classes));
  Tensor* h = relu(ctx, add(ctx, matmul(ctx, x, w1, false, true), b1));  // [B, hidden]
  Tensor* logits = add(ctx, matmul(ctx, h, w2, false, true), b2);        // [B, classes]
  Tensor* loss = cross_entropy(ctx, logits, labels);
  loss->flags |= kOutput;
  Graph g(ctx);
  g.backward(loss);
  std::vector<Tensor*> params = {w1, b1, w2, b2};
  Sgd opt(params, SgdConfig{0.2f, 0.9f, 0.0f});
  std::vector<double> losses;
  for (int64_t step = 1; step <= 5; ++step) {
    g.zero_grad();
    g.compute();
    losses.push_back(get_data(loss)[0]);
    if (step == 1 && first_grads)
      for (Tensor* p : params) first_grads->push_back(to_f64(get_data(g.grad(p))));
    opt.step(g);
  }
  return losses;
}

TEST_F(CudaBackendTest, TwoLayerMlpTrainsToTheSameLossesAsTheCpu) {
  std::vector<Vec> gc, gg;
  const std::vector<double> cpu = train_mlp(default_cpu_backend(), &gc);
  const std::vector<double> gpu = train_mlp(cuda_backend(), &gg);
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i)
    EXPECT_NEAR(gpu[i], cpu[i], 1e-5 * std::max(1.0, cpu[i])) << "step " << i;
  EXPECT_LT(cpu.back(), cpu.front()) << "training must lower the loss, or the comparison proves little";
  ASSERT_EQ(gc.size(), gg.size());
  for (size_t i = 0; i < gc.size(); ++i) EXPECT_LE(nmse(gg[i], gc[i]), 1e-9) << "gradient of parameter " << i;
}

}  // namespace
}  // namespace retort::test
