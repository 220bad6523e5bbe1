// The fused_linear_topk_logprobs case list, inputs, float64 reference and checks declared in
// topk_head_cases.h.
#include "topk_head_cases.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

namespace retort::test {

namespace {

constexpr int64_t kIgnore = -100;

HeadCase make(const std::string& name, int64_t n, int64_t v, int64_t h, int64_t k, DType dt = DType::F32,
              HeadFill fill = HeadFill::Random, int64_t chunk_rows = 0) {
  HeadCase c;
  c.name = name;
  c.n = n, c.v = v, c.h = h, c.k = k;
  c.dtype = dt;
  c.fill = fill;
  c.chunk_rows = chunk_rows;
  return c;
}

// values rounded to dt as a tensor of that dtype stores them.
Vec stored(const Vec& x, DType dt) {
  Context ctx(default_cpu_backend());
  Tensor* t = ctx.input(dt, {int64_t(x.size())}, "x");
  set_data(t, std::vector<float>(x.begin(), x.end()));
  const std::vector<float> s = get_data(t);
  return Vec(s.begin(), s.end());
}

Vec draw(HeadFill fill, int64_t n) {
  switch (fill) {
    case HeadFill::Random:
      return random_vec(n, -1, 1);
    case HeadFill::Integers: {
      const auto i = random_ints(n, -2, 3);
      return Vec(i.begin(), i.end());
    }
    case HeadFill::Huge:
      return random_vec(n, -30, 30);
  }
  return {};
}

}  // namespace

std::vector<HeadCase> head_cases() {
  using F = HeadFill;
  const DType f32 = DType::F32, bf16 = DType::BF16, f16 = DType::F16;
  std::vector<HeadCase> c = {
      make("small", 5, 9, 4, 3),
      make("k1", 7, 17, 8, 1),
      make("k_eq_v", 4, 13, 6, 13),
      make("v1", 3, 1, 5, 1),
      make("v1003_chunks3", 37, 1003, 24, 10, f32, F::Random, 3),
      make("v1003_bf16", 20, 1003, 32, 10, bf16),
      make("v1003_f16_chunks7", 20, 1003, 32, 10, f16, F::Random, 7),
      make("ties", 30, 500, 16, 50, f32, F::Integers),
      make("ties_chunks4", 30, 777, 16, 64, f32, F::Integers, 4),
      make("ties_bf16", 12, 2001, 8, 33, bf16, F::Integers, 5),
      make("k_eq_v_ties", 6, 70, 3, 70, f32, F::Integers, 4),
      make("huge", 9, 333, 16, 12, f32, F::Huge, 2),
      make("h1", 5, 100, 1, 7),
      make("v49152_k64_bf16", 24, 49152, 64, 64, bf16, F::Random, 10),
      make("v49152_k64_f32_one_chunk", 6, 49152, 48, 64),
  };
  HeadCase ign = make("ignored_rows", 40, 517, 20, 16, f32, F::Random, 9);
  ign.ignore_every = 3;
  HeadCase all_ign = make("all_rows_ignored", 6, 50, 8, 5, f32, F::Random, 4);
  all_ign.ignore_every = 1;
  HeadCase none = make("no_targets", 11, 300, 12, 9, f32, F::Random, 4);
  none.targets = false;
  // 64 KiB of f32 logits hold 16 rows of 1,003 (padded to 1,024): several chunks from the budget.
  HeadCase budget = make("budget_chunks", 70, 1003, 16, 20);
  budget.logits_budget = size_t(64) << 10;
  c.insert(c.end(), {ign, all_ign, none, budget});
  return c;
}

HeadInput make_head_input(const HeadCase& c) {
  reseed(c.name);
  HeadInput in;
  in.hidden = stored(draw(c.fill, c.n * c.h), c.dtype);
  in.weight = stored(draw(c.fill, c.v * c.h), c.dtype);
  const auto t = random_ints(c.n, 0, c.v);
  in.targets.assign(t.begin(), t.end());
  for (int64_t r = 0; r < c.n; ++r)
    if (c.ignore_every > 0 && r % c.ignore_every == 0) in.targets[size_t(r)] = kIgnore;
  return in;
}

HeadResult head_reference(const HeadCase& c, const HeadInput& in) {
  HeadResult out;
  out.logits.resize(size_t(c.n * c.v));
  std::vector<int64_t> order(static_cast<size_t>(c.v));
  for (int64_t r = 0; r < c.n; ++r) {
    double* z = out.logits.data() + r * c.v;
    for (int64_t j = 0; j < c.v; ++j) {
      double s = 0;
      for (int64_t i = 0; i < c.h; ++i) s += in.hidden[size_t(r * c.h + i)] * in.weight[size_t(j * c.h + i)];
      z[j] = s;
    }
    const double m = *std::max_element(z, z + c.v);
    double s = 0;
    for (int64_t j = 0; j < c.v; ++j) s += std::exp(z[j] - m);
    const double lse = m + std::log(s);
    out.lse.push_back(float(lse));
    std::iota(order.begin(), order.end(), int64_t(0));
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return z[a] > z[b]; });
    for (int64_t i = 0; i < c.k; ++i) {
      out.ids.push_back(order[size_t(i)]);
      out.logprobs.push_back(float(z[order[size_t(i)]] - lse));
    }
    const int64_t y = in.targets[size_t(r)];
    if (c.targets && y != kIgnore) {
      out.nll += lse - z[y];
      ++out.valid;
    }
  }
  return out;
}

namespace {

struct Built {
  Tensor *hidden, *weight, *targets;
};

Built inputs(Context& ctx, const HeadCase& c, const HeadInput& in) {
  Built b;
  b.hidden = ctx.input(c.dtype, {c.n, c.h}, "hidden");
  b.weight = ctx.input(c.dtype, {c.v, c.h}, "weight");
  set_data(b.hidden, std::vector<float>(in.hidden.begin(), in.hidden.end()));
  set_data(b.weight, std::vector<float>(in.weight.begin(), in.weight.end()));
  b.targets = nullptr;
  if (c.targets) {
    b.targets = ctx.input(DType::I32, {c.n}, "targets");
    set_data_int(b.targets, in.targets);
  }
  return b;
}

}  // namespace

HeadResult run_head(Backend& backend, const HeadCase& c, const HeadInput& in) {
  Context ctx(backend);
  const Built b = inputs(ctx, c, in);
  FusedLinearOptions f;
  f.chunk_rows = c.chunk_rows;
  f.logits_budget = c.logits_budget;
  TopKLogprobsOptions o;
  o.return_lse = true;
  const TopKLogprobsOutputs out = fused_linear_topk_logprobs(ctx, b.hidden, b.weight, c.k, b.targets, o, f);
  EXPECT_EQ(out.nll_sum != nullptr, c.targets);
  Graph g(ctx);
  g.forward(out.logprobs);
  g.forward(out.lse);
  g.set_poison(true);  // an output slot no kernel writes shows as NaN
  g.compute();
  HeadResult r{get_data(out.logprobs), get_data_int(out.ids), get_data(out.lse), 0, 0, {}};
  if (out.nll_sum) r.nll = get_data(out.nll_sum)[0];
  return r;
}

HeadResult run_unfused(Backend& backend, const HeadCase& c, const HeadInput& in) {
  Context ctx(backend);
  const Built b = inputs(ctx, c, in);
  Tensor* logits = matmul(ctx, b.hidden, b.weight, false, true);
  const TopKLogprobs top = topk_logprobs(ctx, logits, c.k);
  top.logprobs->flags |= kOutput;
  Tensor* targets = b.targets;
  if (!targets) {  // the lse only
    targets = ctx.input(DType::I32, {c.n}, "no_targets");
    set_data_int(targets, std::vector<int64_t>(size_t(c.n), kIgnore));
  }
  CrossEntropyOptions ce;
  ce.reduction = Reduction::Sum;
  ce.return_lse = true;
  const LossOutputs l = cross_entropy_loss(ctx, logits, targets, ce);
  l.loss->flags |= kOutput;
  Graph g(ctx);
  g.forward(top.logprobs);
  g.forward(l.loss);
  g.forward(l.lse);
  g.set_poison(true);
  g.compute();
  return {get_data(top.logprobs), get_data_int(top.ids), get_data(l.lse), double(get_data(l.loss)[0]), 0, {}};
}

void expect_matches_reference(const HeadCase& c, const HeadResult& got, const HeadResult& ref, double tol,
                              bool exact_ids) {
  ASSERT_EQ(got.ids.size(), size_t(c.n * c.k));
  ASSERT_EQ(got.logprobs.size(), size_t(c.n * c.k));
  ASSERT_EQ(got.lse.size(), size_t(c.n));
  int bad = 0;
  auto fail = [&](int64_t r, int64_t k, const std::string& what) {
    if (bad++ < 8) ADD_FAILURE() << c.name << ": row " << r << " slot " << k << ": " << what;
  };
  for (int64_t r = 0; r < c.n; ++r) {
    const double* z = ref.logits.data() + r * c.v;
    const double lse = ref.lse[size_t(r)];
    if (!(std::abs(got.lse[size_t(r)] - lse) <= tol * (1 + std::abs(lse))))
      fail(r, -1, "lse " + std::to_string(got.lse[size_t(r)]) + ", reference " + std::to_string(lse));
    std::set<int64_t> seen;
    for (int64_t k = 0; k < c.k; ++k) {
      const size_t i = size_t(r * c.k + k);
      const int64_t id = got.ids[i];
      if (id < 0 || id >= c.v || !seen.insert(id).second) {
        fail(r, k, "id " + std::to_string(id) + " out of range or repeated");
        continue;
      }
      if (exact_ids && id != ref.ids[i])
        fail(r, k, "id " + std::to_string(id) + ", reference " + std::to_string(ref.ids[i]));
      // Near ties may swap: the chosen entry must be as good as the reference's at this slot, up to tol.
      if (z[id] < z[ref.ids[i]] - tol * (1 + std::abs(z[id])))
        fail(r, k,
             "id " + std::to_string(id) + " has logit " + std::to_string(z[id]) + ", the slot's best " +
                 std::to_string(z[ref.ids[i]]));
      // The f32 logits carry an error relative to their own size, which z − lse keeps.
      const double want = z[id] - lse;
      if (!(std::abs(got.logprobs[i] - want) <= tol * (1 + std::abs(z[id]) + std::abs(lse))))
        fail(r, k, "logprob " + std::to_string(got.logprobs[i]) + ", reference " + std::to_string(want));
    }
  }
  EXPECT_NEAR(got.nll, ref.nll, tol * (1 + std::abs(ref.nll)) + tol * double(ref.valid)) << c.name << ": nll";
  EXPECT_EQ(bad, 0);
}

void expect_close(const HeadCase& c, const HeadResult& a, const HeadResult& b, double tol) {
  ASSERT_EQ(a.ids.size(), b.ids.size());
  int bad = 0;
  for (size_t i = 0; i < b.ids.size(); ++i) {
    const size_t k = i % size_t(c.k);
    const float w = b.logprobs[i];
    // A value with no neighbour within tol is no near tie: its id must be the same.
    // Errors scale with the logits, whose size the row's lse bounds.
    const double t = tol * (1 + std::abs(w) + std::abs(b.lse[i / size_t(c.k)]));
    const bool alone =
        (k == 0 || b.logprobs[i - 1] - w > t) && (k + 1 == size_t(c.k) || w - b.logprobs[i + 1] > t);
    if ((alone && a.ids[i] != b.ids[i]) || !(std::abs(a.logprobs[i] - w) <= t)) {
      if (bad++ < 8)
        ADD_FAILURE() << c.name << ": row " << i / size_t(c.k) << " slot " << k << ": id " << a.ids[i]
                      << " logprob " << a.logprobs[i] << " against id " << b.ids[i] << " logprob " << w;
    }
  }
  for (size_t r = 0; r < b.lse.size(); ++r)
    if (!(std::abs(a.lse[r] - b.lse[r]) <= tol * (1 + std::abs(b.lse[r]))) && bad++ < 8)
      ADD_FAILURE() << c.name << ": row " << r << ": lse " << a.lse[r] << " against " << b.lse[r];
  EXPECT_NEAR(a.nll, b.nll, tol * (1 + std::abs(b.nll)) * double(std::max<int64_t>(1, c.n)));
  EXPECT_EQ(bad, 0);
}

}  // namespace retort::test
