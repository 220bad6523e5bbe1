// cross_entropy_loss: every option against the float64 reference, gradients against central differences, the
// extra outputs, storage dtypes and strided views, edge cases and bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "test_losses_ref.h"

namespace retort::test {
namespace {

CrossEntropyOptions opts_of(const CeRef& r) {
  CrossEntropyOptions o;
  o.ignore_index = r.ignore;
  o.label_smoothing = float(r.eps);
  o.z_loss = float(r.z_loss);
  o.softcap = float(r.cap);
  o.reduction = r.red;
  return o;
}

// Logits [n, v] (random in [lo, hi)) and labels in [-1, v) with ignore_index -1, so some rows are ignored.
OpCase ce_case(const std::string& name, int64_t n, int64_t v, CeRef r, DType dt = DType::F32, double lo = -3,
               double hi = 3, Out what = Out::Loss) {
  r.ignore = -1;
  OpCase c;
  c.name = name;
  c.inputs = {{Shape{n, v}, dt, true, lo, hi}, {Shape{n}, DType::I32, false, -1, double(v)}};
  c.build = [r, what](Context& ctx, const std::vector<Tensor*>& in) {
    CrossEntropyOptions o = opts_of(r);
    o.return_per_row = what == Out::PerRow;
    o.return_lse = what == Out::Lse;
    return pick(cross_entropy_loss(ctx, in[0], in[1], o), what);
  };
  c.reference = [r, what](const std::vector<Ref>& in) { return ce_ref(mat(in[0]), ints(in[1]), r, what); };
  c.fwd_tol = 1e-10;
  c.grad_tol = 1e-8;
  c.check_grad = what == Out::Loss;
  return c;
}

TEST(CrossEntropyLoss, OptionsGrid) {
  for (double eps : {0.0, 0.1})
    for (double zl : {0.0, 0.01})
      for (double cap : {0.0, 2.5})
        for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
          CeRef r;
          r.eps = eps;
          r.z_loss = zl;
          r.cap = cap;
          r.red = red;
          std::string name = "ce_eps" + std::to_string(eps) + "_z" + std::to_string(zl) + "_cap" +
                             std::to_string(cap) + "_" + red_name(red);
          EXPECT_TRUE(run_case(ce_case(name, 6, 11, r)));
        }
}

TEST(CrossEntropyLoss, PerRowAndLse) {
  CeRef r;
  r.eps = 0.2;
  r.cap = 4;
  for (Reduction red : {Reduction::Mean, Reduction::None}) {
    r.red = red;
    // lse is written for ignored rows too; per-row loss is 0 there.
    EXPECT_TRUE(
        run_case(ce_case(std::string("ce_rows_") + red_name(red), 7, 9, r, DType::F32, -3, 3, Out::PerRow)));
    EXPECT_TRUE(
        run_case(ce_case(std::string("ce_lse_") + red_name(red), 7, 9, r, DType::F32, -3, 3, Out::Lse)));
  }
}

TEST(CrossEntropyLoss, Bf16AndF16Logits) {
  CeRef r;
  r.eps = 0.1;
  r.z_loss = 1e-3;
  for (DType dt : {DType::BF16, DType::F16}) {
    EXPECT_TRUE(run_case(ce_case(std::string("ce_") + dtype_name(dt), 5, 13, r, dt)));
    LossCase c;
    c.name = std::string("ce_single_") + dtype_name(dt);
    c.inputs = {{Shape{4, 10}, dt, true, -3, 3}, {Shape{4}, DType::I64, false, 0, 10}};
    c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
      return cross_entropy_loss(ctx, in[0], in[1]).loss;
    };
    c.reference = [](const std::vector<Ref>& in) { return ce_ref(mat(in[0]), ints(in[1]), CeRef{}); };
    check_single_pass(c);
  }
}

TEST(CrossEntropyLoss, StridedLogits) {
  CeRef r;
  r.eps = 0.1;
  r.cap = 3;
  r.ignore = -1;
  // A column window of a wider tensor: rows are strided.
  OpCase c;
  c.name = "ce_slice";
  c.inputs = {{Shape{5, 12}, DType::F32, true, -3, 3}, {Shape{5}, DType::I32, false, -1, 9}};
  c.build = [r](Context& ctx, const std::vector<Tensor*>& in) {
    return cross_entropy_loss(ctx, slice(ctx, in[0], 0, 2, 9), in[1], opts_of(r)).loss;
  };
  c.reference = [r](const std::vector<Ref>& in) {
    Mat full = mat(in[0]), z;
    z.rows = 5;
    z.cols = 9;
    for (int64_t i = 0; i < 5; ++i)
      for (int64_t j = 0; j < 9; ++j) z.v.push_back(full.at(i, j + 2));
    return ce_ref(z, ints(in[1]), r);
  };
  EXPECT_TRUE(run_case(c));
  // A transposed view: consecutive logits of a row are a whole row apart in memory.
  OpCase t;
  t.name = "ce_transposed";
  t.inputs = {{Shape{8, 6}, DType::BF16, true, -3, 3}, {Shape{6}, DType::I32, false, -1, 8}};
  t.build = [r](Context& ctx, const std::vector<Tensor*>& in) {
    return cross_entropy_loss(ctx, transpose(ctx, in[0]), in[1], opts_of(r)).loss;
  };
  t.reference = [r](const std::vector<Ref>& in) { return ce_ref(mat_t(in[0]), ints(in[1]), r); };
  EXPECT_TRUE(run_case(t));
}

TEST(CrossEntropyLoss, LongRisingRows) {
  CeRef r;
  r.eps = 0.1;
  r.z_loss = 1e-2;
  r.ignore = -1;
  const int64_t v = 2600;
  LossCase c;
  c.name = "ce_long_rows";
  c.inputs = {LossInput({1, v}, DType::F32, true, 0, 0, rising(v)),
              LossInput({1}, DType::I32, false, 0, 0, Vec{2500})};
  c.build = [r](Context& ctx, const std::vector<Tensor*>& in) {
    return cross_entropy_loss(ctx, in[0], in[1], opts_of(r)).loss;
  };
  c.reference = [r](const std::vector<Ref>& in) { return ce_ref(mat(in[0]), ints(in[1]), r); };
  EXPECT_TRUE(run_loss_case(c));
}

TEST(CrossEntropyLoss, SmallAndOddVocabularies) {
  CeRef r;
  r.eps = 0.1;
  r.z_loss = 1e-2;
  for (int64_t v = 1; v <= 7; ++v) EXPECT_TRUE(run_case(ce_case("ce_v" + std::to_string(v), 4, v, r)));
  EXPECT_TRUE(run_case(ce_case("ce_v1000", 3, 1000, r)));
}

TEST(CrossEntropyLoss, HugeLogitsStayFinite) {
  CeRef r;
  r.eps = 0.05;
  for (Reduction red : {Reduction::Mean, Reduction::None}) {
    r.red = red;
    OpCase c = ce_case(std::string("ce_huge_") + red_name(red), 4, 9, r, DType::F32, -1e4, 1e4);
    c.fwd_tol = 1e-9;
    c.grad_tol = 1e-6;
    EXPECT_TRUE(run_case(c));
  }
  r.cap = 30;  // softcap squashes them; the gradient through tanh is ~0 but finite
  OpCase c = ce_case("ce_huge_softcap", 4, 9, r, DType::F32, -1e4, 1e4);
  c.grad_tol = 1e-6;
  EXPECT_TRUE(run_case(c));
}

TEST(CrossEntropyLoss, AllRowsIgnoredAndOneValidRow) {
  for (int valid_row : {-1, 2}) {
    LossCase c;
    c.name = valid_row < 0 ? "ce_all_ignored" : "ce_one_valid";
    Vec labels(5, -100.0);
    if (valid_row >= 0) labels[size_t(valid_row)] = 3;
    c.inputs = {{Shape{5, 7}, DType::F32, true, -2, 2}, {Shape{5}, DType::I32, false, 0, 0, labels}};
    CeRef r;
    r.eps = 0.1;
    r.z_loss = 0.01;
    c.build = [r](Context& ctx, const std::vector<Tensor*>& in) {
      return cross_entropy_loss(ctx, in[0], in[1], opts_of(r)).loss;
    };
    c.reference = [r](const std::vector<Ref>& in) { return ce_ref(mat(in[0]), ints(in[1]), r); };
    c.unit_seed = true;
    EXPECT_TRUE(run_loss_case(c));  // all ignored: loss 0 and an all-zero gradient, not NaN
  }
}

TEST(CrossEntropyLoss, SinglePassGradient) {
  LossCase c;
  c.name = "ce_single_pass";
  c.inputs = {{Shape{6, 11}, DType::F32, true, -3, 3}, {Shape{6}, DType::I32, false, -1, 11}};
  CeRef r;
  r.ignore = -1;
  r.eps = 0.1;
  r.z_loss = 1e-2;
  r.cap = 5;
  c.build = [r](Context& ctx, const std::vector<Tensor*>& in) {
    return cross_entropy_loss(ctx, in[0], in[1], opts_of(r)).loss;
  };
  c.reference = [r](const std::vector<Ref>& in) { return ce_ref(mat(in[0]), ints(in[1]), r); };
  check_single_pass(c);
  r.red = Reduction::Sum;
  c.name = "ce_single_pass_sum";
  c.build = [r](Context& ctx, const std::vector<Tensor*>& in) {
    return cross_entropy_loss(ctx, in[0], in[1], opts_of(r)).loss;
  };
  c.reference = [r](const std::vector<Ref>& in) { return ce_ref(mat(in[0]), ints(in[1]), r); };
  check_single_pass(c);
}

TEST(CrossEntropyLoss, GradientFlowsOnThroughTheGraph) {
  // Logits computed by another op: the loss's gradient reaches both of its operands.
  for (bool unit : {false, true}) {
    LossCase c;
    c.name = unit ? "ce_after_mul_unit" : "ce_after_mul";
    c.inputs = {{Shape{4, 6}, DType::F32, true, -2, 2},
                {Shape{4, 6}, DType::F32, true, 0.5, 2},
                {Shape{4}, DType::I32, false, 0, 6}};
    c.build = [](Context& ctx, const std::vector<Tensor*>& in) {
      return cross_entropy_loss(ctx, mul(ctx, in[0], in[1]), in[2]).loss;
    };
    c.reference = [](const std::vector<Ref>& in) {
      Mat z = mat(in[0]);
      for (size_t i = 0; i < z.v.size(); ++i) z.v[i] *= in[1].v[i];
      return ce_ref(z, ints(in[2]), CeRef{});
    };
    c.unit_seed = unit;
    EXPECT_TRUE(run_loss_case(c));
  }
}

TEST(CrossEntropyLoss, BadInputThrows) {
  Context ctx(default_cpu_backend());
  Tensor* x = ctx.tensor(DType::F32, {4, 6}, "logits");
  Tensor* y = ctx.tensor(DType::I32, {4}, "labels");
  expect_error([&] { cross_entropy_loss(ctx, x, ctx.tensor(DType::I32, {5})); },
               {"cross_entropy_loss", "[5]", "[4, 6]"});
  expect_error([&] { cross_entropy_loss(ctx, x, ctx.tensor(DType::F32, {4})); },
               {"cross_entropy_loss", "labels"});
  expect_error(
      [&] {
        cross_entropy_loss(ctx, ctx.tensor(DType::F32, {2, 4, 6}), y);
      },
      {"cross_entropy_loss", "[2, 4, 6]"});
  expect_error(
      [&] {
        cross_entropy_loss(ctx, ctx.tensor(DType::I32, {4, 6}), y);
      },
      {"cross_entropy_loss", "i32[4, 6]"});
  CrossEntropyOptions o;
  o.label_smoothing = 1.5f;
  expect_error([&] { cross_entropy_loss(ctx, x, y, o); },
               {"cross_entropy_loss", "label_smoothing", "[4, 6]"});
  o = {};
  o.softcap = -1;
  expect_error([&] { cross_entropy_loss(ctx, x, y, o); }, {"cross_entropy_loss", "softcap", "[4, 6]"});
  o = {};
  o.z_loss = -1;
  expect_error([&] { cross_entropy_loss(ctx, x, y, o); }, {"cross_entropy_loss", "z_loss", "[4, 6]"});

  // Labels out of range throw when the graph runs, naming the op, the shapes and the label.
  for (int64_t bad : {6, -1, -101}) {
    set_data_int(y, {0, 1, bad, -100});
    Tensor* loss = cross_entropy_loss(ctx, x, y).loss;
    Graph g(ctx);
    g.forward(loss);
    expect_error([&] { g.compute(); },
                 {"cross_entropy_loss", "[4, 6]", "label " + std::to_string(bad), "row 2"});
  }
}

}  // namespace
}  // namespace retort::test
