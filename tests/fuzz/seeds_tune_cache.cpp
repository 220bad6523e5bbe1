// Writes small tune caches (the library's writer) into the directory given as argv[1]: the seed corpus of
// fuzz_tune_cache, under the harness's signature and under another one.
// SOURCES: src/core/error.cpp src/io/file.cpp src/core/atomic_file.cpp src/cuda/tune_cache.cpp
// SOURCES: src/io/crc32.cpp
#include <cstdio>
#include <string>

#include "core/error.h"
#include "cuda/tune_cache.h"

int main(int argc, char** argv) {
  if (argc != 2) return std::fprintf(stderr, "usage: seeds_tune_cache DIR\n"), 2;
  const std::string dir = argv[1];
  try {
    using retort::cuda::TuneEntry;
    retort::cuda::write_tune_cache(dir + "/one.txt", "fuzz signature", {TuneEntry{{8192, 4096, 128256, 1}, {3}}});
    retort::cuda::write_tune_cache(dir + "/three.txt", "fuzz signature",
                                 {TuneEntry{{1, 2, 3}, {4, 5}}, TuneEntry{{-7, 0}, {9}}, TuneEntry{{42}, {0, 1, 2, 3}}});
    retort::cuda::write_tune_cache(dir + "/other.txt", "another device", {TuneEntry{{1}, {2}}});
  } catch (const retort::Error& e) {
    return std::fprintf(stderr, "seeds_tune_cache: %s\n", e.what()), 1;
  }
  return 0;
}
