#include "file.h"

#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <utility>

namespace retort::io {

static_assert(std::endian::native == std::endian::little,
              "retort's file formats map raw little-endian arrays; big-endian hosts are not supported");


void append_le16(std::vector<uint8_t>& out, uint16_t v) {
  size_t at = out.size();
  out.resize(at + 2);
  store_le16(out.data() + at, v);
}
void append_le32(std::vector<uint8_t>& out, uint32_t v) {
  size_t at = out.size();
  out.resize(at + 4);
  store_le32(out.data() + at, v);
}
void append_le64(std::vector<uint8_t>& out, uint64_t v) {
  size_t at = out.size();
  out.resize(at + 8);
  store_le64(out.data() + at, v);
}
void append_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}

// ---- reading --------------------------------------------------------------------------------------------

MappedFile::MappedFile(const std::string& path) : path_(path) {
  size_t size = 0;
  int fd = open_regular(path, size);
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      std::string why = errno_text();
      ::close(fd);
      file_error(path, "cannot memory-map " + std::to_string(size) + " bytes: " + why);
    }
    data_ = static_cast<const uint8_t*>(p);
    size_ = size;
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() {
  release();
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), path_(std::move(o.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    path_ = std::move(o.path_);
  }
  return *this;
}

void MappedFile::release() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

void ByteReader::need(size_t n, const char* what) const {
  if (n > remaining())
    fail("truncated: ", what, " needs ", n, " bytes at offset ", pos_, ", but the file has ", bytes_.size(),
         " bytes");
}

uint8_t ByteReader::u8(const char* what) {
  return bytes(1, what)[0];
}
uint16_t ByteReader::u16(const char* what) {
  return load_le16(bytes(2, what).data());
}
uint32_t ByteReader::u32(const char* what) {
  return load_le32(bytes(4, what).data());
}
uint64_t ByteReader::u64(const char* what) {
  return load_le64(bytes(8, what).data());
}

std::span<const uint8_t> ByteReader::bytes(size_t n, const char* what) {
  need(n, what);
  std::span<const uint8_t> s = bytes_.subspan(pos_, n);
  pos_ += n;
  return s;
}

void ByteReader::expect_magic(std::string_view magic, const char* kind) {
  if (remaining() < magic.size())
    fail("truncated: the file has ", remaining(), " bytes, too short for the ", magic.size(),
         "-byte magic of a ", kind, " file");
  std::span<const uint8_t> got = bytes(magic.size(), "magic");
  if (std::memcmp(got.data(), magic.data(), magic.size()) == 0) return;
  auto show = [](std::span<const uint8_t> s) {
    std::string out = "\"";
    for (uint8_t c : s) {
      if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
        out += char(c);
      } else {
        char hex[8];
        std::snprintf(hex, sizeof hex, "\\x%02x", c);
        out += hex;
      }
    }
    return out + "\"";
  };
  fail("wrong magic: expected ", show({reinterpret_cast<const uint8_t*>(magic.data()), magic.size()}),
       ", got ", show(got), " (not a ", kind, " file)");
}

}  // namespace retort::io
