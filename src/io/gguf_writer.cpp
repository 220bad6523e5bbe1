#include "gguf_writer.h"

#include <bit>
#include <cmath>

#include "../core/error.h"
#include "file.h"

namespace retort {

namespace {

// ggml's GGML_MAX_NAME is 64 bytes with the terminating zero.
constexpr size_t kMaxTensorName = 63;

using Bytes = std::vector<uint8_t>;

void append_string(Bytes& out, const std::string& s) {
  io::append_le64(out, s.size());
  io::append_bytes(out, s.data(), s.size());
}

GgufWriter::Value scalar(GgufType t, uint64_t bits, int width) {
  GgufWriter::Value v;
  v.type = t;
  for (int i = 0; i < width; ++i) v.payload.push_back(uint8_t(bits >> (8 * i)));
  return v;
}

// Q8_0 as ggml's quantize_row_q8_0_ref: the scale stored as f16, the quotients from the f32 scale.
void quantize_q8_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / quant::kQK; ++b) {
    const float* xb = x + b * quant::kQK;
    float amax = 0;
    for (int j = 0; j < quant::kQK; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    uint8_t* ob = out + b * 34;
    io::store_le16(ob, f32_to_f16(d));
    for (int j = 0; j < quant::kQK; ++j) ob[2 + j] = uint8_t(int8_t(std::round(xb[j] * id)));
  }
}

}  // namespace

GgufWriter::Value GgufWriter::u8(uint8_t v) {
  return scalar(GgufType::U8, v, 1);
}
GgufWriter::Value GgufWriter::i8(int8_t v) {
  return scalar(GgufType::I8, uint8_t(v), 1);
}
GgufWriter::Value GgufWriter::u16(uint16_t v) {
  return scalar(GgufType::U16, v, 2);
}
GgufWriter::Value GgufWriter::i16(int16_t v) {
  return scalar(GgufType::I16, uint16_t(v), 2);
}
GgufWriter::Value GgufWriter::u32(uint32_t v) {
  return scalar(GgufType::U32, v, 4);
}
GgufWriter::Value GgufWriter::i32(int32_t v) {
  return scalar(GgufType::I32, uint32_t(v), 4);
}
GgufWriter::Value GgufWriter::f32(float v) {
  return scalar(GgufType::F32, std::bit_cast<uint32_t>(v), 4);
}
GgufWriter::Value GgufWriter::boolean(bool v) {
  return scalar(GgufType::Bool, v ? 1 : 0, 1);
}
GgufWriter::Value GgufWriter::u64(uint64_t v) {
  return scalar(GgufType::U64, v, 8);
}
GgufWriter::Value GgufWriter::i64(int64_t v) {
  return scalar(GgufType::I64, uint64_t(v), 8);
}
GgufWriter::Value GgufWriter::f64(double v) {
  return scalar(GgufType::F64, std::bit_cast<uint64_t>(v), 8);
}
GgufWriter::Value GgufWriter::string(const std::string& s) {
  Value v;
  v.type = GgufType::String;
  append_string(v.payload, s);
  return v;
}

GgufWriter::Value GgufWriter::array(const std::vector<Value>& items, GgufType empty_elem) {
  const GgufType elem = items.empty() ? empty_elem : items[0].type;
  Value v;
  v.type = GgufType::Array;
  io::append_le32(v.payload, uint32_t(elem));
  io::append_le64(v.payload, items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    RT_CHECK(items[i].type == elem, "GgufWriter::array: element ", i, " is ", gguf_type_name(items[i].type),
             ", element 0 is ", gguf_type_name(elem), " (an array holds one type)");
    io::append_bytes(v.payload, items[i].payload.data(), items[i].payload.size());
  }
  return v;
}

GgufWriter::Value GgufWriter::strings(const std::vector<std::string>& s) {
  Value v;
  v.type = GgufType::Array;
  io::append_le32(v.payload, uint32_t(GgufType::String));
  io::append_le64(v.payload, s.size());
  for (const std::string& x : s) append_string(v.payload, x);
  return v;
}

GgufWriter::Value GgufWriter::i32s(const std::vector<int32_t>& x) {
  Value v;
  v.type = GgufType::Array;
  io::append_le32(v.payload, uint32_t(GgufType::I32));
  io::append_le64(v.payload, x.size());
  for (int32_t e : x) io::append_le32(v.payload, uint32_t(e));
  return v;
}

GgufWriter::Value GgufWriter::f32s(const std::vector<float>& x) {
  Value v;
  v.type = GgufType::Array;
  io::append_le32(v.payload, uint32_t(GgufType::F32));
  io::append_le64(v.payload, x.size());
  for (float e : x) io::append_le32(v.payload, std::bit_cast<uint32_t>(e));
  return v;
}

bool GgufWriter::has(const std::string& key) const {
  for (const auto& [k, v] : kv_)
    if (k == key) return true;
  return false;
}

void GgufWriter::set(const std::string& key, Value v) {
  RT_CHECK(!key.empty(), "GgufWriter::set: empty metadata key");
  RT_CHECK(!has(key), "GgufWriter::set: metadata key '", key, "' is set twice");
  if (key == "general.alignment") {
    RT_CHECK(v.type == GgufType::U32, "GgufWriter::set: general.alignment is ", gguf_type_name(v.type),
             ", expected u32");
    const uint32_t a = io::load_le32(v.payload.data());
    RT_CHECK(a != 0 && std::has_single_bit(a), "GgufWriter::set: general.alignment is ", a,
             ", expected a power of two");
    alignment_ = a;
  }
  kv_.emplace_back(key, std::move(v));
}

void quantize_values(QuantType type, const float* x, int64_t n, std::vector<uint8_t>& out) {
  const QuantTraits& tr = quant_traits(type);
  RT_CHECK(n >= 0 && n % tr.block_elems == 0, "quantize ", tr.name, ": ", n,
           " values are not whole blocks of ", tr.block_elems);
  out.resize(size_t(n / tr.block_elems * tr.block_bytes));
  switch (type) {
    case QuantType::F32:
      for (int64_t i = 0; i < n; ++i) io::store_le32(&out[size_t(4 * i)], std::bit_cast<uint32_t>(x[i]));
      return;
    case QuantType::F16:
      for (int64_t i = 0; i < n; ++i) io::store_le16(&out[size_t(2 * i)], f32_to_f16(x[i]));
      return;
    case QuantType::BF16:
      for (int64_t i = 0; i < n; ++i) io::store_le16(&out[size_t(2 * i)], f32_to_bf16(x[i]));
      return;
    case QuantType::Q8_0:
      quantize_q8_0(x, n, out.data());
      return;
    default:
      RT_FAIL("quantize: retort writes F32, F16, BF16 and Q8_0, not ", tr.name);
  }
}

void GgufWriter::add_tensor(const std::string& name, QuantType type, const Shape& shape,
                            std::vector<float> values) {
  RT_CHECK(!name.empty() && name.size() <= kMaxTensorName, "GgufWriter::add_tensor: tensor name '", name,
           "' must have 1 to ", kMaxTensorName, " bytes");
  for (const TensorEntry& t : tensors_)
    RT_CHECK(t.name != name, "GgufWriter::add_tensor: tensor '", name, "' is added twice");
  RT_CHECK(
      type == QuantType::F32 || type == QuantType::F16 || type == QuantType::BF16 || type == QuantType::Q8_0,
      "GgufWriter::add_tensor: tensor '", name, "': retort writes F32, F16, BF16 and Q8_0, not ",
      quant_name(type));
  RT_CHECK(!shape.empty() && shape.size() <= size_t(kMaxDims), "GgufWriter::add_tensor: tensor '", name,
           "' has ", shape.size(), " dims, expected 1 to ", kMaxDims);
  int64_t n = 1;
  for (int64_t d : shape) {
    RT_CHECK(d > 0, "GgufWriter::add_tensor: tensor '", name, "' has a dim of ", d);
    n *= d;
  }
  RT_CHECK(int64_t(values.size()) == n, "GgufWriter::add_tensor: tensor '", name, "' has ", values.size(),
           " values for ", n, " elements");
  const int64_t block = quant_traits(type).block_elems;
  RT_CHECK(shape.back() % block == 0, "GgufWriter::add_tensor: tensor '", name, "': its innermost dim (",
           shape.back(), ") is not a multiple of the ", quant_name(type), " block size ", block);
  tensors_.push_back({name, type, shape, std::move(values)});
}

void GgufWriter::emit(const std::function<void(const uint8_t*, size_t)>& sink) const {
  const auto& kv = kv_;
  const auto& tensors = tensors_;
  const uint64_t alignment = alignment_;
  Bytes head = {'G', 'G', 'U', 'F'};
  io::append_le32(head, 3);
  io::append_le64(head, tensors.size());
  io::append_le64(head, kv.size());
  for (const auto& [key, v] : kv) {
    append_string(head, key);
    io::append_le32(head, uint32_t(v.type));
    io::append_bytes(head, v.payload.data(), v.payload.size());
  }
  auto pad = [&](uint64_t n) { return (alignment - n % alignment) % alignment; };
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  for (const auto& t : tensors) {
    append_string(head, t.name);
    io::append_le32(head, uint32_t(t.shape.size()));
    for (size_t d = t.shape.size(); d-- > 0;) io::append_le64(head, uint64_t(t.shape[d]));
    io::append_le32(head, uint32_t(t.type));
    io::append_le64(head, offset);
    const QuantTraits& tr = quant_traits(t.type);
    const uint64_t nbytes = uint64_t(t.values.size()) / uint64_t(tr.block_elems) * uint64_t(tr.block_bytes);
    sizes.push_back(nbytes);
    offset += nbytes + pad(nbytes);
  }
  head.resize(head.size() + pad(head.size()), 0);
  sink(head.data(), head.size());
  Bytes data;
  const uint8_t zeros[256] = {};
  for (size_t i = 0; i < tensors.size(); ++i) {
    quantize_values(tensors[i].type, tensors[i].values.data(), int64_t(tensors[i].values.size()), data);
    sink(data.data(), data.size());
    // The last tensor is padded too, as gguf-py writes it; readers take the data size from the infos.
    for (uint64_t p = pad(sizes[i]); p > 0;) {
      const size_t k = size_t(std::min<uint64_t>(p, sizeof zeros));
      sink(zeros, k);
      p -= k;
    }
  }
}

void GgufWriter::write(const std::string& path) const {
  io::write_file_atomic(path,
                        [&](io::FileWriter& w) { emit([&](const uint8_t* p, size_t n) { w.write(p, n); }); });
}

std::vector<uint8_t> GgufWriter::to_bytes() const {
  Bytes out;
  emit([&](const uint8_t* p, size_t n) { out.insert(out.end(), p, p + n); });
  return out;
}

}  // namespace retort
