// libFuzzer harness for token shards (src/io/shards.h) and the batch loader over them: any input must either
// open or throw retort::Error. An opened shard is read whole and in windows, and a BatchLoader with a few
// batch and window sizes (from the input's last bytes) draws batches from it; a token outside the shard's
// dtype, a short read, a crash or a sanitizer report is a finding. The checksum is not verified, so a
// mutated body reaches the code behind it (a crafted file can carry a valid checksum anyway).
// Run it with tools/fuzz.sh (seeds: tests/fuzz/seeds_token_shard.cpp).
// SOURCES: src/io/shards.cpp src/io/batch_loader.cpp src/io/file.cpp src/core/atomic_file.cpp src/core/error.cpp
// SOURCES: src/io/json.cpp src/io/unicode_classes.cpp src/io/pretokenize.cpp src/io/special_matcher.cpp
// SOURCES: src/io/tokenizer.cpp src/io/tokenizer_files.cpp src/io/tokenizer_hf.cpp src/io/bpe_train.cpp
// SOURCES: src/io/crc32.cpp
#include <algorithm>
#include <cstdint>
#include <vector>

#include "fuzz_util.h"
#include "io/batch_loader.h"
#include "io/shards.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* kName = "fuzz_token_shard";
  const std::string& path = fuzz::scratch_file(kName, data, size);
  try {
    retort::TokenShard shard(path, /*verify_checksum=*/false);
    const int64_t n = shard.size();
    const int64_t limit = shard.dtype() == retort::TokenDType::U16 ? 65536 : int64_t(1) << 32;
    const std::vector<int32_t> all = shard.read_all();
    if (int64_t(all.size()) != n) fuzz::finding(kName, "read_all", std::to_string(all.size()));
    for (int32_t t : all)
      if (t < 0 && shard.dtype() == retort::TokenDType::U16) fuzz::finding(kName, "token", std::to_string(t));
    if (n > 0 && int64_t(uint32_t(shard.at(n - 1))) >= limit)
      fuzz::finding(kName, "at", "out of dtype range");
    try {
      shard.at(n);  // one past the end must throw
      fuzz::finding(kName, "at", "no error past the end");
    } catch (const retort::Error&) {
    }
    const uint8_t tail = size ? data[size - 1] : 0;
    const int64_t batch = 1 + tail % 4, seq_len = 1 + (tail >> 2) % 16;
    retort::BatchLoader loader(
        {path}, {.batch = batch, .seq_len = seq_len, .shuffle = (tail & 1) != 0, .verify_checksums = false});
    for (int i = 0; i < 3; ++i) {
      const retort::Batch b = loader.next();
      if (int64_t(b.inputs.size()) != batch * seq_len) fuzz::finding(kName, "batch", "wrong size");
    }
    loader.seek(1, loader.windows());
    loader.next();
  } catch (const retort::Error& e) {
    fuzz::check_error(kName, e);
  }
  return 0;
}
