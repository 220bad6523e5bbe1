#include "io_test_util.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "retort.h"

namespace retort::test {

namespace fs = std::filesystem;

ScratchDir::ScratchDir() {
  std::string tmpl = (fs::temp_directory_path() / "retort_io_XXXXXX").string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
  path_ = buf.data();
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::vector<std::string> ScratchDir::entries() const {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(path_)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<uint8_t> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

void spit(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

void flip_byte(const std::string& path, size_t offset, uint8_t mask) {
  std::vector<uint8_t> b = slurp(path);
  if (offset >= b.size()) throw std::runtime_error("flip_byte past the end of " + path);
  b[offset] ^= mask;
  spit(path, b);
}

void truncate_to(const std::string& path, size_t size) {
  std::vector<uint8_t> b = slurp(path);
  if (size > b.size()) throw std::runtime_error("truncate_to grows " + path);
  b.resize(size);
  spit(path, b);
}

void patch_le32(const std::string& path, size_t offset, uint32_t value) {
  std::vector<uint8_t> b = slurp(path);
  for (int i = 0; i < 4; ++i) b.at(offset + size_t(i)) = uint8_t(value >> (8 * i));
  spit(path, b);
}

void patch_le64(const std::string& path, size_t offset, uint64_t value) {
  std::vector<uint8_t> b = slurp(path);
  for (int i = 0; i < 8; ++i) b.at(offset + size_t(i)) = uint8_t(value >> (8 * i));
  spit(path, b);
}

std::string expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
  } catch (const Error& e) {
    std::string m = e.what();
    for (const std::string& n : needles)
      EXPECT_NE(m.find(n), std::string::npos) << "\"" << n << "\" not in: " << m;
    return m;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected retort::Error, got another exception: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected retort::Error, nothing was thrown";
  return "";
}

namespace {

std::vector<std::string> data_roots() {
  if (const char* env = std::getenv("RETORT_DATA_DIR"); env != nullptr && *env != '\0') return {env};
  std::vector<std::string> roots = {"/work/shared/data"};
#ifdef RETORT_TEST_DATA_DIR
  roots.push_back(RETORT_TEST_DATA_DIR);
#endif
  return roots;
}

}  // namespace

std::optional<std::string> find_data_file(const std::string& rel) {
  for (const std::string& root : data_roots()) {
    // The shared tree keeps the corpus under corpus/; the build unpacks it at the top of data/.
    for (const fs::path& p : {fs::path(root) / rel, fs::path(root) / fs::path(rel).filename()}) {
      std::error_code ec;
      if (fs::is_regular_file(p, ec)) return p.string();
    }
  }
  return std::nullopt;
}

std::string data_search_path() {
  std::string out;
  for (const std::string& r : data_roots()) out += (out.empty() ? "" : ", ") + r;
  return out;
}

}  // namespace retort::test
