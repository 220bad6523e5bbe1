// KV-cached decoding on CUDA: set_rows' case list (tests/ops/set_rows_cases.h) against its float64 reference
// and the CPU, ids out of range reported at synchronize, then the Decoder against the full forward on the
// device (f32: every position; bf16: the mixed-precision model against its own forward and the CPU decoder)
// and greedy generation against repeated argmax.
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "decoder_check.h"
#include "set_rows_cases.h"

namespace retort::test {
namespace {

class CudaDecode : public CudaTest {};

TEST_F(CudaDecode, SetRowsCasesMatchTheReferenceAndTheCpu) {
  for (const SetRowsCase& c : set_rows_cases()) {
    SCOPED_TRACE(c.name);
    const SetRowsResult gpu = run_set_rows_case(cuda_backend(), c);
    const SetRowsResult cpu = run_set_rows_case(default_cpu_backend(), c);
    ASSERT_EQ(gpu.got.size(), gpu.expect.size());
    // A copy, rounded to the destination's dtype to nearest even on both: exact.
    EXPECT_EQ(max_abs_diff(gpu.got, gpu.expect), 0.0);
    EXPECT_EQ(max_abs_diff(gpu.got, cpu.got), 0.0);
  }
}

TEST_F(CudaDecode, SetRowsIdOutOfRangeIsReportedAtSynchronize) {
  Backend& be = cuda_backend();
  Context ctx(be);
  Tensor* cache = ctx.tensor(DType::BF16, {4, 2}, "cache");
  Tensor* src = ctx.input(DType::F32, {2, 2}, "src");
  set_data(src, {1, 2, 3, 4});
  Tensor* ids = ctx.input(DType::I64, {2}, "ids");
  Tensor* out = cast(ctx, set_rows(ctx, cache, src, ids), DType::F32);
  out->flags |= kOutput;
  Graph g(ctx);
  g.forward(out);
  for (int64_t bad : {4, -1}) {
    set_data_int(ids, {bad, 1});
    g.compute();
    const std::string msg = error_of([&] { be.synchronize(); });
    EXPECT_NE(msg.find("set_rows"), std::string::npos) << msg;
    EXPECT_NE(msg.find("id " + std::to_string(bad)), std::string::npos) << msg;
    EXPECT_NE(msg.find("[0, 4)"), std::string::npos) << msg;
    EXPECT_NO_THROW(be.synchronize());  // reported once, then cleared
  }
  // The row with a good id was written; the bad one was skipped.
  EXPECT_EQ(get_data(cache), (std::vector<float>{0, 0, 3, 4, 0, 0, 0, 0}));
  set_data_int(ids, {3, 0});
  g.compute();
  EXPECT_EQ(get_data(out), (std::vector<float>{3, 4, 3, 4, 0, 0, 1, 2}));
}

TEST_F(CudaDecode, DecoderMatchesTheFullForwardAtEveryPosition) {
  // f32 on the device (cuBLASLt without TF32): only the order of f32 sums differs from forward.
  Context ctx(cuda_backend());
  const int64_t T = 150, B = 2, V = 37;
  auto m = make_model(ctx, small(T), 3);
  const std::vector<int32_t> toks = random_tokens(B * T, V, 7);
  const std::vector<float> want = full_logits(ctx, *m, toks, B);
  for (int64_t chunk : {int64_t(16), int64_t(1)}) {
    SCOPED_TRACE("prefill chunk " + std::to_string(chunk));
    Decoder d(ctx, *m, T, B, chunk);
    std::vector<int64_t> pieces = {23};
    pieces.resize(128, 1);
    const std::vector<float> got = decode_all(d, toks, B, pieces, V);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const size_t at = size_t((b * T + t) * V);
        const std::vector<float> g(got.begin() + at, got.begin() + at + V);
        const std::vector<float> e(want.begin() + at, want.begin() + at + V);
        ASSERT_LE(rel_err(g, e), 1e-4) << "sequence " << b << " position " << t;
      }
  }
}

TEST_F(CudaDecode, Bf16DecoderMatchesItsForwardAndTheCpu) {
  // The GPU default: bf16 matmuls, a bf16 cache. Against the bf16 forward on the device, and the same
  // decoder on the CPU: the differences are bf16 roundings flipped by a different order of f32 sums.
  TransformerConfig c = small(96);
  c.compute_dtype = DType::BF16;
  const std::vector<int32_t> toks = random_tokens(96, 37, 5);
  const std::vector<int64_t> pieces = {40, 1, 1, 30, 24};
  Context gctx(cuda_backend());
  auto gm = make_model(gctx, c, 4);
  const std::vector<float> want = full_logits(gctx, *gm, toks, 1);
  Decoder gd(gctx, *gm, 96, 1, 16);
  const std::vector<float> got = decode_all(gd, toks, 1, pieces, 37);
  EXPECT_LE(nmse(to_f64(got), to_f64(want)), 1e-4);
  EXPECT_LE(rel_err(got, want), 2e-2);
  CpuBackend cpu(2);
  Context cctx(cpu);
  auto cm = make_model(cctx, c, 4);
  Decoder cd(cctx, *cm, 96, 1, 16);
  const std::vector<float> on_cpu = decode_all(cd, toks, 1, pieces, 37);
  EXPECT_LE(nmse(to_f64(got), to_f64(on_cpu)), 1e-4);
}

TEST_F(CudaDecode, GreedyGenerationEqualsRepeatedArgmax) {
  Context ctx(cuda_backend());
  auto m = make_model(ctx, small(64), 8);
  const int64_t V = 37;
  std::vector<int32_t> seq = random_tokens(9, V, 2);
  GeneratorOptions o;
  o.prefill_chunk = 4;
  Generator gen(ctx, *m, o);
  SamplingOptions greedy;
  greedy.temperature = 0;
  const std::vector<int32_t> got = gen.generate(seq, 12, greedy);
  std::vector<int32_t> want;
  for (int i = 0; i < 12; ++i) {
    const std::vector<float> l = full_logits(ctx, *m, seq, 1);
    const float* row = l.data() + (int64_t(seq.size()) - 1) * V;
    want.push_back(int32_t(std::max_element(row, row + V) - row));
    seq.push_back(want.back());
  }
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace retort::test
