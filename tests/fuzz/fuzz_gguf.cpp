// libFuzzer harness for the GGUF reader (src/io/gguf.h): any input must either parse or throw retort::Error.
// A parsed file has every metadata value read through every accessor and its small tensors dequantized, so
// the validation is checked against the code that trusts it. Anything else (a sanitizer report, another
// exception, an allocation past libFuzzer's limit) is a finding. Run it with tools/fuzz.sh.
// SOURCES: src/io/gguf.cpp src/io/file.cpp src/core/atomic_file.cpp src/core/quant.cpp src/core/dtype.cpp src/core/error.cpp
// SOURCES: src/core/tensor.cpp
// SOURCES: src/io/crc32.cpp
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "io/gguf.h"

namespace {

volatile double g_sink;  // keeps the reads from being optimized away

// Runs fn; a retort::Error is a fine outcome for an accessor that does not fit the value.
template <typename Fn>
void attempt(Fn&& fn) {
  try {
    fn();
  } catch (const retort::Error&) {
  }
}

// Every accessor of a value; the ones that do not fit its kind throw retort::Error, which is fine.
void touch(const retort::GgufValue& v) {
  g_sink = double(v.describe().size());
  attempt([&] { g_sink = double(v.as_int()); });
  attempt([&] { g_sink = double(v.as_uint()); });
  attempt([&] { g_sink = v.as_float(); });
  attempt([&] { g_sink = v.as_bool(); });
  attempt([&] { g_sink = double(v.as_string().size()); });
  if (v.type() != retort::GgufType::Array) return;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v.elem_type() == retort::GgufType::String)
      g_sink = double(v.string_at(i).size());
    else if (v.elem_type() == retort::GgufType::Array)
      touch(v.array_at(i));
    else
      touch(v.scalar_at(i));
  }
  attempt([&] { v.scalar_at(v.size()); });  // one past the end must throw, not read
}

void exercise(const retort::GgufFile& f) {
  for (const auto& kv : f.metadata()) {
    const std::string& key = kv.first;
    touch(kv.second);
    attempt([&] { g_sink = double(f.get_int(key)); });
    attempt([&] { g_sink = double(f.get_uint(key)); });
    attempt([&] { g_sink = f.get_float(key); });
    attempt([&] { g_sink = f.get_bool(key); });
    attempt([&] { g_sink = double(f.get_string(key).size()); });
    attempt([&] { g_sink = double(f.get_string_array(key).size()); });
    attempt([&] { g_sink = double(f.get_int_array(key).size()); });
    attempt([&] { g_sink = double(f.get_float_array(key).size()); });
  }
  std::vector<float> out;
  std::vector<uint16_t> out16;
  for (const auto& t : f.tensors()) {
    if (f.find_tensor(t.name) != &t) __builtin_trap();  // the index must agree with the list
    std::span<const uint8_t> b = f.tensor_bytes(t);
    if (b.size() != t.nbytes) __builtin_trap();
    if (t.nelements > (1 << 16) || !retort::quant_traits(t.type).dequantizable) continue;
    out.assign(size_t(t.nelements), 0.f);
    out16.assign(size_t(t.nelements), 0);
    f.dequantize(t, out.data());
    f.dequantize(t, retort::DType::BF16, out16.data());
    for (float x : out) g_sink = x;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    retort::GgufFile f(std::vector<uint8_t>(data, data + size), "fuzz.gguf");
    exercise(f);
  } catch (const retort::Error&) {
    // A clean rejection.
  }
  return 0;
}
