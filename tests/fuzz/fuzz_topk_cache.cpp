// libFuzzer harness for the teacher top-K cache reader (src/io/topk_cache.h): any input must either open or
// throw retort::Error. An opened cache is gathered over every position (all K slots and fewer) and each slot
// checked against the reader's promise: a valid slot has an id in [0, V) and a finite logprob, a masked one
// id 0 and logprob -inf. A broken promise, a crash or a sanitizer report is a finding. Checksums are not
// verified, so mutated records reach the checks behind them (a crafted file can carry valid ones anyway).
// Run it with tools/fuzz.sh (seeds: tests/fuzz/seeds_topk_cache.cpp).
// SOURCES: src/io/topk_cache.cpp src/io/file.cpp src/core/atomic_file.cpp src/core/dtype.cpp src/core/error.cpp
// SOURCES: src/io/crc32.cpp
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "fuzz_util.h"
#include "io/topk_cache.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* kName = "fuzz_topk_cache";
  const std::string& path = fuzz::scratch_file(kName, data, size);
  try {
    retort::TopKCache cache({path}, /*verify_checksums=*/false);
    const int64_t n = std::min<int64_t>(cache.positions(), 4096);
    for (int64_t k : {cache.k(), int64_t(1)}) {
      if (n == 0) break;
      const retort::TopKBatch b = cache.gather({0}, n, k);
      for (size_t i = 0; i < b.ids.size(); ++i) {
        const bool valid = b.mask[i] != 0.0f;
        if (valid && (b.ids[i] < 0 || b.ids[i] >= cache.vocab_size()))
          fuzz::finding(kName, "id out of range", std::to_string(b.ids[i]));
        if (valid && !std::isfinite(b.logprobs[i]))
          fuzz::finding(kName, "non-finite logprob", std::to_string(i));
        if (!valid && (b.ids[i] != 0 || b.logprobs[i] != -std::numeric_limits<float>::infinity()))
          fuzz::finding(kName, "masked slot", std::to_string(i));
      }
    }
    if (cache.covers(0, n + 1) != (cache.positions() > n)) fuzz::finding(kName, "covers", "disagrees");
    try {
      cache.gather({cache.positions()}, 1);  // past the end must throw
      fuzz::finding(kName, "gather", "no error past the end");
    } catch (const retort::Error&) {
    }
  } catch (const retort::Error& e) {
    fuzz::check_error(kName, e);
  }
  return 0;
}
