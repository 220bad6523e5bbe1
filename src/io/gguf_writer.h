// Writing GGUF version 3, the layout gguf.h reads: header, key/values in the order they were set, tensor
// infos (dims innermost first), padding to general.alignment (32 unless set), then each tensor's data at an
// aligned offset. Tensors are given as f32 values and encoded on write as F32, F16, BF16 (round to nearest
// even) or Q8_0 (ggml's reference quantizer: per block of 32, d = max|x| / 127 stored as f16, q = round(x/d)
// half away from zero). The file is written atomically (io::AtomicFile): a failure leaves no partial file.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "../core/quant.h"
#include "../core/tensor.h"
#include "gguf.h"

namespace retort {

class GgufWriter {
 public:
  // One metadata value in its file encoding: the type id and the bytes after it.
  struct Value {
    GgufType type = GgufType::U8;
    std::vector<uint8_t> payload;
  };
  static Value u8(uint8_t v);
  static Value i8(int8_t v);
  static Value u16(uint16_t v);
  static Value i16(int16_t v);
  static Value u32(uint32_t v);
  static Value i32(int32_t v);
  static Value f32(float v);
  static Value boolean(bool v);
  static Value string(const std::string& v);
  static Value u64(uint64_t v);
  static Value i64(int64_t v);
  static Value f64(double v);
  // Arrays of one element type. array() takes elements made by the functions above (all of one type, which
  // may itself be Array); an empty array needs its element type named.
  static Value array(const std::vector<Value>& items, GgufType empty_elem = GgufType::U8);
  static Value strings(const std::vector<std::string>& v);
  static Value i32s(const std::vector<int32_t>& v);
  static Value f32s(const std::vector<float>& v);

  // Sets key (non-empty, set once: a second set throws retort::Error naming the key). general.alignment must
  // be a u32 power of two (it sets the layout's alignment).
  void set(const std::string& key, Value v);
  bool has(const std::string& key) const;

  // Adds a tensor of values (shape outermost first, values in that row-major order) to be stored as type:
  // F32, F16, BF16 or Q8_0 (whose innermost dim must be a multiple of 32). Throws retort::Error naming the
  // tensor for an empty, over-long (ggml allows 63 bytes) or repeated name, 0 or more than 4 dims, a value
  // count that does not match the shape, or a type it cannot encode.
  void add_tensor(const std::string& name, QuantType type, const Shape& shape, std::vector<float> values);

  // Writes the file atomically. Throws retort::Error naming path on an I/O failure (nothing is left there).
  void write(const std::string& path) const;
  // The bytes write() puts in the file.
  std::vector<uint8_t> to_bytes() const;

 private:
  struct TensorEntry {
    std::string name;
    QuantType type;
    Shape shape;
    std::vector<float> values;
  };
  // Produces the file's bytes in order through sink, encoding one tensor at a time.
  void emit(const std::function<void(const uint8_t*, size_t)>& sink) const;

  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<TensorEntry> tensors_;
  uint64_t alignment_ = 32;
};

// Encodes n f32 values (n a multiple of the block size) as type F32, F16, BF16 or Q8_0 into out (resized).
// Throws retort::Error for another type or a partial block.
void quantize_values(QuantType type, const float* values, int64_t n, std::vector<uint8_t>& out);

}  // namespace retort
