// Reading GGUF, llama.cpp's model file, versions 2 and 3 (little-endian):
//   "GGUF", u32 version, u64 tensor count, u64 key/value count,
//   key/values: string key, u32 value type, value (strings are a u64 length and bytes; arrays a u32 element
//     type, a u64 count and the elements, which may be arrays themselves),
//   tensor infos: string name, u32 n_dims (1..4), u64 dims innermost first, u32 ggml type, u64 offset,
//   padding up to general.alignment (default 32), then the data section the offsets point into.
// GgufFile maps the file and validates every count, length, offset and size against the file's size before
// it drives an allocation or a read, so a malformed or hostile file is a retort::Error naming the file and
// the fault, never a crash or a huge allocation. Tensors are dequantized on request (src/core/quant.h).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../core/dtype.h"
#include "../core/quant.h"
#include "../core/tensor.h"
#include "file.h"

namespace retort {

// GGUF metadata value types, numbered as in the file.
enum class GgufType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
// "u32", "string", "array", ...
const char* gguf_type_name(GgufType t);

// One metadata value: a scalar, a string, or an array of one element type. Arrays of numbers and bools keep
// their elements as packed bytes, so a tokenizer's 150k scores cost 600 KB, not 150k objects.
class GgufValue {
 public:
  GgufType type() const { return type_; }
  bool is_integer() const;  // u8 .. i64
  bool is_float() const { return type_ == GgufType::F32 || type_ == GgufType::F64; }
  // "u32", "string", "array of f32", for messages.
  std::string describe() const;

  // Scalars. Each throws retort::Error when the value is of another kind or out of the result's range.
  int64_t as_int() const;    // any integer type, if the value fits int64
  uint64_t as_uint() const;  // any integer type, if the value is >= 0
  double as_float() const;   // f32, f64, or an integer (converted)
  bool as_bool() const;
  const std::string& as_string() const;

  // Arrays; each throws retort::Error unless this is an array (and the index and element kind fit).
  GgufType elem_type() const;
  size_t size() const;
  GgufValue scalar_at(size_t i) const;  // element i of an array of numbers or bools
  const std::string& string_at(size_t i) const;
  const GgufValue& array_at(size_t i) const;

 private:
  friend class GgufParser;
  friend class GgufFile;
  // The conversions behind as_*, with `who` ("GGUF value", "<path>: metadata key 'k'") opening the message.
  int64_t to_int(const std::string& who) const;
  uint64_t to_uint(const std::string& who) const;
  double to_float(const std::string& who) const;
  [[noreturn]] void wrong_kind(const std::string& who, const char* expected) const;

  GgufType type_ = GgufType::U8;
  GgufType elem_ = GgufType::U8;   // arrays: the element type
  uint64_t bits_ = 0;              // scalars: an integer as int64 or uint64, a float as a double's bits
  std::string str_;                // strings
  size_t count_ = 0;               // arrays: the element count
  std::vector<uint8_t> raw_;       // arrays of numbers and bools: the elements' little-endian bytes
  std::vector<std::string> strs_;  // arrays of strings
  std::vector<GgufValue> items_;   // arrays of arrays
};

class GgufFile {
 public:
  struct TensorInfo {
    std::string name;
    QuantType type = QuantType::F32;
    Shape shape;  // outermost first, as retort's Shape (the file stores innermost first)
    int64_t ne[kMaxDims] = {1, 1, 1, 1};  // ggml order: ne[0] innermost, unused dims 1
    int64_t nelements = 0;
    uint64_t offset = 0;  // from the start of the data section
    uint64_t nbytes = 0;
  };

  // Maps path and validates the whole file: magic, version (2 or 3), counts against the bytes left, every key
  // and value (known types, string lengths, nesting depth at most 8, no duplicate keys), general.alignment (a
  // power of two), every tensor info (a unique name, 1-4 dims whose product fits int64, a known type whose
  // block divides dim 0, an aligned offset) and the data: each tensor inside the file, none overlapping.
  // Throws retort::Error "<path>: <fault>", naming the key or tensor where there is one.
  explicit GgufFile(const std::string& path);
  // Parses an in-memory image (tests, fuzzing); `name` stands for the path in messages.
  GgufFile(std::vector<uint8_t> bytes, std::string name);

  uint32_t version() const { return version_; }
  const std::string& path() const { return path_; }
  uint64_t alignment() const { return alignment_; }
  // Where the data section starts, from the start of the file.
  uint64_t data_offset() const { return data_offset_; }

  // Every key/value, in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  // The value of key, or nullptr when absent.
  const GgufValue* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }

  // Typed getters. Each throws retort::Error "<path>: metadata key 'k' is missing" or "<path>: metadata key
  // 'k' is string, expected an integer" (and for values out of the result's range). Integers of any width
  // are accepted where an integer is asked for; get_float accepts integers too.
  uint64_t get_uint(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;
  std::vector<double> get_float_array(const std::string& key) const;
  // The same, returning `fallback` when the key is absent (a present key of the wrong type still throws).
  uint64_t get_uint(const std::string& key, uint64_t fallback) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;

  // Tensor infos in file order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // The tensor called name, or nullptr.
  const TensorInfo* find_tensor(const std::string& name) const;
  // The tensor called name; throws retort::Error naming the file when there is none.
  const TensorInfo& tensor(const std::string& name) const;
  // The tensor's raw bytes, a view into the file. Throws retort::Error when t does not describe a range of
  // this file's data (an info from another file).
  std::span<const uint8_t> tensor_bytes(const TensorInfo& t) const;

  // Decodes t into out (t.nelements values, outermost dim first as in t.shape). Throws retort::Error naming
  // the file, the tensor and its type when retort cannot decode the type.
  void dequantize(const TensorInfo& t, float* out) const;
  // The same into a buffer of dtype out_type (F32, BF16 or F16).
  void dequantize(const TensorInfo& t, DType out_type, void* out) const;
  std::vector<float> dequantize(const TensorInfo& t) const;

 private:
  friend class GgufParser;
  // The value of key; throws "<path>: metadata key 'k' is missing".
  const GgufValue& need(const std::string& key) const;
  std::string who(const std::string& key) const { return path_ + ": metadata key '" + key + "'"; }

  io::MappedFile map_;
  std::vector<uint8_t> owned_;  // the in-memory image, when there is no map
  std::span<const uint8_t> bytes_;
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace retort
