// The topk_logprobs case list, inputs and float64 reference declared in topk_cases.h.
#include "topk_cases.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace retort::test {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TopKCase make(const std::string& name, int64_t n, int64_t v, int64_t k, DType dt = DType::F32,
              TopKFill fill = TopKFill::Uniform, TopKLayout layout = TopKLayout::Contiguous) {
  return {name, n, v, k, dt, fill, layout};
}

// Row-major [n][v] values of a fill, drawn from the harness generator (seeded by the caller).
Vec draw(TopKFill fill, int64_t n, int64_t v) {
  Vec x(size_t(n * v));
  auto at = [&](int64_t r, int64_t j) -> double& { return x[size_t(r * v + j)]; };
  switch (fill) {
    case TopKFill::Uniform:
      x = random_vec(n * v, -4, 4);
      break;
    case TopKFill::Normal: {
      std::normal_distribution<double> d(0.0, 3.0);
      for (double& e : x) e = d(rng());
      break;
    }
    case TopKFill::Ties: {
      const auto i = random_ints(n * v, 0, 4);
      std::copy(i.begin(), i.end(), x.begin());
      break;
    }
    case TopKFill::SignedZeros: {
      const double pick[] = {-0.0, 0.0, -1.0, 0.5};
      for (double& e : x) e = pick[random_ints(1, 0, 4)[0]];
      break;
    }
    case TopKFill::NegInf: {
      x = random_vec(n * v, -4, 4);
      const auto drop = random_ints(n * v, 0, 10);
      for (size_t i = 0; i < x.size(); ++i)
        if (drop[i] < 3) x[i] = -kInf;
      for (int64_t j = 0; j < v; ++j) at(0, j) = -kInf;
      if (n > 1)
        for (int64_t j = 0; j < v; ++j) at(1, j) = j == v / 3 || j == v - 1 ? double(j % 7) : -kInf;
      break;
    }
    case TopKFill::Rising:
    case TopKFill::Falling:
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < v; ++j)
          at(r, j) = 0.1 * double(r) + 0.003 * double(fill == TopKFill::Rising ? j : v - 1 - j) - 4.0;
      break;
    case TopKFill::AllEqual:
      std::fill(x.begin(), x.end(), 0.25);
      break;
    case TopKFill::Huge:
      x = random_vec(n * v, -1e4, 1e4);
      break;
    case TopKFill::Peaks: {
      x = random_vec(n * v, -4, 0);
      const auto lift = random_vec(n * v, 5, 9);
      for (int64_t r = 0; r < n; ++r) {
        // Columns 4096 apart are read by one thread of the CUDA kernel, and so are 8 neighbours: both put
        // more of the top-K in one thread than its own list keeps.
        for (int64_t j = 3 + r; j < v; j += 4096) at(r, j) = lift[size_t(r * v + j)];
        for (int64_t j = v / 3; j < std::min(v, v / 3 + 40); ++j) at(r, j) = lift[size_t(r * v + j)];
      }
      break;
    }
  }
  return x;
}

}  // namespace

std::vector<TopKCase> topk_cases() {
  using F = TopKFill;
  using L = TopKLayout;
  const DType f32 = DType::F32, bf16 = DType::BF16, f16 = DType::F16;
  return {
      make("small", 5, 9, 3),
      make("k1", 6, 17, 1),
      make("k_eq_v", 4, 13, 13),
      make("v1", 3, 1, 1),
      make("v1003_f32", 7, 1003, 10),
      make("v1003_bf16", 7, 1003, 10, bf16),
      make("v1003_f16", 7, 1003, 10, f16),
      make("k_eq_v_wide", 2, 700, 700, f32, F::Normal),
      make("v49152_k64_f32", 4, 49152, 64, f32, F::Normal),
      make("v49152_k64_bf16", 4, 49152, 64, bf16, F::Normal),
      make("v151936_k64_f32", 3, 151936, 64, f32, F::Normal),
      make("v151936_k64_bf16", 3, 151936, 64, bf16, F::Normal),
      make("v151936_k128_f16", 2, 151936, 128, f16, F::Normal),
      make("k256", 3, 5000, 256, f32, F::Normal),
      make("k1024", 2, 9000, 1024, bf16, F::Normal),
      make("k2048", 2, 6000, 2048, f32, F::Uniform),
      make("transposed", 9, 300, 7, f32, F::Uniform, L::Transposed),
      make("transposed_bf16", 5, 4500, 33, bf16, F::Normal, L::Transposed),
      make("sliced_bf16", 6, 1001, 16, bf16, F::Normal, L::Sliced),
      make("sliced_f32", 3, 20000, 64, f32, F::Normal, L::Sliced),
      make("ties", 8, 500, 50, f32, F::Ties),
      make("ties_wide_bf16", 4, 49152, 64, bf16, F::Ties),
      make("signed_zeros", 6, 301, 20, f32, F::SignedZeros),
      make("signed_zeros_f16", 3, 5003, 100, f16, F::SignedZeros),
      make("all_equal", 3, 37, 5, f32, F::AllEqual),
      make("all_equal_wide", 3, 10000, 64, bf16, F::AllEqual),
      make("neg_inf", 6, 40, 8, f32, F::NegInf),
      make("neg_inf_wide", 4, 9000, 64, bf16, F::NegInf),
      make("rising", 2, 5000, 64, f32, F::Rising),
      make("falling", 2, 5000, 64, f32, F::Falling),
      make("rising_bf16", 2, 49152, 128, bf16, F::Rising),
      make("huge", 4, 333, 12, f32, F::Huge),
      make("huge_wide", 2, 20000, 64, f32, F::Huge),
      make("peaks", 3, 49152, 64, f32, F::Peaks),
      make("peaks_bf16", 3, 151936, 128, bf16, F::Peaks),
  };
}

TopKInput make_topk_input(Context& ctx, const TopKCase& c) {
  reseed(c.name);
  const Vec x = draw(c.fill, c.n, c.v);
  TopKInput in;
  std::vector<float> stored;
  switch (c.layout) {
    case TopKLayout::Contiguous: {
      Tensor* t = ctx.input(c.dtype, {c.n, c.v}, "logits");
      set_data(t, std::vector<float>(x.begin(), x.end()));
      in.logits = t;
      stored = get_data(t);
      break;
    }
    case TopKLayout::Transposed: {
      Tensor* t = ctx.input(c.dtype, {c.v, c.n}, "logits_t");
      std::vector<float> s(size_t(c.n * c.v));
      for (int64_t r = 0; r < c.n; ++r)
        for (int64_t j = 0; j < c.v; ++j) s[size_t(j * c.n + r)] = float(x[size_t(r * c.v + j)]);
      set_data(t, s);
      in.logits = transpose(ctx, t);
      stored = get_data(in.logits);  // logical order of the view: [n][v]
      break;
    }
    case TopKLayout::Sliced: {
      const int64_t w = c.v + 12;
      Tensor* t = ctx.input(c.dtype, {c.n, w}, "logits_wide");
      const Vec pad =
          random_vec(c.n * w, 50, 60);  // larger than any logit: a kernel reading past the slice shows
      std::vector<float> s(pad.begin(), pad.end());
      for (int64_t r = 0; r < c.n; ++r)
        for (int64_t j = 0; j < c.v; ++j) s[size_t(r * w + 5 + j)] = float(x[size_t(r * c.v + j)]);
      set_data(t, s);
      in.logits = slice(ctx, t, 0, 5, c.v);
      stored = get_data(in.logits);
      break;
    }
  }
  in.values = Vec(stored.begin(), stored.end());
  return in;
}

TopKResult topk_reference(const Vec& values, int64_t n, int64_t v, int64_t k) {
  TopKResult out;
  std::vector<int64_t> order(static_cast<size_t>(v));
  for (int64_t r = 0; r < n; ++r) {
    const double* z = values.data() + r * v;
    double m = -kInf;
    for (int64_t j = 0; j < v; ++j) m = std::max(m, z[j]);
    double s = 0;
    if (m > -kInf)
      for (int64_t j = 0; j < v; ++j) s += std::exp(z[j] - m);
    const double lse = m + std::log(s);
    std::iota(order.begin(), order.end(), int64_t(0));
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return z[a] > z[b]; });
    for (int64_t i = 0; i < k; ++i) {
      const int64_t id = order[size_t(i)];
      out.ids.push_back(id);
      out.logprobs.push_back(m == -kInf ? -std::numeric_limits<float>::infinity() : float(z[id] - lse));
    }
  }
  return out;
}

TopKResult run_topk(Backend& backend, const TopKCase& c) {
  Context ctx(backend);
  const TopKInput in = make_topk_input(ctx, c);
  const TopKLogprobs o = topk_logprobs(ctx, in.logits, c.k);
  o.logprobs->flags |= kOutput;
  Graph g(ctx);
  g.forward(o.logprobs);
  g.set_poison(true);  // an output slot no kernel writes shows as NaN
  g.compute();
  return {get_data(o.logprobs), get_data_int(o.ids)};
}

}  // namespace retort::test
