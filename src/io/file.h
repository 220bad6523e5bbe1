// File plumbing shared by every retort file format: defensive reading (a bounds-checked cursor whose errors
// name the file, the offset and the field), read-only memory maps, atomic writing (core/atomic_file.h),
// CRC-32 and little-endian helpers. Every failure throws retort::Error naming the file and the fault.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../core/atomic_file.h"
#include "../core/error.h"

namespace retort::io {

// Reading a whole file, file_error and atomic writing live in core (core/atomic_file.h), where the CUDA
// backend's tune cache can use them too; the formats here name them as io's own.
using retort::AtomicFile;
using retort::errno_text;
using retort::file_error;
using retort::FileWriter;
using retort::open_regular;
using retort::read_file;
using retort::read_text_file;
using retort::write_file_atomic;

// ---- little-endian scalars ------------------------------------------------------------------------------
// Byte by byte, so they are correct on any host and at any alignment.
inline uint16_t load_le16(const void* p) {
  const auto* b = static_cast<const uint8_t*>(p);
  return uint16_t(b[0] | (b[1] << 8));
}
inline uint32_t load_le32(const void* p) {
  const auto* b = static_cast<const uint8_t*>(p);
  return uint32_t(b[0]) | (uint32_t(b[1]) << 8) | (uint32_t(b[2]) << 16) | (uint32_t(b[3]) << 24);
}
inline uint64_t load_le64(const void* p) {
  const auto* b = static_cast<const uint8_t*>(p);
  return uint64_t(load_le32(b)) | (uint64_t(load_le32(b + 4)) << 32);
}
inline void store_le16(void* p, uint16_t v) {
  auto* b = static_cast<uint8_t*>(p);
  b[0] = uint8_t(v);
  b[1] = uint8_t(v >> 8);
}
inline void store_le32(void* p, uint32_t v) {
  auto* b = static_cast<uint8_t*>(p);
  for (int i = 0; i < 4; ++i) b[i] = uint8_t(v >> (8 * i));
}
inline void store_le64(void* p, uint64_t v) {
  auto* b = static_cast<uint8_t*>(p);
  for (int i = 0; i < 8; ++i) b[i] = uint8_t(v >> (8 * i));
}
// Appends to a byte buffer (for building headers).
void append_le16(std::vector<uint8_t>& out, uint16_t v);
void append_le32(std::vector<uint8_t>& out, uint32_t v);
void append_le64(std::vector<uint8_t>& out, uint64_t v);
void append_bytes(std::vector<uint8_t>& out, const void* p, size_t n);

// Bulk arrays (tensor data in checkpoints) are copied as raw little-endian bytes, which is only correct on a
// little-endian host: file.cpp refuses to build anywhere else.

// ---- CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320) -----------------------------------------------
// crc32("123456789") == 0xCBF43926. Streaming: crc = crc32_update(crc, ...) starting from 0.
uint32_t crc32_update(uint32_t crc, const void* data, size_t n);
inline uint32_t crc32(const void* data, size_t n) {
  return crc32_update(0, data, n);
}
inline uint32_t crc32(std::span<const uint8_t> s) {
  return crc32_update(0, s.data(), s.size());
}

// ---- reading --------------------------------------------------------------------------------------------
// A read-only memory map of a whole file. Move-only; unmaps on destruction. An empty file maps to
// data() == nullptr, size() == 0.
class MappedFile {
 public:
  MappedFile() = default;
  // Throws retort::Error naming the file when it cannot be opened, stat'ed or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  void release();
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// A bounds-checked cursor over bytes that belong to a named file. Every read checks that the bytes exist
// first; a short read throws "<path>: truncated: <field> needs N bytes at offset O, but the file has S
// bytes".
class ByteReader {
 public:
  ByteReader(std::span<const uint8_t> bytes, std::string path) : bytes_(bytes), path_(std::move(path)) {}

  size_t offset() const { return pos_; }
  size_t size() const { return bytes_.size(); }
  size_t remaining() const { return bytes_.size() - pos_; }
  const std::string& path() const { return path_; }

  // Throws unless n more bytes are available; `what` names the field in the message.
  void need(size_t n, const char* what) const;
  uint8_t u8(const char* what);
  uint16_t u16(const char* what);
  uint32_t u32(const char* what);
  uint64_t u64(const char* what);
  // n bytes, returned as a view into the underlying buffer.
  std::span<const uint8_t> bytes(size_t n, const char* what);
  // Checks the next bytes equal `magic` ("<path>: wrong magic: expected ..., got ... (not a <kind> file)").
  void expect_magic(std::string_view magic, const char* kind);
  void skip(size_t n, const char* what) { bytes(n, what); }

  // Throws retort::Error "<path>: <parts...>".
  template <typename... Args>
  [[noreturn]] void fail(const Args&... parts) const;

 private:
  std::span<const uint8_t> bytes_;
  std::string path_;
  size_t pos_ = 0;
};

template <typename... Args>
void ByteReader::fail(const Args&... parts) const {
  file_error(path_, detail::concat(parts...));
}

}  // namespace retort::io
