// Quantized weights decoded on the device (CudaBackend::dequantize_into) equal the host decoders bit for bit:
// random blocks of every decodable type, into f32, bf16 and f16 parameters.
#include <random>

#include "cuda_test_util.h"

namespace retort::test {
namespace {

class CudaDequant : public CudaTest {};

// Random blocks whose f16 scales are small normal numbers (never NaN or inf), so every decoded value is
// finite and a comparison of bits is meaningful.
std::vector<uint8_t> random_blocks(QuantType t, int64_t blocks, uint64_t seed) {
  const QuantTraits& q = quant_traits(t);
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> b(size_t(blocks * q.block_bytes));
  for (auto& x : b) x = uint8_t(rng());
  if (t == QuantType::F32 || t == QuantType::F16 || t == QuantType::BF16) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int64_t i = 0; i < blocks; ++i) {
      const float v = nd(rng);
      uint8_t* p = b.data() + i * q.block_bytes;
      if (t == QuantType::F32) std::memcpy(p, &v, 4);
      if (t == QuantType::F16) io::store_le16(p, f32_to_f16(v));
      if (t == QuantType::BF16) io::store_le16(p, f32_to_bf16(v));
    }
    return b;
  }
  // Every f16 field of these layouts sits at the offsets below; 0x1400-0x17ff are f16 values near 1e-3.
  std::vector<int> f16_at;
  switch (t) {
    case QuantType::Q8_0:
    case QuantType::Q4_0:
    case QuantType::Q5_0:
      f16_at = {0};
      break;
    case QuantType::Q4_1:
    case QuantType::Q5_1:
    case QuantType::Q4_K:
    case QuantType::Q5_K:
      f16_at = {0, 2};
      break;
    case QuantType::Q6_K:
      f16_at = {208};
      break;
    default:
      break;
  }
  for (int64_t i = 0; i < blocks; ++i)
    for (int off : f16_at)
      io::store_le16(b.data() + i * q.block_bytes + off, uint16_t(0x1400 + (rng() & 0x3ff)));
  return b;
}

TEST_F(CudaDequant, EveryTypeEqualsTheHostDecoder) {
  const QuantType types[] = {QuantType::F32,  QuantType::F16,  QuantType::BF16, QuantType::Q8_0,
                             QuantType::Q4_0, QuantType::Q4_1, QuantType::Q5_0, QuantType::Q5_1,
                             QuantType::Q4_K, QuantType::Q5_K, QuantType::Q6_K};
  CpuBackend cpu(1);
  for (QuantType t : types)
    for (DType out : {DType::F32, DType::BF16, DType::F16}) {
      const QuantTraits& q = quant_traits(t);
      const int64_t blocks = 37,
                    n = blocks * q.block_elems;  // several kernel blocks' worth and a ragged tail
      const std::vector<uint8_t> raw = random_blocks(t, blocks, uint64_t(t) * 7 + uint64_t(out));
      Context cctx(cpu), gctx(cuda_backend());
      Tensor* h = cctx.param(out, {n / 8, 8}, "h");
      Tensor* d = gctx.param(out, {n / 8, 8}, "d");
      cpu.dequantize_into(h, t, raw.data());
      cuda_backend().dequantize_into(d, t, raw.data());
      EXPECT_EQ(get_bytes(h), get_bytes(d)) << q.name << " -> " << dtype_name(out);
    }
}

TEST_F(CudaDequant, BadTypeOrShapeThrows) {
  Context ctx(cuda_backend());
  Tensor* d = ctx.param(DType::F32, {3, 32}, "d");
  std::vector<uint8_t> raw(1024);
  EXPECT_NE(error_of([&] { cuda_backend().dequantize_into(d, QuantType::Q2_K, raw.data()); }).find("Q2_K"),
            std::string::npos);
  Tensor* odd = ctx.param(DType::F32, {3, 7}, "odd");
  EXPECT_NE(
      error_of([&] { cuda_backend().dequantize_into(odd, QuantType::Q8_0, raw.data()); }).find("blocks"),
      std::string::npos);
}

}  // namespace
}  // namespace retort::test
