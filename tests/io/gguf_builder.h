// A GGUF writer for tests and fuzz seeds: crafts valid files and, through its knobs (header counts, raw type
// ids, explicit offsets, any dims), every kind of broken one. Test-only code: the product only reads GGUF.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace retort::test {

class GgufBuilder {
 public:
  using Bytes = std::vector<uint8_t>;
  // GGUF value type ids.
  enum : uint32_t { U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 };

  uint32_t version = 3;
  uint64_t alignment = 32;  // the layout's alignment; add general.alignment with kv_u32 to declare another
  std::optional<uint64_t> tensor_count, kv_count;  // what the header claims, when not the true counts
  std::optional<uint64_t> data_bytes;  // the data section's size, when not up to the end of the last tensor

  // ---- value payloads (the bytes after the type id) ----
  template <typename T>
  static Bytes scalar(T v) {
    Bytes b(sizeof(T));
    std::memcpy(b.data(), &v, sizeof(T));  // the test hosts are little-endian, like the format
    return b;
  }
  static Bytes str(const std::string& s) {
    Bytes b = scalar<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return b;
  }
  // An array payload: element type, count, then the elements' payloads back to back.
  static Bytes array(uint32_t elem_type, uint64_t count, const Bytes& elems) {
    Bytes b = scalar<uint32_t>(elem_type);
    append(b, scalar<uint64_t>(count));
    append(b, elems);
    return b;
  }
  template <typename T>
  static Bytes array_of(uint32_t elem_type, const std::vector<T>& v) {
    Bytes e;
    for (const T& x : v) append(e, scalar<T>(x));
    return array(elem_type, v.size(), e);
  }
  static Bytes string_array(const std::vector<std::string>& v) {
    Bytes e;
    for (const std::string& s : v) append(e, str(s));
    return array(STRING, v.size(), e);
  }
  static void append(Bytes& out, const Bytes& b) { out.insert(out.end(), b.begin(), b.end()); }

  // ---- key/values ----
  GgufBuilder& kv(const std::string& key, uint32_t type, const Bytes& payload) {
    append(kvs_, str(key));
    append(kvs_, scalar<uint32_t>(type));
    append(kvs_, payload);
    ++n_kv_;
    return *this;
  }
  GgufBuilder& kv_u32(const std::string& key, uint32_t v) { return kv(key, U32, scalar(v)); }
  GgufBuilder& kv_str(const std::string& key, const std::string& v) { return kv(key, STRING, str(v)); }

  // ---- tensors: dims innermost first, as the file stores them; data is the raw bytes ----
  GgufBuilder& tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type, Bytes data,
                      std::optional<uint64_t> offset = std::nullopt) {
    tensors_.push_back({name, std::move(dims), type, std::move(data), offset});
    return *this;
  }

  // The file: header, key/values, tensor infos, padding, data. Tensors without an explicit offset are laid
  // out in order at aligned offsets; the file ends with the last byte of tensor data.
  Bytes build() const {
    Bytes b = {'G', 'G', 'U', 'F'};
    append(b, scalar<uint32_t>(version));
    append(b, scalar<uint64_t>(tensor_count.value_or(tensors_.size())));
    append(b, scalar<uint64_t>(kv_count.value_or(n_kv_)));
    append(b, kvs_);
    std::vector<uint64_t> offsets;
    uint64_t at = 0, end = 0;
    for (const T& t : tensors_) {
      at = (at + alignment - 1) / alignment * alignment;
      offsets.push_back(t.offset.value_or(at));
      if (!t.offset) at += t.data.size();
      if (!data_bytes) end = std::max<uint64_t>(end, offsets.back() + t.data.size());
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const T& t = tensors_[i];
      append(b, str(t.name));
      append(b, scalar<uint32_t>(uint32_t(t.dims.size())));
      for (uint64_t d : t.dims) append(b, scalar<uint64_t>(d));
      append(b, scalar<uint32_t>(t.type));
      append(b, scalar<uint64_t>(offsets[i]));
    }
    if (tensors_.empty()) return b;
    b.resize((b.size() + alignment - 1) / alignment * alignment, 0);
    const size_t data_start = b.size();
    const uint64_t size = data_bytes.value_or(end);
    b.resize(data_start + size, 0);
    for (size_t i = 0; i < tensors_.size(); ++i)
      for (size_t j = 0; j < tensors_[i].data.size() && offsets[i] + j < size; ++j)
        b[data_start + offsets[i] + j] = tensors_[i].data[j];
    return b;
  }

 private:
  struct T {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    Bytes data;
    std::optional<uint64_t> offset;
  };
  Bytes kvs_;
  uint64_t n_kv_ = 0;
  std::vector<T> tensors_;
};

}  // namespace retort::test
