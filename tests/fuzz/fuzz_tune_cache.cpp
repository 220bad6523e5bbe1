// libFuzzer harness for the tune cache (src/cuda/tune_cache.h, the CUDA backend's GEMM algorithm picks across
// processes): any input must either read or throw retort::Error. A read cache is written back under its
// signature and read again, which must give the same entries (the writer merges them with the file's own).
// Run it with tools/fuzz.sh (seeds: tests/fuzz/seeds_tune_cache.cpp, caches the library's writer made).
//
// SOURCES: src/core/error.cpp src/io/file.cpp src/core/atomic_file.cpp src/cuda/tune_cache.cpp
// SOURCES: src/io/crc32.cpp
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "cuda/tune_cache.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* kName = "fuzz_tune_cache";
  const std::string& path = fuzz::scratch_file(kName, data, size);
  try {
    const auto entries = retort::cuda::read_tune_cache(path, "fuzz signature");
    if (entries.empty()) return 0;
    retort::cuda::write_tune_cache(path, "fuzz signature", entries);
    const auto again = retort::cuda::read_tune_cache(path, "fuzz signature");
    if (again.size() != entries.size()) fuzz::finding(kName, "round trip", "entry count changed");
    for (size_t i = 0; i < again.size(); ++i)
      if (again[i].key != entries[i].key || again[i].value != entries[i].value)
        fuzz::finding(kName, "round trip", "entry " + std::to_string(i) + " changed");
  } catch (const retort::Error& e) {
    fuzz::check_error(kName, e);
  }
  return 0;
}
