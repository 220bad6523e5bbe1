// libFuzzer harness for retort's checkpoint (src/nn/lm.h, on the safetensors reader of src/io/safetensors.h):
// any input must either open or throw retort::Error. An opened checkpoint has its model built from its
// config, its parameters (and optimizer state) loaded, and one forward pass run: the config was checked
// against the stored tensors, so nothing here may allocate more than the file implies (libFuzzer's
// -rss_limit_mb and -malloc_limit_mb make that a finding) or crash. The crc32 is not verified, so mutations
// reach the checks behind it (a crafted file can carry a valid one: issue 25's 440-byte checkpoint did). Run
// it with tools/fuzz.sh (seeds: tests/fuzz/seeds_checkpoint.cpp). It links the whole library:
//
// SOURCES: src/core/*.cpp src/ops/*.cpp src/ops/loss/*.cpp src/io/*.cpp src/nn/*.cpp src/cuda/cuda_stub.cpp
#include <cstdint>
#include <vector>

#include "core/cpu_backend.h"
#include "fuzz_util.h"
#include "nn/lm.h"
#include "nn/optim.h"
#include "nn/transformer.h"
#include "ops/ops.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* kName = "fuzz_checkpoint";
  const std::string& path = fuzz::scratch_file(kName, data, size);
  static retort::CpuBackend backend(1);
  try {
    retort::Checkpoint ck(path, /*verify_checksum=*/false);
    retort::Context ctx(backend);
    retort::Transformer model(ctx, ck.config(), 1);
    ck.load_model(model);
    if (ck.has_optimizer()) {
      retort::AdamW opt(model.parameters(), retort::AdamWConfig{});
      ck.load_optimizer(opt, model);
    }
    const int64_t T = std::min<int64_t>(2, ck.config().context);
    retort::Tensor* tokens = ctx.input(retort::DType::I32, {1, T}, "tokens");
    retort::Tensor* logits = model.forward(ctx, tokens);
    logits->flags |= retort::kOutput;
    retort::Graph g(ctx);
    g.forward(logits);
    g.compute();
    if (int64_t(retort::get_data(logits).size()) != T * ck.config().vocab)
      fuzz::finding(kName, "logits", "size");
  } catch (const retort::Error& e) {
    fuzz::check_error(kName, e);
  }
  return 0;
}
