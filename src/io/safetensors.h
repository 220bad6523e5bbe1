// Checkpoints in the safetensors format: u64 little-endian header length N, N bytes of JSON
//   {"__metadata__": {"key": "value", ...}, "name": {"dtype": "F32", "shape": [rows, cols],
//    "data_offsets": [begin, end]}, ...}
// (padded with spaces to a multiple of 8), then the tensors' raw little-endian bytes, offsets relative to the
// end of the header. Files interoperate with the safetensors libraries for the dtypes retort has (F32, BF16,
// F16, I32, I64). Writing is atomic; reading maps the file and validates the header before trusting a byte.
#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../core/dtype.h"
#include "../core/tensor.h"
#include "file.h"

namespace retort {

// Writes tensors (in the order given; shapes outermost first as Tensor::shape() reports them) and string
// metadata to path atomically. Throws retort::Error on an empty, repeated or reserved ("__metadata__") name,
// a null tensor, or an I/O fault naming path.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

class SafeTensors {
 public:
  struct Entry {
    std::string name;
    DType dtype = DType::F32;
    Shape shape;         // outermost first; may be empty (a scalar) or hold zeros
    uint64_t begin = 0;  // byte range within the data section
    uint64_t nbytes = 0;
  };

  // Maps path and validates it: the header length fits the file, the header is a JSON object of entries with
  // a known dtype, a shape of non-negative integers and data_offsets [begin, end] whose span equals
  // elements × dtype size, inside the data, without overlap or holes; __metadata__ maps strings to strings.
  // Throws retort::Error naming the file (and the tensor) and the fault.
  explicit SafeTensors(const std::string& path);

  const std::string& path() const { return map_.path(); }
  // Tensor names, in the order of their data in the file.
  std::vector<std::string> names() const;
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  // The entry of a tensor; throws retort::Error naming the file when there is no such tensor.
  const Entry& entry(const std::string& name) const;
  DType dtype(const std::string& name) const { return entry(name).dtype; }
  const Shape& shape(const std::string& name) const { return entry(name).shape; }
  // The tensor's raw bytes (little-endian, row-major), a view into the map.
  std::span<const uint8_t> bytes(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Copies the tensor `name` into t, which must have the same dtype and shape (leading 1s aside: [1, 5] and
  // [5] are the same). Throws retort::Error naming the file, the tensor, and both shapes/dtypes otherwise.
  void load_into(Tensor* t, const std::string& name) const;

 private:
  io::MappedFile map_;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::vector<Entry> entries_;     // sorted by begin
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// SafeTensors(path).
inline SafeTensors load_safetensors(const std::string& path) {
  return SafeTensors(path);
}

}  // namespace retort
