// Shared by the file-reader harnesses: the input written to a per-process scratch file (the readers take
// paths and memory-map them), and the one way a harness reports a finding.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/error.h"

namespace fuzz {

[[noreturn]] inline void finding(const char* harness, const char* what, const std::string& detail) {
  std::fprintf(stderr, "%s: %s: %s\n", harness, what, detail.c_str());
  std::abort();
}

// A retort::Error is the expected answer to a bad file, unless it is RT_ASSERT's (a retort bug).
inline void check_error(const char* harness, const retort::Error& e) {
  if (std::string_view(e.what()).starts_with("retort internal error")) finding(harness, "internal", e.what());
}

// Writes the input to a scratch file of this process and returns its path.
inline const std::string& scratch_file(const char* harness, const uint8_t* data, size_t size) {
  static const std::string path = [&] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir && *dir ? dir : "/tmp") + "/" + harness + "_" + std::to_string(::getpid()) +
           ".bin";
  }();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || (size && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0)
    finding(harness, "setup", "cannot write " + path);
  return path;
}

}  // namespace fuzz
