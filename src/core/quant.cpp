#include "quant.h"

#include <cstring>
#include <vector>

#include "backend.h"
#include "error.h"

namespace retort {

namespace {

struct TraitsEntry {
  uint32_t id;
  QuantTraits traits;
};

// Block sizes as ggml defines them (gguf.constants.GGML_QUANT_SIZES), so files with types retort cannot
// decode still get their tensor sizes checked.
constexpr TraitsEntry kTraits[] = {
    {0, {"F32", 1, 4, true}},          {1, {"F16", 1, 2, true}},          {2, {"Q4_0", 32, 18, true}},
    {3, {"Q4_1", 32, 20, true}},       {6, {"Q5_0", 32, 22, true}},       {7, {"Q5_1", 32, 24, true}},
    {8, {"Q8_0", 32, 34, true}},       {9, {"Q8_1", 32, 40, false}},      {10, {"Q2_K", 256, 84, false}},
    {11, {"Q3_K", 256, 110, false}},   {12, {"Q4_K", 256, 144, true}},    {13, {"Q5_K", 256, 176, true}},
    {14, {"Q6_K", 256, 210, true}},    {15, {"Q8_K", 256, 292, false}},   {16, {"IQ2_XXS", 256, 66, false}},
    {17, {"IQ2_XS", 256, 74, false}},  {18, {"IQ3_XXS", 256, 98, false}}, {19, {"IQ1_S", 256, 50, false}},
    {20, {"IQ4_NL", 32, 18, false}},   {21, {"IQ3_S", 256, 110, false}},  {22, {"IQ2_S", 256, 82, false}},
    {23, {"IQ4_XS", 256, 136, false}}, {24, {"I8", 1, 1, false}},         {25, {"I16", 1, 2, false}},
    {26, {"I32", 1, 4, false}},        {27, {"I64", 1, 8, false}},        {28, {"F64", 1, 8, false}},
    {29, {"IQ1_M", 256, 56, false}},   {30, {"BF16", 1, 2, true}},        {34, {"TQ1_0", 256, 54, false}},
    {35, {"TQ2_0", 256, 66, false}},   {39, {"MXFP4", 32, 17, false}},
};

}  // namespace

const QuantTraits* find_quant_traits(uint32_t id) {
  for (const TraitsEntry& e : kTraits)
    if (e.id == id) return &e.traits;
  return nullptr;
}

const QuantTraits& quant_traits(QuantType t) {
  const QuantTraits* tr = find_quant_traits(uint32_t(t));
  RT_ASSERT(tr != nullptr);
  return *tr;
}

const char* dequantizable_types() {
  return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K";
}

namespace {

// Checks that t decodes and n is a whole number of its blocks; returns the number of blocks.
int64_t checked_blocks(QuantType t, int64_t n) {
  const QuantTraits& tr = quant_traits(t);
  RT_CHECK(tr.dequantizable, "dequantize: type ", tr.name, " is not supported (retort decodes ",
           dequantizable_types(), ")");
  RT_CHECK(n >= 0 && n % tr.block_elems == 0, "dequantize: ", n, " elements of ", tr.name,
           " are not a whole number of its ", tr.block_elems, "-element blocks");
  return n / tr.block_elems;
}

}  // namespace

void dequantize(QuantType t, const uint8_t* src, float* dst, int64_t n) {
  const int64_t blocks = checked_blocks(t, n);
  if (t == QuantType::F32) {
    if (n > 0) std::memcpy(dst, src, size_t(n) * 4);
    return;
  }
  const QuantTraits& tr = quant_traits(t);
  for (int64_t b = 0; b < blocks; ++b)
    quant::dequant_block(t, src + b * tr.block_bytes, dst + b * tr.block_elems);
}

void dequantize(QuantType t, const uint8_t* src, DType out, void* dst, int64_t n) {
  RT_CHECK(is_float(out), "dequantize: the output dtype must be f32, bf16 or f16, not ", dtype_name(out));
  if (out == DType::F32) return dequantize(t, src, static_cast<float*>(dst), n);
  const int64_t blocks = checked_blocks(t, n);
  // 16-bit data already in the wanted format is copied, keeping every bit (NaN payloads included).
  if ((t == QuantType::F16 && out == DType::F16) || (t == QuantType::BF16 && out == DType::BF16)) {
    if (n > 0) std::memcpy(dst, src, size_t(n) * 2);
    return;
  }
  const QuantTraits& tr = quant_traits(t);
  auto* o = static_cast<uint16_t*>(dst);
  float tmp[quant::kQKK];
  for (int64_t b = 0; b < blocks; ++b) {
    quant::dequant_block(t, src + b * tr.block_bytes, tmp);
    uint16_t* ob = o + b * tr.block_elems;
    if (out == DType::BF16)
      for (int64_t i = 0; i < tr.block_elems; ++i) ob[i] = f32_to_bf16(tmp[i]);
    else
      for (int64_t i = 0; i < tr.block_elems; ++i) ob[i] = f32_to_f16(tmp[i]);
  }
}

}  // namespace retort

namespace retort {

void Backend::run_nodes(const std::vector<Tensor*>& nodes, uint64_t, std::unique_ptr<Replay>&) {
  for (Tensor* n : nodes)
    if (n->op != Op::View && n->op != Op::AuxOutput) run(n);
}

namespace {
class ReadDone : public PendingRead {
 public:
  explicit ReadDone(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {}
  const void* wait() override { return bytes_.data(); }

 private:
  std::vector<uint8_t> bytes_;
};
}  // namespace

std::unique_ptr<PendingRead> Backend::read_later(const void* src, size_t bytes) {
  std::vector<uint8_t> out(bytes);
  read(out.data(), src, bytes);
  return std::make_unique<ReadDone>(std::move(out));
}

void Backend::copy(void* dst, const void* src, size_t bytes) {
  std::vector<uint8_t> staged(bytes);
  read(staged.data(), src, bytes);
  write(dst, staged.data(), bytes);
}

void Backend::dequantize_into(Tensor* dst, QuantType t, const uint8_t* host_blocks) {
  RT_CHECK(dst != nullptr && is_float(dst->dtype) && dst->is_contiguous() && dst->data != nullptr,
           "dequantize_into: dst must be a contiguous float tensor with storage, got ",
           dst ? dst->describe() : std::string("null"));
  const int64_t n = dst->nelements();
  if (is_host()) {
    dequantize(t, host_blocks, dst->dtype, dst->data, n);
    return;
  }
  std::vector<uint8_t> tmp(size_t(n) * dtype_size(dst->dtype));
  dequantize(t, host_blocks, dst->dtype, tmp.data(), n);
  write(dst->data, tmp.data(), tmp.size());
}

}  // namespace retort
