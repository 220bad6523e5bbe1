// Writes small valid teacher top-K cache shards (f32 and bf16, K = 1 and K = 4, masked slots) into the
// directory given as argv[1]: the seed corpus of fuzz_topk_cache, made by the library's own writer.
// SOURCES: src/io/topk_cache.cpp src/io/file.cpp src/core/atomic_file.cpp src/core/dtype.cpp src/core/error.cpp
// SOURCES: src/io/crc32.cpp
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/topk_cache.h"

int main(int argc, char** argv) {
  if (argc != 2) return std::fprintf(stderr, "usage: seeds_topk_cache DIR\n"), 2;
  const std::string dir = argv[1];
  try {
    for (retort::LogprobDType dt : {retort::LogprobDType::F32, retort::LogprobDType::BF16})
      for (int64_t k : {1, 4}) {
        const int64_t n = 12, v = 50;
        std::vector<int32_t> ids;
        std::vector<float> lp;
        std::vector<uint8_t> valid;
        for (int64_t p = 0; p < n; ++p)
          for (int64_t j = 0; j < k; ++j) {
            ids.push_back(int32_t((p * 7 + j * 3) % v));
            lp.push_back(-0.5f - float(j));
            valid.push_back((p + j) % 5 != 4);
          }
        const std::string prefix = dir + "/c" + std::to_string(int(dt)) + "_" + std::to_string(k);
        retort::TopKCacheWriter w(prefix,
                                  {.vocab_size = v, .k = k, .dtype = dt, .positions_per_shard = 1000});
        w.write(0, n, ids.data(), lp.data(), valid.data());
        w.finish();
      }
  } catch (const retort::Error& e) {
    return std::fprintf(stderr, "seeds_topk_cache: %s\n", e.what()), 1;
  }
  return 0;
}
