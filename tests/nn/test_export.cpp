// Exporting a model (src/nn/export.h): GGUF and Hugging Face files load back into retort with the same
// tokenizer and identical logits (F32), weights rounded exactly as f16 / bf16 round them, Q8_0 within its
// step; and every export the target cannot hold is an error that leaves nothing at the output path.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include <unistd.h>

#include "../io/io_test_util.h"
#include "core/cpu_backend.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "nn/export.h"
#include "nn/pretrained.h"

namespace retort {
namespace {

using test::expect_error;
using test::ScratchDir;

const char* kText =
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; and "
    "darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. 1234 "
    "And God said, Let there be light: and there was light.\n\n  Tabs\tand  spaces, ünïcödé 東京 and <|x|>.";

TransformerConfig config(int64_t vocab, bool tied = true, bool bias = false) {
  TransformerConfig c;
  c.vocab = vocab;
  c.context = 16;
  c.layers = 2;
  c.d_model = 64;
  c.heads = 4;
  c.kv_heads = 2;
  c.d_ff = 96;
  c.rope_theta = 5000.0f;
  c.norm_eps = 1e-6f;
  c.tie_embeddings = tied;
  c.qkv_bias = bias;
  return c;
}

// A model with non-trivial norms and biases, so a misplaced tensor cannot pass unnoticed.
std::unique_ptr<Transformer> make_model(Context& ctx, const TransformerConfig& c, uint64_t seed) {
  auto m = std::make_unique<Transformer>(ctx, c, seed);
  std::mt19937 rng{static_cast<uint32_t>(seed)};
  std::normal_distribution<float> n(0.0f, 0.3f);
  for (Tensor* p : m->parameters())
    if (p->shape().size() == 1) {
      std::vector<float> v(static_cast<size_t>(p->nelements()));
      for (float& x : v) x = 1.0f + n(rng);
      set_data(p, v);
    }
  return m;
}

std::vector<float> logits(Context& ctx, Transformer& m, const std::vector<int32_t>& ids) {
  const int64_t T = std::min<int64_t>(int64_t(ids.size()), m.config().context);
  Tensor* tokens = ctx.input(DType::I32, {1, T}, "tokens");
  set_data_int(tokens, std::vector<int64_t>(ids.begin(), ids.begin() + T));
  Tensor* out = m.forward(ctx, tokens);
  out->flags |= kOutput;
  Graph g(ctx);
  g.forward(out);
  g.compute();
  return get_data(out);
}

Tokenizer trained_tokenizer() {
  BpeTrainOptions o;
  o.vocab_size = 300;
  o.min_frequency = 1;
  return Tokenizer::train(kText, o);
}

float round_to(DType t, float v) {
  return t == DType::F16 ? f16_to_f32(f32_to_f16(v)) : bf16_to_f32(f32_to_bf16(v));
}

// Loads path and checks its tokenizer encodes like want (null: bytes) and its logits equal the model's
// (tolerance 0: bit-exact). Returns the loaded model's parameters by name.
std::map<std::string, std::vector<float>> check_loads(const std::string& path, Transformer& m,
                                                      const Tokenizer* want, float tol) {
  Context ctx(default_cpu_backend());
  LoadedModel l = load_model(path, ctx);
  EXPECT_TRUE(same_architecture(l.model->config(), m.config())) << l.model->config().describe();
  EXPECT_EQ(l.model->config().context, m.config().context);
  EXPECT_EQ(l.model->config().norm_eps, m.config().norm_eps);
  EXPECT_EQ(l.model->config().rope_theta, m.config().rope_theta);
  EXPECT_TRUE(l.tokenizer);
  std::vector<int32_t> ids;
  if (want) {
    ids = want->encode(kText, true);
  } else {
    for (unsigned char ch : std::string(kText)) ids.push_back(ch);
  }
  if (l.tokenizer) {
    EXPECT_EQ(l.tokenizer->encode(kText, true), ids) << path;
  }
  const std::vector<float> a = logits(*m.parameters()[0]->ctx, m, ids), b = logits(ctx, *l.model, ids);
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  EXPECT_LE(worst, tol) << path;
  std::map<std::string, std::vector<float>> params;
  for (Tensor* p : l.model->parameters()) params[p->name] = get_data(p);
  return params;
}

struct Case {
  bool tied, bias, bytes;
};

class ExportRoundTrip : public ::testing::TestWithParam<Case> {};

TEST_P(ExportRoundTrip, GgufAndHuggingFace) {
  const Case k = GetParam();
  const Tokenizer trained = trained_tokenizer();
  const Tokenizer* tok = k.bytes ? nullptr : &trained;
  Context ctx(default_cpu_backend());
  auto m = make_model(ctx, config(k.bytes ? 256 : trained.vocab_size(), k.tied, k.bias), 7);
  ScratchDir dir;
  // F32: the very weights, so the very logits.
  export_gguf(*m, tok, dir.file("m32.gguf"));
  export_gguf(*m, tok, dir.file("m.gguf"), {.dtype = QuantType::F32});
  check_loads(dir.file("m.gguf"), *m, tok, 0.0f);
  export_hf(*m, tok, dir.file("hf32"), {.dtype = QuantType::F32});
  check_loads(dir.file("hf32"), *m, tok, 0.0f);
  EXPECT_EQ(GgufFile(dir.file("m.gguf")).get_string("general.architecture"), k.bias ? "qwen2" : "llama");
  EXPECT_EQ(GgufFile(dir.file("m.gguf")).find_tensor("output.weight") == nullptr, k.tied);
  // F16 / BF16: every matrix exactly as the conversion rounds it, the norms and biases untouched in GGUF.
  for (DType dt : {DType::F16, DType::BF16}) {
    const QuantType qt = dt == DType::F16 ? QuantType::F16 : QuantType::BF16;
    const std::string g = dir.file(std::string("m_") + dtype_name(dt) + ".gguf");
    const std::string h = dir.file(std::string("hf_") + dtype_name(dt));
    export_gguf(*m, tok, g, {.dtype = qt});
    export_hf(*m, tok, h, {.dtype = qt});
    const auto pg = check_loads(g, *m, tok, 0.05f);
    const auto ph = check_loads(h, *m, tok, 0.05f);
    for (Tensor* p : m->parameters()) {
      const std::vector<float> v = get_data(p);
      const bool matrix = p->shape().size() == 2;
      for (size_t i = 0; i < v.size(); ++i) {
        ASSERT_EQ(pg.at(p->name)[i], matrix ? round_to(dt, v[i]) : v[i]) << p->name << " " << i;
        ASSERT_EQ(ph.at(p->name)[i], round_to(dt, v[i])) << p->name << " " << i;
      }
    }
  }
  // Q8_0: within half a quantization step of each block.
  export_gguf(*m, tok, dir.file("m_q8.gguf"), {.dtype = QuantType::Q8_0});
  check_loads(dir.file("m_q8.gguf"), *m, tok, 0.1f);
  // The HF directory holds the five files and nothing else (no staging directory beside it either).
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir.file("hf32")))
    files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"config.json", "generation_config.json", "model.safetensors",
                                             "tokenizer.json", "tokenizer_config.json"}));
  for (const std::string& e : dir.entries()) EXPECT_EQ(e.find(".tmp."), std::string::npos) << e;
}

INSTANTIATE_TEST_SUITE_P(Models, ExportRoundTrip,
                         ::testing::Values(Case{true, false, false}, Case{false, false, false},
                                           Case{true, true, false}, Case{true, false, true}));

TEST(Export, HuggingFaceStoresRotateHalfQK) {
  // q's row (head h, pair i, half s) in retort is row (h, s, i) in HF: check one head by hand.
  Context ctx(default_cpu_backend());
  auto m = make_model(ctx, config(256), 3);
  ScratchDir dir;
  export_hf(*m, nullptr, dir.file("hf"), {.dtype = QuantType::F32});
  SafeTensors st(dir.file("hf/model.safetensors"));
  const std::vector<float> wq = get_data(m->blocks()[1].wq);
  const auto b = st.bytes("model.layers.1.self_attn.q_proj.weight");
  const int64_t hd = 16, dm = 64;
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t i = 0; i < hd / 2; ++i)
      for (int64_t s = 0; s < 2; ++s)
        for (int64_t col = 0; col < dm; col += 13) {
          const float want = wq[size_t(((h * hd) + 2 * i + s) * dm + col)];
          const float got = load_f32(b.data(), DType::F32, ((h * hd) + s * hd / 2 + i) * dm + col);
          ASSERT_EQ(got, want) << h << " " << i << " " << s;
        }
}

TEST(Export, PadsTheVocabularyWithUnusedTokens) {
  const Tokenizer tok = trained_tokenizer();
  Context ctx(default_cpu_backend());
  auto m = make_model(ctx, config(tok.vocab_size() + 20), 5);
  ScratchDir dir;
  export_gguf(*m, &tok, dir.file("p.gguf"), {.dtype = QuantType::F32});
  const GgufFile g(dir.file("p.gguf"));
  const auto tokens = g.get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(int64_t(tokens.size()), tok.vocab_size() + 20);
  EXPECT_EQ(tokens.back(), "[PAD" + std::to_string(tok.vocab_size() + 19) + "]");
  EXPECT_EQ(g.get_int_array("tokenizer.ggml.token_type").back(), int64_t(TokenType::Unused));
  EXPECT_EQ(g.get_string("tokenizer.ggml.pre"), "gpt-2");
  check_loads(dir.file("p.gguf"), *m, &tok, 0.0f);
  export_hf(*m, &tok, dir.file("hf"), {.dtype = QuantType::F32});
  check_loads(dir.file("hf"), *m, &tok, 0.0f);
}

TEST(Export, WhatTheTargetCannotHoldIsRefusedAndLeavesNothing) {
  const Tokenizer tok = trained_tokenizer();
  ScratchDir dir;
  Context ctx(default_cpu_backend());
  auto expect_empty = [&] {
    EXPECT_TRUE(dir.entries().empty()) << dir.entries().size() << " entries, first " << dir.entries()[0];
  };

  // Q8_0 rows must be whole blocks of 32: d_model 48 cannot be.
  TransformerConfig c48 = config(256);
  c48.d_model = 48;
  c48.heads = 3;
  c48.kv_heads = 1;
  auto m48 = make_model(ctx, c48, 1);
  expect_error([&] { export_gguf(*m48, nullptr, dir.file("q.gguf"), {.dtype = QuantType::Q8_0}); },
               {dir.file("q.gguf"), "Q8_0", "blocks of 32", "rows of 48", "f16"});
  expect_empty();
  expect_error([&] { export_hf(*m48, nullptr, dir.file("hf"), {.dtype = QuantType::Q8_0}); },
               {dir.file("hf"), "F32, F16 or BF16", "Q8_0"});
  expect_empty();

  // A tokenizer larger than the model's vocabulary.
  auto small = make_model(ctx, config(tok.vocab_size() - 1), 2);
  expect_error([&] { export_gguf(*small, &tok, dir.file("s.gguf")); },
               {dir.file("s.gguf"), std::to_string(tok.vocab_size()) + " tokens",
                "vocabulary of " + std::to_string(tok.vocab_size() - 1)});
  expect_error([&] { export_hf(*small, &tok, dir.file("s")); },
               {dir.file("s"), std::to_string(tok.vocab_size()) + " tokens"});
  expect_empty();

  // No tokenizer for a model that is not byte-level.
  expect_error([&] { export_gguf(*small, nullptr, dir.file("n.gguf")); },
               {dir.file("n.gguf"), "no tokenizer", "vocabulary of " + std::to_string(tok.vocab_size() - 1)});
  expect_empty();

  // Two tokens with one spelling: an ordinary token "<|x|>" and a special one.
  TokenizerSpec spec = Tokenizer::train("abc", {.vocab_size = 256, .special_tokens = {}}).to_spec();
  spec.tokens.push_back("<|x|>");
  spec.types.push_back(int32_t(TokenType::Normal));
  spec.tokens.push_back("<|x|>");
  spec.types.push_back(int32_t(TokenType::Control));
  const Tokenizer dup = Tokenizer::from_spec(spec);
  auto mdup = make_model(ctx, config(dup.vocab_size()), 4);
  expect_error([&] { export_gguf(*mdup, &dup, dir.file("d.gguf")); },
               {dir.file("d.gguf"), "tokens 256 and 257", "<|x|>", "unique token strings"});
  expect_error([&] { export_hf(*mdup, &dup, dir.file("d")); }, {dir.file("d"), "tokens 256 and 257"});
  expect_empty();

  // ignore_merges without Llama 3's pre-tokenizer: llama.cpp has no key for it.
  TokenizerSpec im = tok.to_spec();
  im.ignore_merges = true;
  const Tokenizer imt = Tokenizer::from_spec(im);
  auto m300 = make_model(ctx, config(tok.vocab_size()), 6);
  expect_error([&] { export_gguf(*m300, &imt, dir.file("i.gguf")); },
               {dir.file("i.gguf"), "ignore_merges on", "cannot be expressed in GGUF"});
  expect_empty();

  // Places that cannot be written: a missing directory is made for HF, but a file in the way is refused.
  expect_error([&] { export_gguf(*m300, &tok, dir.file("none/x.gguf")); }, {dir.file("none/x.gguf")});
  expect_empty();
  test::spit(dir.file("afile"), {1, 2, 3});
  expect_error([&] { export_hf(*m300, &tok, dir.file("afile")); }, {dir.file("afile"), "not a directory"});
  expect_error([&] { export_hf(*m300, &tok, dir.file("afile/sub")); }, {"afile"});
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"afile"});
  std::filesystem::create_directory(dir.file("ro"));
  std::filesystem::permissions(dir.file("ro"),
                               std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  if (::access(dir.file("ro").c_str(), W_OK) != 0) {  // root writes anywhere: then there is nothing to test
    expect_error([&] { export_gguf(*m300, &tok, dir.file("ro/x.gguf")); }, {dir.file("ro/x.gguf")});
    expect_error([&] { export_hf(*m300, &tok, dir.file("ro/hf")); }, {dir.file("ro/hf")});
    EXPECT_TRUE(std::filesystem::is_empty(dir.file("ro")));
  }
  std::filesystem::permissions(dir.file("ro"), std::filesystem::perms::owner_all);
}

TEST(Export, HuggingFaceReplacesItsOwnFilesOnly) {
  Context ctx(default_cpu_backend());
  auto a = make_model(ctx, config(256), 1), b = make_model(ctx, config(256), 2);
  ScratchDir dir;
  std::filesystem::create_directory(dir.file("hf"));
  test::spit(dir.file("hf/README.md"), {'h', 'i'});
  export_hf(*a, nullptr, dir.file("hf"), {.dtype = QuantType::F32});
  export_hf(*b, nullptr, dir.file("hf"), {.dtype = QuantType::F32});
  check_loads(dir.file("hf"), *b, nullptr, 0.0f);
  EXPECT_EQ(test::slurp(dir.file("hf/README.md")).size(), 2u);
}

}  // namespace
}  // namespace retort
