// A small text file of tuned choices: for each key (a list of integers describing, say, a GEMM's shape and
// types) a value (a list of integers: which algorithm won). The entries hold only under the signature they
// were recorded with (the device, the library version, ...), which is the file's second line; a file under
// another signature holds nothing for this one. Used by the CUDA fused linear losses to keep cuBLASLt
// algorithm picks across processes (CudaOptions::gemm_cache), so that runs on one machine pick the same
// algorithms (the same f32 rounding) and skip the timing.
//
//   retort tune cache 1
//   signature <any text without a newline>
//   <k0> <k1> ... : <v0> <v1> ...
//
// Read defensively (every malformed line is a retort::Error naming the file and the line), written
// atomically (core/atomic_file.h: never torn). Host-only C++, built with or without CUDA so that its tests
// and fuzzing run everywhere.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace retort::cuda {

struct TuneEntry {
  std::vector<int64_t> key;
  std::vector<int64_t> value;
};

// The entries of the cache at path recorded under `signature`; empty when the file does not exist or was
// written under another signature. Throws retort::Error naming the file (and line) when it exists but cannot
// be read, is not a tune cache, or a line is malformed (a key or value that is empty, not integers, or
// longer than 64 numbers; a repeated key; more than 100,000 entries).
std::vector<TuneEntry> read_tune_cache(const std::string& path, const std::string& signature);

// Writes entries under signature atomically, merged with what the file already holds under the same
// signature (this call's entries win on equal keys; the others are kept in file order); a file under another
// signature, or none, is replaced. Throws retort::Error naming the file when it cannot be written, or when
// the signature holds a newline or an entry is empty.
void write_tune_cache(const std::string& path, const std::string& signature,
                      const std::vector<TuneEntry>& entries);

}  // namespace retort::cuda
