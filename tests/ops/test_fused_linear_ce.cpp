// fused_linear_cross_entropy beyond its case list (tests/ops/loss_cases_fused_ce.cpp, run on every backend):
// equality with the unfused composition through the graph, independence of the chunk size and the budget,
// the chunk plan, exact zeros when every row is ignored, the logits dtype on the CPU, and bad input.
#include <gtest/gtest.h>

#include "ops/loss/chunk_scheduler.h"
#include "loss_cases.h"
#include "test_fused_linear_ref.h"

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

FusedLinearOptions chunked(int64_t rows) {
  FusedLinearOptions f;
  f.chunk_rows = rows;
  return f;
}

// The fused node and matmul + bias + cross_entropy_loss on the same values: outputs and gradients agree.
TEST(FusedLinearCE, EqualsUnfusedComposition) {
  const int64_t n = 37, h = 24, v = 301;
  std::vector<LossInput> in = {hidden_in(n, h, DType::F32, -2, 2), weight_in(v, h), bias_in(v),
                               LossInput(Shape{n}, DType::I32, false, -1, double(v))};
  const std::vector<Vec> vals = draw_values("flce_unfused", in);
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    CeRef r;
    r.ignore = -1;
    r.eps = 0.05;
    r.z_loss = 1e-3;
    r.cap = red == Reduction::Sum ? 20 : 0;
    r.red = red;
    CrossEntropyOptions o = opts_of(r);
    o.return_lse = true;
    o.return_per_row = true;
    const BuildFn unfused = [o](Context& ctx, const std::vector<Tensor*>& x) {
      Tensor* z = add(ctx, matmul(ctx, x[0], x[1], false, true), x[2]);
      LossOutputs l = cross_entropy_loss(ctx, z, x[3], o);
      return std::vector<Tensor*>{l.loss, l.per_row, l.lse};
    };
    for (Seed seed : {Seed::Unit, Seed::Weighted}) {
      if (seed == Seed::Unit && red == Reduction::None) continue;
      const GraphResult want = run_graph(in, vals, unfused, seed);
      for (int64_t chunk : chunk_sizes(n)) {
        const BuildFn fused = [o, chunk](Context& ctx, const std::vector<Tensor*>& x) {
          LossOutputs l = fused_linear_cross_entropy(ctx, x[0], x[1], x[2], x[3], o, chunked(chunk));
          return std::vector<Tensor*>{l.loss, l.per_row, l.lse};
        };
        expect_close(run_graph(in, vals, fused, seed), want, 1e-11,
                     std::string("ce ") + red_name(red) + " chunk " + std::to_string(chunk) +
                         (seed == Seed::Unit ? " unit" : " weighted"));
      }
    }
  }
}

// The memory budget sets the chunk rows: the same results for budgets of one row, a few rows and all rows.
TEST(FusedLinearCE, BudgetSetsChunkRows) {
  const int64_t n = 19, h = 6, v = 130;  // Vp = 256
  std::vector<LossInput> in = {hidden_in(n, h), weight_in(v, h),
                               LossInput(Shape{n}, DType::I32, false, 0, double(v))};
  const std::vector<Vec> vals = draw_values("flce_budget", in);
  auto run = [&](size_t budget) {
    return run_graph(
        in, vals,
        [budget](Context& ctx, const std::vector<Tensor*>& x) {
          FusedLinearOptions f;
          f.logits_budget = budget;
          return std::vector<Tensor*>{fused_linear_cross_entropy(ctx, x[0], x[1], nullptr, x[2], {}, f).loss};
        },
        Seed::Unit);
  };
  const GraphResult whole = run(size_t(256) << 20);
  for (size_t budget :
       {size_t(1), size_t(256 * 4), size_t(256 * 4 * 5 + 17), size_t(256 * 4 * 19), kFusedLinearAutoBudget})
    expect_close(run(budget), whole, 1e-12, "budget " + std::to_string(budget));

  // Planning reads only sizes (any non-null address marks a block as present).
  float dummy = 0;
  loss::FusedLinearProblem p;
  p.hidden = loss::Block::dense(&dummy, DType::F32, n, h);
  p.weight = loss::Block::dense(&dummy, DType::F32, v, h);
  p.logits_budget = 256 * 4 * 5 + 17;
  EXPECT_EQ(loss::plan_chunks(p).chunk_rows, 5);
  EXPECT_EQ(loss::plan_chunks(p).padded_vocab, 256);
  p.logits_budget = 1;
  EXPECT_EQ(loss::plan_chunks(p).chunk_rows, 1);  // at least one row, whatever the budget
  p.logits_budget = size_t(1) << 40;
  EXPECT_EQ(loss::plan_chunks(p).chunk_rows, n);
  p.chunk_rows = 4;
  EXPECT_EQ(loss::plan_chunks(p).chunk_rows, 4);
  // An online teacher's logits take the same room again.
  p.chunk_rows = 0;
  p.logits_budget = 256 * 4 * 6;
  p.teacher_hidden = p.hidden;
  p.teacher_weight = p.weight;
  EXPECT_EQ(loss::plan_chunks(p).chunk_rows, 3);
}

// Chunk rows from the budget: the fewest chunks the budget allows, of even size, in multiples of 128 rows
// where that still fits (the GEMM tiles); an explicit chunk_rows is kept as given.
TEST(FusedLinearCE, BudgetChunksAreEvenAndAligned) {
  float dummy = 0;
  loss::FusedLinearProblem p;
  p.weight = loss::Block::dense(&dummy, DType::BF16, 128256, 8);  // Vp = V: 256,512 bytes per bf16 row
  p.dhidden = loss::Block::dense(&dummy, DType::F32, 8192, 8);
  p.logits_dtype = DType::BF16;
  auto rows = [&](int64_t n, size_t budget) {
    p.hidden = loss::Block::dense(&dummy, DType::BF16, n, 8);
    p.logits_budget = budget;
    return loss::plan_chunks(p, false, 2, true).chunk_rows;
  };
  const size_t row = 128256 * 2;
  EXPECT_EQ(rows(8192, 512u << 20), 2048);   // 2,093 rows fit: 4 chunks of 2,048
  EXPECT_EQ(rows(8192, 1024u << 20), 4096);  // 4,186 fit: 2 chunks
  EXPECT_EQ(rows(8192, 2048u << 20), 8192);  // all rows fit: one chunk
  EXPECT_EQ(rows(1000, 300 * row), 256);     // 4 chunks of 250, rounded up to 256 (<= 300)
  EXPECT_EQ(rows(1000, 130 * row), 128);     // 8 chunks of 125 -> 128
  EXPECT_EQ(rows(1000, 200 * row), 200);     // 5 chunks of 200; 256 would not fit
  EXPECT_EQ(rows(1000, 210 * row), 200);     // still 5 chunks, evened out
  EXPECT_EQ(rows(1000, 90 * row), 84);       // 12 chunks of 84: below 128, not rounded
  p.chunk_rows = 2093;
  EXPECT_EQ(rows(8192, 512u << 20), 2093);  // as given
}

TEST(FusedLinearCE, Gpt2Vocabulary) {
  // V = 50,257 is not a multiple of any block size; rows are padded to 50,304 in scratch. 5 rows in chunks
  // of 2 against the float64 reference, gradients against the unfused graph.
  const int64_t n = 5, h = 4, v = 50257;
  std::vector<LossInput> in = {hidden_in(n, h, DType::F32, -2, 2), weight_in(v, h, DType::BF16), bias_in(v),
                               LossInput(Shape{n}, DType::I32, false, -1, double(v))};
  const std::vector<Vec> vals = draw_values("flce_gpt2", in);
  CeRef r;
  r.ignore = -1;
  r.eps = 0.1;
  r.z_loss = 1e-4;
  const BuildFn fused = [r](Context& ctx, const std::vector<Tensor*>& x) {
    CrossEntropyOptions o = opts_of(r);
    o.return_lse = true;
    LossOutputs l = fused_linear_cross_entropy(ctx, x[0], x[1], x[2], x[3], o, chunked(2));
    return std::vector<Tensor*>{l.loss, l.lse};
  };
  const GraphResult got = run_graph(in, vals, fused, Seed::Unit);
  std::vector<Ref> refs(4);
  for (int i = 0; i < 4; ++i) {
    Context ctx(default_cpu_backend());
    Tensor* t = ctx.tensor(in[size_t(i)].dtype, in[size_t(i)].shape);
    for (int d = 0; d < 4; ++d) refs[size_t(i)].ne[d] = t->ne[d];
    refs[size_t(i)].v = vals[size_t(i)];
  }
  const Mat z = head_ref(refs[0], refs[1], &refs[2]);
  EXPECT_LE(nmse(got.outs[0], ce_ref(z, ints(refs[3]), r)), 1e-10);
  EXPECT_LE(nmse(got.outs[1], ce_ref(z, ints(refs[3]), r, Out::Lse)), 1e-12);
  const BuildFn unfused = [r](Context& ctx, const std::vector<Tensor*>& x) {
    Tensor* zz = add(ctx, matmul(ctx, x[0], x[1], false, true), x[2]);
    CrossEntropyOptions o = opts_of(r);
    o.return_lse = true;
    LossOutputs l = cross_entropy_loss(ctx, zz, x[3], o);
    return std::vector<Tensor*>{l.loss, l.lse};
  };
  expect_close(got, run_graph(in, vals, unfused, Seed::Unit), 1e-10, "gpt2 vocabulary");
}

TEST(FusedLinearCE, AllRowsIgnored) {
  std::vector<LossInput> in = {hidden_in(5, 3), weight_in(7, 3), bias_in(7),
                               LossInput(Shape{5}, DType::I32, false, 0, 1, Vec(5, -100.0))};
  const std::vector<Vec> vals = draw_values("flce_ignored", in);
  for (Reduction red : {Reduction::Mean, Reduction::Sum}) {
    const GraphResult g = run_graph(
        in, vals,
        [red](Context& ctx, const std::vector<Tensor*>& x) {
          CrossEntropyOptions o;
          o.reduction = red;
          return std::vector<Tensor*>{
              fused_linear_cross_entropy(ctx, x[0], x[1], x[2], x[3], o, chunked(2)).loss};
        },
        Seed::Unit);
    EXPECT_EQ(g.outs[0], Vec{0.0});
    for (const Vec& gr : g.grads)
      for (double x : gr) EXPECT_EQ(x, 0.0);
  }
}

TEST(FusedLinearCE, LogitsDtypeOnTheCpu) {
  // The CPU executor keeps f32 logits whatever logits_dtype asks, for every loss with a full logits block
  // (bf16 inputs, which a GPU would run with 16-bit logits; bias, ignored rows, several chunks, an online
  // teacher): the losses are the f32 ones bit for bit. An f16 request changes nothing else; a bf16 one lets
  // the gradient GEMMs read the logits gradient rounded to bf16 (the bf16 GEMM), so dhidden and dW move by
  // bf16 rounding (nmse within kHead16GradTol, the tolerance CUDA's 16-bit gradients have) but not bit
  // for bit, while dbias (a column sum of the f32 gradient) stays exact.
  const int64_t n = 7, h = 5, ht = 6, v = 11, k = 4;
  std::vector<LossInput> in = {hidden_in(n, h, DType::BF16),
                               weight_in(v, h, DType::BF16),
                               bias_in(v, DType::BF16),
                               LossInput(Shape{n}, DType::I32, false, -1, double(v)),
                               LossInput({n, k}, DType::I32, false, 0, double(v)),
                               LossInput({n, k}, DType::F32, false, -4, -0.1),
                               LossInput({n, ht}, DType::BF16, false, -1, 1),
                               LossInput({v, ht}, DType::BF16, false, -1, 1)};
  const std::vector<Vec> vals = draw_values("flce_logits_dtype", in);
  auto build = [](int which, DType ldt) {
    return [which, ldt](Context& ctx, const std::vector<Tensor*>& x) {
      FusedLinearOptions f;
      f.chunk_rows = 3;
      f.logits_dtype = ldt;
      Tensor* loss = nullptr;
      if (which == 0) {
        CrossEntropyOptions o;
        o.ignore_index = -1;
        o.label_smoothing = 0.1f;
        loss = fused_linear_cross_entropy(ctx, x[0], x[1], x[2], x[3], o, f).loss;
      } else if (which == 1) {  // dense top-K: a hard loss
        TopKDistillOptions o;
        o.ignore_index = -1;
        o.w_hard = 0.5f;
        loss = fused_linear_topk_kd(ctx, x[0], x[1], x[2], x[4], x[5], nullptr, x[3], o, f).loss;
      } else if (which == 2) {
        DistillOptions o;
        o.ignore_index = -1;
        o.beta = 0.5f;
        o.temperature = 2.0f;
        loss = fused_linear_distill(ctx, x[0], x[1], x[2], x[6], x[7], nullptr, x[3], o, f).loss;
      } else {
        loss = fused_linear_entropy(ctx, x[0], x[1], x[2], 1.5f, Reduction::Mean, f);
      }
      return std::vector<Tensor*>{loss};
    };
  };
  for (int which = 0; which < 4; ++which) {
    const GraphResult want = run_graph(in, vals, build(which, DType::F32), Seed::Unit);
    for (DType ldt : {DType::BF16, DType::F16}) {
      const GraphResult got = run_graph(in, vals, build(which, ldt), Seed::Unit);
      EXPECT_EQ(got.outs, want.outs) << "loss " << which << ", " << dtype_name(ldt);
      ASSERT_EQ(want.grads.size(), 3u);
      ASSERT_EQ(got.grads.size(), 3u);
      if (ldt == DType::F16) {
        EXPECT_EQ(got.grads, want.grads) << "loss " << which << ", f16";
        continue;
      }
      for (size_t i = 0; i < 2; ++i) {  // dhidden, dW
        EXPECT_LE(nmse(got.grads[i], want.grads[i]), kHead16GradTol) << "loss " << which << ", grad " << i;
        EXPECT_NE(got.grads[i], want.grads[i]) << "loss " << which << ", grad " << i << ": not rounded";
      }
      EXPECT_EQ(got.grads[2], want.grads[2]) << "loss " << which << ", dbias";
    }
  }

  // The plan: 16-bit logits halve a row's bytes (the executor's gradient copy is not counted with them),
  // where the executor supports them and the path has a logits block.
  float dummy = 0;
  loss::FusedLinearProblem p;
  p.hidden = loss::Block::dense(&dummy, DType::BF16, 40, 8);
  p.weight = loss::Block::dense(&dummy, DType::BF16, 200, 8);  // Vp = 256
  p.dhidden = loss::Block::dense(&dummy, DType::F32, 40, 8);
  p.logits_budget = 256 * 4 * 6;
  EXPECT_EQ(loss::plan_chunks(p, false, 2, true).chunk_rows, 4);  // f32 asked for: 4 + 2 bytes per logit
  EXPECT_EQ(loss::plan_chunks(p, false, 2, true).logits_dtype, DType::F32);
  p.logits_dtype = DType::BF16;
  EXPECT_EQ(loss::plan_chunks(p, false, 2, false).chunk_rows, 4);  // the executor says no: f32
  // 2 bytes per logit, no copy: 12 rows fit, 40 rows make 4 chunks, evened out to 10 rows.
  EXPECT_EQ(loss::plan_chunks(p, false, 2, true).chunk_rows, 10);
  EXPECT_EQ(loss::plan_chunks(p, false, 2, true).logits_dtype, DType::BF16);
  p.teacher_hidden = p.hidden;
  p.teacher_weight = p.weight;
  p.spec.kind = loss::LossKind::Distill;
  EXPECT_EQ(loss::plan_chunks(p, false, 2, true).chunk_rows, 6);  // the teacher's 16-bit logits beside
  p.teacher_hidden = p.teacher_weight = {};
  p.spec.kind = loss::LossKind::SelectiveLogSoftmax;  // its backward needs f32 log-probabilities
  EXPECT_EQ(loss::plan_chunks(p, false, 2, true).logits_dtype, DType::F32);
  p.spec.kind = loss::LossKind::TopK;  // the K-sparse path: no logits block
  p.spec.topk.normalize_topk = true;
  p.spec.topk.ids = loss::Block::dense(&dummy, DType::I32, 40, 4);
  p.spec.topk.logprobs = loss::Block::dense(&dummy, DType::F32, 40, 4);
  EXPECT_TRUE(loss::plan_chunks(p, false, 2, true).sparse);
  EXPECT_EQ(loss::plan_chunks(p, false, 2, true).logits_dtype, DType::F32);
}

TEST(FusedLinearCE, BadInputThrows) {
  Context ctx(default_cpu_backend());
  Tensor* h = ctx.tensor(DType::F32, {4, 6});
  Tensor* w = ctx.tensor(DType::F32, {10, 6});
  Tensor* y = ctx.tensor(DType::I32, {4});
  expect_error(
      [&] {
        fused_linear_cross_entropy(ctx, h, ctx.tensor(DType::F32, {10, 5}), nullptr, y);
      },
      {"fused_linear_cross_entropy", "weight", "[10, 5]", "H = 6"});
  expect_error([&] { fused_linear_cross_entropy(ctx, h, w, ctx.tensor(DType::F32, {9}), y); },
               {"fused_linear_cross_entropy", "bias", "[9]", "V = 10"});
  expect_error([&] { fused_linear_cross_entropy(ctx, h, w, nullptr, ctx.tensor(DType::I32, {5})); },
               {"fused_linear_cross_entropy", "labels", "[5]", "N = 4"});
  expect_error([&] { fused_linear_cross_entropy(ctx, h, w, nullptr, ctx.tensor(DType::F32, {4})); },
               {"fused_linear_cross_entropy", "labels", "i32"});
  expect_error(
      [&] {
        fused_linear_cross_entropy(ctx, ctx.tensor(DType::I32, {4, 6}), w, nullptr, y);
      },
      {"fused_linear_cross_entropy", "hidden", "f32"});
  expect_error(
      [&] {
        fused_linear_cross_entropy(ctx, ctx.tensor(DType::F32, {2, 4, 6}), w, nullptr, y);
      },
      {"fused_linear_cross_entropy", "hidden", "2-D"});
  expect_error([&] { fused_linear_cross_entropy(ctx, h, nullptr, nullptr, y); },
               {"fused_linear_cross_entropy", "null"});
  CrossEntropyOptions o;
  o.label_smoothing = 1.5f;
  expect_error([&] { fused_linear_cross_entropy(ctx, h, w, nullptr, y, o); },
               {"fused_linear_cross_entropy", "label_smoothing", "[4, 6]", "[10, 6]"});
  o = {};
  o.z_loss = -1;
  expect_error([&] { fused_linear_cross_entropy(ctx, h, w, nullptr, y, o); }, {"z_loss"});
  FusedLinearOptions f;
  f.logits_budget = size_t(INT64_MAX) + 1;
  expect_error([&] { fused_linear_cross_entropy(ctx, h, w, nullptr, y, {}, f); }, {"logits_budget"});
  f = {};
  f.chunk_rows = -2;
  expect_error([&] { fused_linear_cross_entropy(ctx, h, w, nullptr, y, {}, f); }, {"chunk_rows"});
  for (DType bad : {DType::I32, DType::I64}) {
    f = {};
    f.logits_dtype = bad;
    expect_error([&] { fused_linear_cross_entropy(ctx, h, w, nullptr, y, {}, f); },
                 {"fused_linear_cross_entropy", "logits_dtype", dtype_name(bad), "[4, 6]"});
    expect_error([&] { fused_linear_entropy(ctx, h, w, nullptr, 1.0f, Reduction::Mean, f); },
                 {"fused_linear_entropy", "logits_dtype", dtype_name(bad)});
  }

  // A label out of range throws when the graph runs, naming the op, the inputs and the row.
  Tensor* bad = ctx.tensor(DType::I32, {4});
  set_data_int(bad, {1, 2, 10, 0});
  Graph g(ctx);
  g.forward(fused_linear_cross_entropy(ctx, h, w, nullptr, bad, {}, chunked(1)).loss);
  expect_error([&] { g.compute(); }, {"fused_linear_cross_entropy", "label 10", "row 2", "hidden f32[4, 6]"});
}

// An unaligned vocabulary gets zero-padded W copies whenever they leave room for a chunk of kRowAlign rows
// (or of every row), since its unaligned GEMMs are several times slower; they never push the chunk below it.
TEST(FusedLinearCE, UnalignedVocabularyIsPaddedWhenAChunkStillFits) {
  float dummy = 0;
  loss::FusedLinearProblem p;
  const int64_t v = 50257, vp = (v + loss::kVocabPad - 1) / loss::kVocabPad * loss::kVocabPad, hs = 2048,
                ht = 4000;
  p.hidden = loss::Block::dense(&dummy, DType::BF16, 16384, hs);
  p.weight = loss::Block::dense(&dummy, DType::BF16, v, hs);
  p.teacher_hidden = loss::Block::dense(&dummy, DType::BF16, 16384, ht);
  p.teacher_weight = loss::Block::dense(&dummy, DType::BF16, v, ht);
  p.logits_dtype = DType::BF16;
  const size_t copies = loss::padded_bytes(p.weight, vp) + loss::padded_bytes(p.teacher_weight, vp);
  const size_t row = size_t(vp) * 2 * 2;  // student and teacher bf16 logits
  auto plan = [&](size_t budget) {
    p.logits_budget = budget;
    return loss::plan_chunks(p, true, 2, true);
  };
  // The copies take more than half of 1 GiB (they once stayed unpadded for that) and are padded.
  ASSERT_GT(copies, size_t(1) << 29);
  loss::ChunkPlan a = plan(size_t(1) << 30);
  EXPECT_TRUE(a.pad_weights);
  EXPECT_GE(a.chunk_rows, loss::kRowAlign);
  EXPECT_EQ(a.padded_vocab, vp);
  // Exactly room for the copies and 128 rows: padded; one byte less: not.
  EXPECT_TRUE(plan(copies + loss::kRowAlign * row).pad_weights);
  EXPECT_FALSE(plan(copies + loss::kRowAlign * row - 1).pad_weights);
  // Without the executor asking for padding, never.
  p.logits_budget = size_t(1) << 30;
  EXPECT_FALSE(loss::plan_chunks(p, false, 2, true).pad_weights);
}

}  // namespace
}  // namespace retort::test
