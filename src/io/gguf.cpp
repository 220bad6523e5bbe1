#include "gguf.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include "../core/error.h"

namespace retort {

namespace {

// Arrays of arrays deeper than this are refused: no model needs them, and the parser recurses per level.
constexpr int kMaxDepth = 8;
// The smallest key/value (u64 key length, u32 type, a one-byte value) and the smallest tensor info (u64 name
// length, u32 n_dims, one u64 dim, u32 type, u64 offset): what bounds the counts before anything is reserved.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;
// Reservations stop here; beyond it containers grow as entries are actually read, so memory follows the bytes
// parsed rather than a count that merely fits the file (each entry becomes a much larger object).
constexpr uint64_t kMaxReserve = 4096;
constexpr uint64_t kInt64Max = uint64_t(std::numeric_limits<int64_t>::max());

bool is_signed_type(GgufType t) {
  return t == GgufType::I8 || t == GgufType::I16 || t == GgufType::I32 || t == GgufType::I64;
}

// Bytes of one scalar of type t in the file; 0 for strings and arrays.
size_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::Bool:
      return 1;
    case GgufType::U16:
    case GgufType::I16:
      return 2;
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::F32:
      return 4;
    case GgufType::U64:
    case GgufType::I64:
    case GgufType::F64:
      return 8;
    default:
      return 0;
  }
}

bool is_integer_type(GgufType t) {
  return scalar_size(t) != 0 && t != GgufType::Bool && t != GgufType::F32 && t != GgufType::F64;
}

// The fewest bytes a value of type t occupies in the file (a string's length, an array's type and count).
uint64_t min_value_bytes(GgufType t) {
  if (t == GgufType::String) return 8;
  if (t == GgufType::Array) return 12;
  return scalar_size(t);
}

// A scalar's file bytes as GgufValue keeps them: integers sign- or zero-extended, floats as a double's bits.
uint64_t decode_scalar(GgufType t, const uint8_t* p) {
  switch (t) {
    case GgufType::U8:
    case GgufType::Bool:
      return p[0];
    case GgufType::I8:
      return uint64_t(int64_t(int8_t(p[0])));
    case GgufType::U16:
      return io::load_le16(p);
    case GgufType::I16:
      return uint64_t(int64_t(int16_t(io::load_le16(p))));
    case GgufType::U32:
      return io::load_le32(p);
    case GgufType::I32:
      return uint64_t(int64_t(int32_t(io::load_le32(p))));
    case GgufType::U64:
    case GgufType::I64:
    case GgufType::F64:
      return io::load_le64(p);
    case GgufType::F32:
      return std::bit_cast<uint64_t>(double(std::bit_cast<float>(io::load_le32(p))));
    default:
      return 0;
  }
}

// Bytes of n elements of a type, or false when n is not a whole number of blocks or the size overflows.
bool tensor_nbytes(const QuantTraits& tr, int64_t n, uint64_t& out) {
  if (n < 0 || n % tr.block_elems != 0) return false;
  return !__builtin_mul_overflow(uint64_t(n / tr.block_elems), uint64_t(tr.block_bytes), &out);
}

std::string dims_text(const std::vector<uint64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

}  // namespace

const char* gguf_type_name(GgufType t) {
  static const char* const kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                       "bool", "string", "array", "u64", "i64", "f64"};
  return uint32_t(t) < 13 ? kNames[uint32_t(t)] : "unknown";
}

// ---- GgufValue ------------------------------------------------------------------------------------------

bool GgufValue::is_integer() const {
  return is_integer_type(type_);
}

std::string GgufValue::describe() const {
  if (type_ != GgufType::Array) return gguf_type_name(type_);
  return std::string("array of ") + gguf_type_name(elem_);
}

void GgufValue::wrong_kind(const std::string& who, const char* expected) const {
  RT_FAIL(who, " is ", describe(), ", expected ", expected);
}

int64_t GgufValue::to_int(const std::string& who) const {
  if (!is_integer()) wrong_kind(who, "an integer");
  if (!is_signed_type(type_) && bits_ > kInt64Max) RT_FAIL(who, " is ", bits_, ", more than int64 holds");
  return int64_t(bits_);
}

uint64_t GgufValue::to_uint(const std::string& who) const {
  if (!is_integer()) wrong_kind(who, "an unsigned integer");
  if (is_signed_type(type_) && int64_t(bits_) < 0) RT_FAIL(who, " is ", int64_t(bits_), ", expected >= 0");
  return bits_;
}

double GgufValue::to_float(const std::string& who) const {
  if (is_float()) return std::bit_cast<double>(bits_);
  if (!is_integer()) wrong_kind(who, "a number");
  return is_signed_type(type_) ? double(int64_t(bits_)) : double(bits_);
}

int64_t GgufValue::as_int() const {
  return to_int("GGUF value");
}
uint64_t GgufValue::as_uint() const {
  return to_uint("GGUF value");
}
double GgufValue::as_float() const {
  return to_float("GGUF value");
}

bool GgufValue::as_bool() const {
  if (type_ != GgufType::Bool) wrong_kind("GGUF value", "a bool");
  return bits_ != 0;
}

const std::string& GgufValue::as_string() const {
  if (type_ != GgufType::String) wrong_kind("GGUF value", "a string");
  return str_;
}

GgufType GgufValue::elem_type() const {
  if (type_ != GgufType::Array) wrong_kind("GGUF value", "an array");
  return elem_;
}

size_t GgufValue::size() const {
  elem_type();
  return count_;
}

GgufValue GgufValue::scalar_at(size_t i) const {
  const size_t width = scalar_size(elem_type());
  RT_CHECK(width != 0, "GGUF value is ", describe(), ", expected an array of numbers or bools");
  RT_CHECK(i < count_, "GGUF array index ", i, " is out of range for ", count_, " elements");
  GgufValue v;
  v.type_ = elem_;
  v.bits_ = decode_scalar(elem_, raw_.data() + i * width);
  return v;
}

const std::string& GgufValue::string_at(size_t i) const {
  if (elem_type() != GgufType::String) wrong_kind("GGUF value", "an array of strings");
  RT_CHECK(i < count_, "GGUF array index ", i, " is out of range for ", count_, " elements");
  return strs_[i];
}

const GgufValue& GgufValue::array_at(size_t i) const {
  if (elem_type() != GgufType::Array) wrong_kind("GGUF value", "an array of arrays");
  RT_CHECK(i < count_, "GGUF array index ", i, " is out of range for ", count_, " elements");
  return items_[i];
}

// ---- parsing --------------------------------------------------------------------------------------------

// Reads a GgufFile's bytes front to back, filling it in; every fault throws through ByteReader::fail.
class GgufParser {
 public:
  explicit GgufParser(GgufFile& f) : f_(f), r_(f.bytes_, f.path_) {}

  void run() {
    r_.expect_magic("GGUF", "GGUF");
    read_version();
    const uint64_t n_tensors = r_.u64("tensor count");
    const uint64_t n_kv = r_.u64("metadata key/value count");
    // Each entry needs some bytes, so a count the rest of the file cannot hold is a lie, caught before any
    // reservation: 2^62 keys would otherwise ask for exabytes.
    if (n_kv > r_.remaining() / kMinKvBytes)
      r_.fail("metadata key/value count ", n_kv, " cannot fit in the ", r_.remaining(), " bytes left");
    if (n_tensors > (r_.remaining() - n_kv * kMinKvBytes) / kMinTensorInfoBytes)
      r_.fail("tensor count ", n_tensors, " cannot fit in the ", r_.remaining(),
              " bytes left after the metadata");
    read_metadata(n_kv);
    read_alignment();
    read_tensor_infos(n_tensors);
    check_data();
  }

 private:
  void read_version() {
    const uint32_t v = r_.u32("version");
    if (v == 2 || v == 3) {
      f_.version_ = v;
      return;
    }
    if (v == 1) r_.fail("GGUF version 1 is not supported (retort reads versions 2 and 3)");
    if ((v & 0xffffu) == 0)
      r_.fail("GGUF version ", v, " looks byte-swapped: big-endian GGUF files are not supported");
    r_.fail("unsupported GGUF version ", v, " (retort reads versions 2 and 3)");
  }

  std::string read_string(const std::string& what) {
    const uint64_t len = r_.u64(what.c_str());
    if (len > r_.remaining())
      r_.fail(what, ": string length ", len, " at offset ", r_.offset() - 8,
              " runs past the end of the file (", r_.remaining(), " bytes left)");
    std::span<const uint8_t> b = r_.bytes(size_t(len), what.c_str());
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }

  GgufType read_type(const std::string& what) {
    const uint32_t t = r_.u32(what.c_str());
    if (t > uint32_t(GgufType::F64)) r_.fail(what, ": unknown value type ", t);
    return GgufType(t);
  }

  // One value of type t for `what` ("metadata key 'k'"); depth counts the arrays around it.
  GgufValue read_value(GgufType t, int depth, const std::string& what) {
    GgufValue v;
    v.type_ = t;
    if (t == GgufType::String) {
      v.str_ = read_string(what);
    } else if (t == GgufType::Array) {
      read_array(v, depth + 1, what);
    } else {
      v.bits_ = decode_scalar(t, r_.bytes(scalar_size(t), what.c_str()).data());
      if (t == GgufType::Bool && v.bits_ > 1) r_.fail(what, ": bool value ", v.bits_, " is neither 0 nor 1");
    }
    return v;
  }

  void read_array(GgufValue& v, int depth, const std::string& what) {
    if (depth > kMaxDepth) r_.fail(what, ": arrays nested more than ", kMaxDepth, " deep");
    v.elem_ = read_type(what + " array element type");
    const uint64_t count = r_.u64((what + " array count").c_str());
    const uint64_t min_bytes = min_value_bytes(v.elem_);
    if (count > r_.remaining() / min_bytes)
      r_.fail(what, ": array of ", count, " ", gguf_type_name(v.elem_), " elements cannot fit in the ",
              r_.remaining(), " bytes left");
    v.count_ = size_t(count);
    if (v.elem_ == GgufType::String) {
      v.strs_.reserve(std::min<uint64_t>(count, kMaxReserve));
      for (size_t i = 0; i < v.count_; ++i) v.strs_.push_back(read_string(what));
    } else if (v.elem_ == GgufType::Array) {
      v.items_.reserve(std::min<uint64_t>(count, kMaxReserve));
      for (size_t i = 0; i < v.count_; ++i) v.items_.push_back(read_value(GgufType::Array, depth, what));
    } else {
      std::span<const uint8_t> b = r_.bytes(size_t(count * min_bytes), what.c_str());
      if (v.elem_ == GgufType::Bool)
        for (size_t i = 0; i < b.size(); ++i)
          if (b[i] > 1) r_.fail(what, ": bool element ", i, " is ", int(b[i]), ", neither 0 nor 1");
      v.raw_.assign(b.begin(), b.end());
    }
  }

  void read_metadata(uint64_t n) {
    f_.kv_.reserve(std::min<uint64_t>(n, kMaxReserve));
    for (uint64_t i = 0; i < n; ++i) {
      std::string key = read_string("key of metadata entry " + std::to_string(i));
      const std::string what = "metadata key '" + key + "'";
      if (f_.kv_index_.count(key)) r_.fail("duplicate metadata key '", key, "'");
      GgufValue v = read_value(read_type(what + " type"), 0, what);
      f_.kv_index_.emplace(key, f_.kv_.size());
      f_.kv_.emplace_back(std::move(key), std::move(v));
    }
  }

  void read_alignment() {
    const GgufValue* a = f_.find("general.alignment");
    if (a == nullptr) return;
    const uint64_t align = a->to_uint(f_.who("general.alignment"));
    if (align == 0 || !std::has_single_bit(align))
      r_.fail("metadata key 'general.alignment' is ", align, ", expected a power of two");
    f_.alignment_ = align;
  }

  void read_tensor_infos(uint64_t n) {
    f_.tensors_.reserve(std::min<uint64_t>(n, kMaxReserve));
    for (uint64_t i = 0; i < n; ++i) {
      GgufFile::TensorInfo t;
      t.name = read_string("name of tensor " + std::to_string(i));
      const std::string what = "tensor '" + t.name + "'";
      if (f_.tensor_index_.count(t.name)) r_.fail("duplicate tensor name '", t.name, "'");
      read_shape(t, what);
      const uint32_t type = r_.u32((what + " type").c_str());
      const QuantTraits* tr = find_quant_traits(type);
      if (tr == nullptr) r_.fail(what, " has unknown ggml type ", type);
      t.type = QuantType(type);
      if (t.ne[0] % tr->block_elems != 0)
        r_.fail(what, ": dim 0 (", t.ne[0], ") is not a multiple of the ", tr->name, " block size ",
                tr->block_elems);
      if (!tensor_nbytes(*tr, t.nelements, t.nbytes))
        r_.fail(what, ": ", t.nelements, " elements of ", tr->name, " overflow a 64-bit byte count");
      t.offset = r_.u64((what + " offset").c_str());
      if (t.offset % f_.alignment_ != 0)
        r_.fail(what, ": data offset ", t.offset, " is not a multiple of the alignment ", f_.alignment_);
      f_.tensor_index_.emplace(t.name, f_.tensors_.size());
      f_.tensors_.push_back(std::move(t));
    }
  }

  void read_shape(GgufFile::TensorInfo& t, const std::string& what) {
    const uint32_t n_dims = r_.u32((what + " n_dims").c_str());
    if (n_dims < 1 || n_dims > uint32_t(kMaxDims))
      r_.fail(what, ": n_dims is ", n_dims, ", expected 1 to ", kMaxDims);
    std::vector<uint64_t> dims(n_dims);
    for (uint64_t& d : dims) d = r_.u64((what + " dims").c_str());
    uint64_t n = 1;
    bool zero = false;  // a zero dim makes the product 0 whatever the others are
    for (uint32_t d = 0; d < n_dims; ++d) {
      if (dims[d] > kInt64Max) r_.fail(what, ": dims ", dims_text(dims), " hold a size above int64's range");
      zero = zero || dims[d] == 0;
      if (!zero && (__builtin_mul_overflow(n, dims[d], &n) || n > kInt64Max))
        r_.fail(what, ": dims ", dims_text(dims), " have more elements than int64 holds");
      t.ne[d] = int64_t(dims[d]);
      t.shape.insert(t.shape.begin(), int64_t(dims[d]));
    }
    t.nelements = zero ? 0 : int64_t(n);
  }

  // The data section starts at the next multiple of the alignment; every tensor must lie inside the file,
  // and no two may share a byte.
  void check_data() {
    const uint64_t pos = r_.offset(), align = f_.alignment_;
    const uint64_t pad = (align - pos % align) % align;
    const uint64_t size = r_.size();
    if (__builtin_add_overflow(pos, pad, &f_.data_offset_)) r_.fail("the data section's offset overflows");
    const uint64_t data_size = f_.data_offset_ <= size ? size - f_.data_offset_ : 0;
    std::vector<const GgufFile::TensorInfo*> order;
    for (const GgufFile::TensorInfo& t : f_.tensors_) {
      if (t.offset > data_size || t.nbytes > data_size - t.offset)
        r_.fail("tensor '", t.name, "': its ", t.nbytes, " bytes at data offset ", t.offset, " (file offset ",
                f_.data_offset_, " + ", t.offset, ") run past the end of the ", size, "-byte file");
      if (t.nbytes > 0) order.push_back(&t);
    }
    std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < order.size(); ++i) {
      const GgufFile::TensorInfo &a = *order[i - 1], &b = *order[i];
      if (b.offset < a.offset + a.nbytes)
        r_.fail("tensor '", b.name, "' (data bytes [", b.offset, ", ", b.offset + b.nbytes,
                ")) overlaps tensor '", a.name, "' ([", a.offset, ", ", a.offset + a.nbytes, "))");
    }
  }

  GgufFile& f_;
  io::ByteReader r_;
};

// ---- GgufFile -------------------------------------------------------------------------------------------

GgufFile::GgufFile(const std::string& path) : map_(path), bytes_(map_.bytes()), path_(path) {
  GgufParser(*this).run();
}

GgufFile::GgufFile(std::vector<uint8_t> bytes, std::string name)
    : owned_(std::move(bytes)), bytes_(owned_), path_(std::move(name)) {
  GgufParser(*this).run();
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufValue& GgufFile::need(const std::string& key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) io::file_error(path_, "metadata key '" + key + "' is missing");
  return *v;
}

uint64_t GgufFile::get_uint(const std::string& key) const {
  return need(key).to_uint(who(key));
}
int64_t GgufFile::get_int(const std::string& key) const {
  return need(key).to_int(who(key));
}
double GgufFile::get_float(const std::string& key) const {
  return need(key).to_float(who(key));
}

bool GgufFile::get_bool(const std::string& key) const {
  const GgufValue& v = need(key);
  if (v.type() != GgufType::Bool) v.wrong_kind(who(key), "a bool");
  return v.bits_ != 0;
}

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = need(key);
  if (v.type() != GgufType::String) v.wrong_kind(who(key), "a string");
  return v.str_;
}

std::vector<std::string> GgufFile::get_string_array(const std::string& key) const {
  const GgufValue& v = need(key);
  if (v.type() != GgufType::Array || v.elem_ != GgufType::String)
    v.wrong_kind(who(key), "an array of strings");
  return v.strs_;
}

std::vector<int64_t> GgufFile::get_int_array(const std::string& key) const {
  const GgufValue& v = need(key);
  if (v.type() != GgufType::Array || !is_integer_type(v.elem_))
    v.wrong_kind(who(key), "an array of integers");
  std::vector<int64_t> out(v.count_);
  for (size_t i = 0; i < v.count_; ++i)
    out[i] = v.scalar_at(i).to_int(who(key) + " element " + std::to_string(i));
  return out;
}

std::vector<double> GgufFile::get_float_array(const std::string& key) const {
  const GgufValue& v = need(key);
  if (v.type() != GgufType::Array || scalar_size(v.elem_) == 0 || v.elem_ == GgufType::Bool)
    v.wrong_kind(who(key), "an array of numbers");
  std::vector<double> out(v.count_);
  for (size_t i = 0; i < v.count_; ++i) out[i] = v.scalar_at(i).to_float(who(key));
  return out;
}

uint64_t GgufFile::get_uint(const std::string& key, uint64_t fallback) const {
  return has(key) ? get_uint(key) : fallback;
}
int64_t GgufFile::get_int(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}
double GgufFile::get_float(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}
bool GgufFile::get_bool(const std::string& key, bool fallback) const {
  return has(key) ? get_bool(key) : fallback;
}
std::string GgufFile::get_string(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}

const GgufFile::TensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufFile::TensorInfo& GgufFile::tensor(const std::string& name) const {
  const TensorInfo* t = find_tensor(name);
  if (t == nullptr) io::file_error(path_, "no tensor named '" + name + "'");
  return *t;
}

std::span<const uint8_t> GgufFile::tensor_bytes(const TensorInfo& t) const {
  const uint64_t data_size = data_offset_ <= bytes_.size() ? bytes_.size() - data_offset_ : 0;
  const QuantTraits* tr = find_quant_traits(uint32_t(t.type));
  uint64_t nbytes = 0;
  if (tr == nullptr || !tensor_nbytes(*tr, t.nelements, nbytes) || nbytes != t.nbytes ||
      t.offset > data_size || t.nbytes > data_size - t.offset)
    io::file_error(path_, "tensor '" + t.name + "': its info does not describe data of this file");
  return bytes_.subspan(size_t(data_offset_ + t.offset), size_t(t.nbytes));
}

void GgufFile::dequantize(const TensorInfo& t, DType out_type, void* out) const {
  std::span<const uint8_t> b = tensor_bytes(t);
  const QuantTraits& tr = quant_traits(t.type);
  if (!tr.dequantizable)
    io::file_error(path_, "tensor '" + t.name + "' is " + tr.name +
                              ", which retort cannot dequantize (it decodes " + dequantizable_types() + ")");
  retort::dequantize(t.type, b.data(), out_type, out, t.nelements);
}

void GgufFile::dequantize(const TensorInfo& t, float* out) const {
  dequantize(t, DType::F32, out);
}

std::vector<float> GgufFile::dequantize(const TensorInfo& t) const {
  tensor_bytes(t);  // validate before allocating nelements floats
  std::vector<float> out(size_t(t.nelements));
  dequantize(t, DType::F32, out.data());
  return out;
}

}  // namespace retort
