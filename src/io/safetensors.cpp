#include "safetensors.h"

#include <algorithm>
#include <set>

#include "../core/context.h"
#include "../core/error.h"
#include "json.h"

namespace retort {

namespace {

// The safetensors libraries refuse headers above 100 MB; so do we, before allocating or parsing anything.
constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;

const char* st_dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::BF16:
      return "BF16";
    case DType::F16:
      return "F16";
    case DType::I32:
      return "I32";
    case DType::I64:
      return "I64";
  }
  return "?";
}

bool st_dtype_from(const std::string& s, DType& out) {
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64}) {
    if (s == st_dtype_name(t)) {
      out = t;
      return true;
    }
  }
  return false;
}

std::string shape_text(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::set<std::string> seen;
  std::vector<std::vector<uint8_t>> blobs;
  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) json += ",";
      first = false;
      io::append_json_string(json, k);
      json += ":";
      io::append_json_string(json, v);
    }
    json += "}";
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    RT_CHECK(!name.empty(), path, ": save_safetensors: a tensor has an empty name");
    RT_CHECK(name != "__metadata__", path,
             ": save_safetensors: \"__metadata__\" is reserved, not a tensor name");
    RT_CHECK(seen.insert(name).second, path, ": save_safetensors: tensor name \"", name, "\" is given twice");
    RT_CHECK(t != nullptr, path, ": save_safetensors: tensor \"", name, "\" is null");
    blobs.push_back(get_bytes(t));
    if (json.size() > 1) json += ",";
    io::append_json_string(json, name);
    json += ":{\"dtype\":\"";
    json += st_dtype_name(t->dtype);
    json += "\",\"shape\":[";
    Shape shape = t->shape();
    for (size_t i = 0; i < shape.size(); ++i) {
      if (i) json += ',';
      json += std::to_string(shape[i]);
    }
    json += "],\"data_offsets\":[";
    json += std::to_string(offset);
    json += ',';
    json += std::to_string(offset + blobs.back().size());
    json += "]}";
    offset += blobs.back().size();
  }
  json += "}";
  // Pad with spaces so the data section starts 8-byte aligned, as the format recommends.
  while ((8 + json.size()) % 8 != 0) json += ' ';
  io::write_file_atomic(path, [&](io::FileWriter& w) {
    uint8_t len[8];
    io::store_le64(len, json.size());
    w.write(len, 8);
    w.write(json.data(), json.size());
    for (const auto& b : blobs) w.write(b);
  });
}

SafeTensors::SafeTensors(const std::string& path) : map_(path) {
  io::ByteReader r(map_.bytes(), path);
  const uint64_t header_len = r.u64("header length");
  if (header_len > r.remaining())
    r.fail("header length ", header_len, " exceeds the ", r.remaining(),
           " bytes after it (truncated file, or not a safetensors file)");
  if (header_len > kMaxHeaderBytes) r.fail("header length ", header_len, " is absurd (more than 100 MB)");
  if (header_len < 2) r.fail("header length ", header_len, " is too small for a JSON object");
  std::span<const uint8_t> hb = r.bytes(size_t(header_len), "header");
  io::Json h = io::parse_json(std::string_view(reinterpret_cast<const char*>(hb.data()), hb.size()), path);
  if (!h.is(io::Json::Kind::Object))
    r.fail("the header is a JSON ", io::json_kind_name(h.kind), ", expected an object");
  data_ = map_.data() + 8 + header_len;
  const uint64_t data_len = r.remaining();

  for (size_t i = 0; i < h.keys.size(); ++i) {
    const std::string& name = h.keys[i];
    const io::Json& v = h.items[i];
    if (name == "__metadata__") {
      if (!v.is(io::Json::Kind::Object))
        r.fail("__metadata__ is a JSON ", io::json_kind_name(v.kind), ", expected an object");
      for (size_t j = 0; j < v.keys.size(); ++j) {
        if (!v.items[j].is(io::Json::Kind::String))
          r.fail("__metadata__ value of \"", v.keys[j], "\" is a JSON ", io::json_kind_name(v.items[j].kind),
                 ", expected a string");
        metadata_[v.keys[j]] = v.items[j].string;
      }
      continue;
    }
    const std::string where = "tensor \"" + name + "\"";
    if (!v.is(io::Json::Kind::Object))
      r.fail(where, " is a JSON ", io::json_kind_name(v.kind), ", expected an object");
    for (const std::string& k : v.keys)
      if (k != "dtype" && k != "shape" && k != "data_offsets")
        r.fail(where, " has an unknown field \"", k, "\"");
    const io::Json* dt = v.find("dtype");
    const io::Json* sh = v.find("shape");
    const io::Json* off = v.find("data_offsets");
    if (dt == nullptr || sh == nullptr || off == nullptr)
      r.fail(where, " needs dtype, shape and data_offsets");
    Entry e;
    e.name = name;
    if (!dt->is(io::Json::Kind::String)) r.fail(where, ": dtype is not a string");
    if (!st_dtype_from(dt->string, e.dtype))
      r.fail(where, ": dtype \"", dt->string, "\" is not supported (retort reads F32, BF16, F16, I32, I64)");
    if (!sh->is(io::Json::Kind::Array) || sh->items.size() > 64)
      r.fail(where, ": shape is not an array of sizes");
    uint64_t elements = 1;
    bool overflow = false, empty = false;  // a zero anywhere makes the product 0 whatever the others are
    for (const io::Json& d : sh->items) {
      if (!d.is(io::Json::Kind::Int) || d.integer < 0)
        r.fail(where, ": shape holds a value that is not a size >= 0");
      e.shape.push_back(d.integer);
      if (d.integer == 0)
        empty = true;
      else if (elements > (uint64_t(1) << 56) / uint64_t(d.integer))
        overflow = true;
      else
        elements *= uint64_t(d.integer);
    }
    if (empty) {
      elements = 0;
      overflow = false;
    }
    if (overflow) r.fail(where, ": shape ", shape_text(e.shape), " has absurdly many elements");
    if (!off->is(io::Json::Kind::Array) || off->items.size() != 2 || !off->items[0].is(io::Json::Kind::Int) ||
        !off->items[1].is(io::Json::Kind::Int) || off->items[0].integer < 0 ||
        off->items[1].integer < off->items[0].integer)
      r.fail(where, ": data_offsets must be [begin, end] with 0 <= begin <= end");
    e.begin = uint64_t(off->items[0].integer);
    const uint64_t end = uint64_t(off->items[1].integer);
    e.nbytes = end - e.begin;
    if (end > data_len)
      r.fail(where, ": data_offsets [", e.begin, ", ", end, "] run past the ", data_len,
             " bytes of data (truncated?)");
    if (e.nbytes != elements * dtype_size(e.dtype))
      r.fail(where, ": shape ", shape_text(e.shape), " of ", dt->string, " needs ",
             elements * dtype_size(e.dtype), " bytes, but data_offsets span ", e.nbytes);
    entries_.push_back(std::move(e));
  }
  std::stable_sort(entries_.begin(), entries_.end(),
                   [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  uint64_t at = 0;
  for (const Entry& e : entries_) {
    if (e.begin < at)
      r.fail("tensor \"", e.name, "\" overlaps the tensor before it (its data starts at ", e.begin,
             ", the previous one ends at ", at, ")");
    if (e.begin > at) r.fail("bytes [", at, ", ", e.begin, ") of the data belong to no tensor (a hole)");
    at = e.begin + e.nbytes;
  }
  if (at != data_len)
    r.fail("size mismatch: the tensors end at byte ", at, " of the data, but the file holds ", data_len,
           " bytes of data");
  for (size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].name] = i;
}

std::vector<std::string> SafeTensors::names() const {
  std::vector<std::string> out;
  for (const Entry& e : entries_) out.push_back(e.name);
  return out;
}

const SafeTensors::Entry& SafeTensors::entry(const std::string& name) const {
  auto it = index_.find(name);
  RT_CHECK(it != index_.end(), path(), ": no tensor named \"", name, "\"");
  return entries_[it->second];
}

std::span<const uint8_t> SafeTensors::bytes(const std::string& name) const {
  const Entry& e = entry(name);
  return {data_ + e.begin, size_t(e.nbytes)};
}

void SafeTensors::load_into(Tensor* t, const std::string& name) const {
  const Entry& e = entry(name);
  RT_CHECK(t != nullptr, path(), ": load_into(\"", name, "\"): the tensor is null");
  RT_CHECK(e.dtype == t->dtype, path(), ": tensor \"", name, "\" is ", dtype_name(e.dtype),
           " in the file, but ", t->describe(), " is ", dtype_name(t->dtype));
  // Compare in ggml order, where leading (outer) 1s vanish: a file's [1, 5] fits a [5] tensor and back.
  bool same = e.shape.size() <= size_t(kMaxDims);
  if (same) {
    int64_t ne[kMaxDims] = {1, 1, 1, 1};
    for (size_t i = 0; i < e.shape.size(); ++i) ne[i] = e.shape[e.shape.size() - 1 - i];
    for (int d = 0; d < kMaxDims; ++d) same = same && ne[d] == t->ne[d];
  }
  RT_CHECK(same, path(), ": tensor \"", name, "\" has shape ", shape_text(e.shape), " in the file, but ",
           t->describe(), " has shape ", shape_str(t->ne));
  std::span<const uint8_t> b = bytes(name);
  set_bytes(t, b.data(), b.size());
}

}  // namespace retort
