// Writes small valid GGUF files into the directory given as argv[1], the seed corpus of fuzz_gguf: every
// metadata type, nested arrays, v2 and v3, alignments 1, 32 and 64, and one tensor of each decodable type.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "../io/gguf_builder.h"

using retort::test::GgufBuilder;
using G = GgufBuilder;

namespace {

void write(const std::string& dir, const std::string& name, const G::Bytes& b) {
  const std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(b.data(), 1, b.size(), f) != b.size() || std::fclose(f) != 0) {
    std::fprintf(stderr, "seeds_gguf: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

G::Bytes filler(size_t n, uint8_t seed) {
  G::Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = uint8_t(seed + 37 * i + (i >> 3));
  return b;
}

G metadata_file(uint32_t version) {
  G g;
  g.version = version;
  g.kv("u8", G::U8, G::scalar<uint8_t>(7)).kv("i8", G::I8, G::scalar<int8_t>(-7));
  g.kv("u16", G::U16, G::scalar<uint16_t>(700)).kv("i16", G::I16, G::scalar<int16_t>(-700));
  g.kv_u32("u32", 70000).kv("i32", G::I32, G::scalar<int32_t>(-70000));
  g.kv("f32", G::F32, G::scalar<float>(0.5f)).kv("bool", G::BOOL, {1});
  g.kv_str("general.name", "seed").kv("u64", G::U64, G::scalar<uint64_t>(1));
  g.kv("i64", G::I64, G::scalar<int64_t>(-1)).kv("f64", G::F64, G::scalar<double>(0.25));
  g.kv("tokens", G::ARRAY, G::string_array({"<s>", "a", "b"}));
  g.kv("scores", G::ARRAY, G::array_of<float>(G::F32, {0.f, -1.f, -2.f}));
  g.kv("types", G::ARRAY, G::array_of<int32_t>(G::I32, {3, 1, 1}));
  g.kv("flags", G::ARRAY, G::array_of<uint8_t>(G::BOOL, {0, 1}));
  G::Bytes inner = G::array_of<uint16_t>(G::U16, {1, 2});
  G::append(inner, G::array_of<uint16_t>(G::U16, {3}));
  g.kv("nested", G::ARRAY, G::array(G::ARRAY, 2, inner));
  g.tensor("w", {4, 2}, 0, filler(32, 1));
  return g;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: seeds_gguf DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  write(dir, "meta_v3.gguf", metadata_file(3).build());
  write(dir, "meta_v2.gguf", metadata_file(2).build());
  for (uint32_t align : {1u, 64u}) {
    G g;
    g.alignment = align;
    g.kv_u32("general.alignment", align);
    g.tensor("a", {3}, 0, filler(12, 2)).tensor("b", {32}, 8, filler(34, 3));
    write(dir, "align_" + std::to_string(align) + ".gguf", g.build());
  }
  // One tensor per decodable type (type id, elements, bytes): F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
  // Q4_K, Q5_K, Q6_K; plus two types retort only sizes (Q2_K, IQ4_NL).
  const struct {
    uint32_t id;
    uint64_t elems, bytes;
  } types[] = {{0, 8, 32},     {1, 8, 16},    {30, 8, 16}, {8, 32, 34},    {2, 32, 18},
               {3, 32, 20},    {6, 32, 22},   {7, 32, 24}, {12, 256, 144}, {13, 256, 176},
               {14, 256, 210}, {10, 256, 84}, {20, 32, 18}};
  G all;
  all.kv_str("general.architecture", "llama");
  for (const auto& t : types) {
    G one;
    one.tensor("t", {t.elems}, t.id, filler(t.bytes, uint8_t(t.id)));
    write(dir, "type_" + std::to_string(t.id) + ".gguf", one.build());
    all.tensor("t" + std::to_string(t.id), {t.elems, 1}, t.id, filler(t.bytes, uint8_t(t.id + 1)));
  }
  write(dir, "all_types.gguf", all.build());
  return 0;
}
