// The row-kernel contract the fused-linear scheduler relies on, tested on the kernels directly: the gradient
// may overwrite the logits in place (f32 and bf16), chunks of rows with the global scale give exactly the
// whole-block result, and validation throws before anything is written.
#include <gtest/gtest.h>

#include <cstring>

#include "ops/loss/row_kernels.h"
#include "logits_grad_cases.h"
#include "test_losses_ref.h"

namespace retort::test {
namespace {

ThreadPool& pool() {
  return default_cpu_backend().pool();
}

struct Data {
  int64_t n = 7, v = 37, k = 5;
  std::vector<float> logits, teacher, lp;
  std::vector<int32_t> labels, ids;
  std::vector<uint8_t> mask;
};

Data make_data(const std::string& key) {
  reseed(key);
  Data d;
  for (double x : random_vec(d.n * d.v, -4, 4)) d.logits.push_back(float(x));
  for (double x : random_vec(d.n * d.v, -4, 4)) d.teacher.push_back(float(x));
  for (double x : random_vec(d.n * d.k, -5, -0.1)) d.lp.push_back(float(x));
  for (int64_t x : random_ints(d.n, -1, d.v)) d.labels.push_back(int32_t(x));
  for (int64_t x : random_ints(d.n * d.k, 0, d.v)) d.ids.push_back(int32_t(x));
  // Row 3 of the mask is all zeros; the rest random (bytes reinterpreted as... i32 below for the Block).
  for (int64_t x : random_ints(d.n * d.k, 0, 2)) d.mask.push_back(uint8_t(x));
  for (int64_t k = 0; k < d.k; ++k) d.mask[size_t(3 * d.k + k)] = 0;
  return d;
}

// Runs a row kernel over [0, n) in chunks of `chunk` rows (0: one call), the gradient into grad.
template <typename Side, typename Fn>
void run_chunked(Fn fn, const loss::Block& x, const Side& side, loss::RowOut out, int64_t chunk) {
  if (chunk <= 0) chunk = x.rows;
  for (int64_t r0 = 0; r0 < x.rows; r0 += chunk) {
    int64_t len = std::min(chunk, x.rows - r0);
    fn(x.sub_rows(r0, len), side.sub_rows(r0, len), out.sub_rows(r0, len), pool());
  }
}

struct Result {
  std::vector<float> loss, lse, hard, soft, grad;
};

// Three ways to run one loss: whole block into a separate gradient buffer, in chunks, and in place.
template <typename Side, typename Fn>
void check_contract(Fn fn, Data& d, const Side& side, int64_t v) {
  const int64_t n = d.n;
  auto run = [&](int64_t chunk, bool in_place) {
    Result r;
    r.loss.assign(size_t(n), -1);
    r.lse.assign(size_t(n), -1);
    r.hard.assign(size_t(n), -1);
    r.soft.assign(size_t(n), -1);
    std::vector<float> x = d.logits;
    r.grad.assign(x.size(), -1);
    loss::RowOut out;
    out.loss = r.loss.data();
    out.lse = r.lse.data();
    out.hard = r.hard.data();
    out.soft = r.soft.data();
    out.grad_scale = 0.25f;
    loss::Block xb = loss::Block::dense(x.data(), DType::F32, n, v);
    out.grad = in_place ? xb : loss::Block::dense(r.grad.data(), DType::F32, n, v);
    run_chunked(fn, xb, side, out, chunk);
    if (in_place) r.grad = x;
    return r;
  };
  Result whole = run(0, false);
  for (float g : whole.grad) EXPECT_NE(g, -1.0f) << "a gradient element was not written";
  for (int64_t chunk : {1, 3}) {
    Result c = run(chunk, false);
    EXPECT_EQ(c.loss, whole.loss) << "chunk " << chunk;
    EXPECT_EQ(c.lse, whole.lse) << "chunk " << chunk;
    EXPECT_EQ(c.grad, whole.grad) << "chunk " << chunk;
  }
  Result ip = run(2, true);
  EXPECT_EQ(ip.loss, whole.loss);
  EXPECT_EQ(ip.grad, whole.grad) << "in-place gradient differs";

  // bf16 logits with the gradient written over them in place: the f32 gradient rounded once.
  std::vector<uint16_t> xb16;
  for (float f : d.logits) xb16.push_back(f32_to_bf16(f));
  std::vector<float> rounded, grad_sep(d.logits.size());
  for (uint16_t h : xb16) rounded.push_back(bf16_to_f32(h));
  loss::RowOut out;
  out.grad_scale = 0.25f;
  out.grad = loss::Block::dense(grad_sep.data(), DType::F32, n, v);
  fn(loss::Block::dense(rounded.data(), DType::F32, n, v), side, out, pool());
  loss::Block b16 = loss::Block::dense(xb16.data(), DType::BF16, n, v);
  out.grad = b16;
  fn(b16, side, out, pool());
  for (size_t i = 0; i < xb16.size(); ++i) ASSERT_EQ(xb16[i], f32_to_bf16(grad_sep[i])) << "element " << i;
}

TEST(RowKernels, CrossEntropyContract) {
  Data d = make_data("rows_ce");
  loss::CrossEntropySide side;
  side.labels = {d.labels.data(), DType::I32, d.n, 1, 4, 4};
  side.ignore_index = -1;
  side.label_smoothing = 0.1f;
  side.z_loss = 1e-3f;
  side.softcap = 6;
  check_contract(loss::cross_entropy_rows, d, side, d.v);
}

TEST(RowKernels, TopKContract) {
  Data d = make_data("rows_topk");
  std::vector<int32_t> mask32(d.mask.begin(), d.mask.end());
  for (bool norm : {false, true}) {
    loss::TopKSide side;
    side.ids = loss::Block::dense(d.ids.data(), DType::I32, d.n, d.k);
    side.logprobs = loss::Block::dense(d.lp.data(), DType::F32, d.n, d.k);
    side.mask = loss::Block::dense(mask32.data(), DType::I32, d.n, d.k);
    side.labels = {d.labels.data(), DType::I32, d.n, 1, 4, 4};
    side.ignore_index = -1;
    side.div.beta = 0.5f;
    side.temperature = 2;
    side.w_hard = 0.5f;
    side.normalize_topk = norm;
    check_contract(loss::topk_rows, d, side, d.v);
  }
}

TEST(RowKernels, DistillContract) {
  Data d = make_data("rows_distill");
  for (float beta : {0.0f, 0.5f, 1.0f}) {
    loss::DistillSide side;
    side.teacher = loss::Block::dense(d.teacher.data(), DType::F32, d.n, d.v);
    side.labels = {d.labels.data(), DType::I32, d.n, 1, 4, 4};
    side.ignore_index = -1;
    side.div.beta = beta;
    side.temperature = 2;
    side.w_hard = 0.3f;
    check_contract(loss::distill_rows, d, side, d.v);
  }
}

TEST(RowKernels, EntropyContract) {
  Data d = make_data("rows_entropy");
  struct Side {
    loss::EntropySide s{1.5f};
    Side sub_rows(int64_t, int64_t) const { return *this; }
  } side;
  auto fn = [](const loss::Block& x, const Side& s, const loss::RowOut& o, ThreadPool& p) {
    loss::entropy_rows(x, s.s, o, p);
  };
  check_contract(fn, d, side, d.v);
}

TEST(RowKernels, ValidationCountsRowsAndNamesTheFault) {
  Data d = make_data("rows_check");
  loss::CrossEntropySide side;
  side.labels = {d.labels.data(), DType::I32, d.n, 1, 4, 4};
  side.ignore_index = -1;
  int64_t expect = 0;
  for (int32_t y : d.labels) expect += y != -1;
  EXPECT_EQ(loss::check_cross_entropy(side, d.v, "ce"), expect);
  d.labels[4] = int32_t(d.v);
  expect_error([&] { loss::check_cross_entropy(side, d.v, "my_op (logits [7, 37])"); },
               {"my_op (logits [7, 37])", "label 37", "row 4"});
  loss::TopKSide t;
  std::vector<int32_t> mask32(d.mask.begin(), d.mask.end());
  t.ids = loss::Block::dense(d.ids.data(), DType::I32, d.n, d.k);
  t.logprobs = loss::Block::dense(d.lp.data(), DType::F32, d.n, d.k);
  t.mask = loss::Block::dense(mask32.data(), DType::I32, d.n, d.k);
  EXPECT_EQ(loss::check_topk(t, d.n, d.v, "topk"), d.n);  // no labels: every row counts
  d.ids[size_t(3 * d.k)] = 1000;                          // row 3 is fully masked: ignored
  EXPECT_NO_THROW(loss::check_topk(t, d.n, d.v, "topk"));
  d.ids[size_t(1 * d.k + 2)] = -5;
  mask32[size_t(1 * d.k + 2)] = 1;
  expect_error([&] { loss::check_topk(t, d.n, d.v, "topk"); }, {"topk", "teacher id -5", "row 1", "slot 2"});
}

// ---- logits_grad ------------------------------------------------------------------------------------

TEST(LogitsGrad, EveryLossAndDtypeMatchesTheBackward) {
  check_logits_grad_cases(default_cpu_backend());
}

TEST(LogitsGrad, RefusesWhatItCannotDo) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.input(DType::F32, {4, 9}, "x");
  Tensor* y = ctx.input(DType::I32, {4}, "y");
  CrossEntropyOptions none;
  none.reduction = Reduction::None;
  expect_error([&] { logits_grad(ctx, cross_entropy_loss(ctx, x, y, none).loss); },
               {"logits_grad", "cross_entropy_loss", "reduction 'none'"});
  expect_error([&] { logits_grad(ctx, sum(ctx, x)); }, {"logits_grad", "is not the loss of a row loss"});
  Tensor* l = cross_entropy_loss(ctx, x, y).loss;
  expect_error([&] { logits_grad(ctx, l, DType::I32); }, {"logits_grad", "dtype", "i32"});
  expect_error([&] { logits_grad(ctx, l, DType::BF16, true); },
               {"logits_grad", "in-place", "f32[4, 9]", "bf16"});
  logits_grad(ctx, l, DType::BF16);
  expect_error([&] { logits_grad(ctx, l); }, {"logits_grad", "already asked for"});
  Tensor* sx = ctx.input(DType::F32, {4, 9}, "sx");
  Tensor* ids = ctx.input(DType::I32, {4, 2}, "ids");
  Tensor* vals = selective_log_softmax(ctx, sx, ids);
  expect_error(
      [&] {
        selective_log_softmax_grad(ctx, vals, ctx.input(DType::F32, {4, 3}, "g"));
      },
      {"selective_log_softmax_grad", "grad_output", "[4, 3]", "[4, 2]"});
  // A view's storage is not the logits': refused in place.
  Tensor* wide = ctx.input(DType::F32, {4, 18}, "wide");
  Tensor* half = slice(ctx, wide, 0, 0, 9);
  expect_error([&] { logits_grad(ctx, cross_entropy_loss(ctx, half, y).loss, DType::F32, true); },
               {"logits_grad", "in-place"});
}

}  // namespace
}  // namespace retort::test
