// retort.Tokenizer: byte-level BPE from a Hugging Face tokenizer.json, a GGUF file's tokenizer arrays (the
// constructor), GPT-2's files, retort's own file, or trained on a corpus. Text goes in as str (UTF-8) or
// bytes; decode() gives bytes, since a slice of tokens need not end on a character boundary.
#include "common.h"

namespace retort::py {

namespace {

std::optional<int32_t> id_or_none(int32_t id) {
  return id < 0 ? std::nullopt : std::optional<int32_t>(id);
}

std::string repr(const Tokenizer& t) {
  return "retort.Tokenizer(vocab_size=" + std::to_string(t.vocab_size()) +
         ", merges=" + std::to_string(t.merges().size()) + ", pre='" + pre_tokenizer_name(t.pre_tokenizer()) +
         "', specials=" + std::to_string(t.special_ids().size()) + ")";
}

}  // namespace

void bind_tokenizer(pyb::module_& m) {
  pyb::class_<Tokenizer, std::shared_ptr<Tokenizer>> c(
      m, "Tokenizer",
      "Byte-level BPE tokenizer (GPT-2, SmolLM2, Llama 3, Qwen2, or trained here).\n\n"
      "Build one from a Hugging Face tokenizer.json (Tokenizer.from_hf), from a GGUF file's tokenizer arrays "
      "(the constructor), from retort's own file (Tokenizer.load), or train one (Tokenizer.train). "
      "encode() takes str or bytes and never adds BOS (see add_bos); decode() returns bytes. Bytes the "
      "vocabulary has no token for are dropped by encode() (see missing_bytes).");
  c.def(pyb::init([](std::vector<std::string> tokens, std::vector<std::string> merges,
                     std::optional<std::vector<int32_t>> types, const std::string& pre, int32_t bos,
                     int32_t eos, bool add_bos, bool ignore_merges, std::string source) {
          TokenizerSpec spec;
          spec.tokens = std::move(tokens);
          spec.merges = std::move(merges);
          if (types) spec.types = std::move(*types);
          spec.pre = parse_pre_tokenizer(pre);
          spec.bos = bos;
          spec.eos = eos;
          spec.add_bos = add_bos;
          spec.ignore_merges = ignore_merges;
          spec.source = std::move(source);
          pyb::gil_scoped_release nogil;
          return Tokenizer::from_spec(spec);
        }),
        pyb::arg("tokens"), pyb::arg("merges"), pyb::arg("types") = pyb::none(), pyb::arg("pre") = "gpt2",
        pyb::arg("bos") = -1, pyb::arg("eos") = -1, pyb::arg("add_bos") = false,
        pyb::arg("ignore_merges") = false, pyb::arg("source") = "",
        "A vocabulary as GGUF describes it: tokens (tokenizer.ggml.tokens; normal ones in GPT-2's "
        "byte-to-unicode alphabet), merges ('a b' strings), types (tokenizer.ggml.token_type: 1 normal, 2 "
        "unknown, 3 control, 4 user-defined, 5 unused; None: all normal), pre (tokenizer.ggml.pre: 'gpt2', "
        "'smollm', 'llama3', 'qwen2', ...), bos/eos ids (-1: none). Raises retort.Error naming `source` and "
        "the token or merge at fault.");
  c.def_static(
      "from_hf",
      [](const std::string& path) {
        pyb::gil_scoped_release nogil;
        return Tokenizer::load_hf(path);
      },
      pyb::arg("path"),
      "A Hugging Face tokenizer.json (byte-level BPE), with BOS/EOS from the tokenizer_config.json next to "
      "it "
      "when present. Raises retort.Error naming the file and the field for anything unsupported.");
  c.def_static(
      "from_hf_json",
      [](const std::string& json, const std::string& config, const std::string& source) {
        pyb::gil_scoped_release nogil;
        return Tokenizer::from_hf_json(json, config, source);
      },
      pyb::arg("json"), pyb::arg("config") = "", pyb::arg("source") = "<tokenizer.json>",
      "from_hf from strings: tokenizer.json's text and tokenizer_config.json's text ('' for none).");
  c.def_static(
      "load",
      [](const std::string& path) {
        pyb::gil_scoped_release nogil;
        return Tokenizer::load(path);
      },
      pyb::arg("path"), "A file written by save().");
  c.def_static(
      "load_gpt2",
      [](const std::string& encoder_json, const std::string& vocab_bpe) {
        pyb::gil_scoped_release nogil;
        return Tokenizer::load_gpt2(encoder_json, vocab_bpe);
      },
      pyb::arg("encoder_json"), pyb::arg("vocab_bpe"), "GPT-2's encoder.json and vocab.bpe.");
  c.def_static(
      "train",
      [](const std::string& corpus, int64_t vocab_size, int64_t min_frequency,
         std::vector<std::string> special_tokens, const std::string& pre) {
        BpeTrainOptions o{vocab_size, min_frequency, std::move(special_tokens), parse_pre_tokenizer(pre)};
        pyb::gil_scoped_release nogil;
        return Tokenizer::train(corpus, o);
      },
      pyb::arg("corpus"), pyb::arg("vocab_size") = 4096, pyb::arg("min_frequency") = 2,
      pyb::arg("special_tokens") = std::vector<std::string>{"<|endoftext|>"}, pyb::arg("pre") = "gpt2",
      "Learns merges on corpus (str or bytes); deterministic.");
  c.def(
      "save",
      [](const Tokenizer& t, const std::string& path) {
        pyb::gil_scoped_release nogil;
        t.save(path);
      },
      pyb::arg("path"), "Writes retort's own tokenizer file, atomically.");
  c.def(
      "encode",
      [](const Tokenizer& t, const std::string& text, bool allow_special) {
        pyb::gil_scoped_release nogil;
        return t.encode(text, allow_special);
      },
      pyb::arg("text"), pyb::arg("allow_special") = false,
      "Token ids of text (str, as UTF-8, or bytes). With allow_special, special tokens' text "
      "('<|im_start|>') becomes their ids; without it, it is ordinary text.");
  c.def(
      "decode",
      [](const Tokenizer& t, const std::vector<int32_t>& ids) {
        std::string out;
        {
          pyb::gil_scoped_release nogil;
          out = t.decode(ids);
        }
        return pyb::bytes(out);
      },
      pyb::arg("ids"), "The bytes of the tokens (a special token's text), concatenated.");
  c.def(
      "token_to_id",
      [](const Tokenizer& t, pyb::object token) -> std::optional<int32_t> {
        if (pyb::isinstance<pyb::bytes>(token)) {
          std::string b = token.cast<std::string>();
          int32_t id = t.token_id(b);
          return id_or_none(id >= 0 ? id : t.special_id(b));
        }
        int32_t id = t.token_from_text(token.cast<std::string>());
        return id_or_none(id);
      },
      pyb::arg("token"),
      "The id of a token as model files spell it (str: 'Ġworld', '<|im_start|>'), or of the token with "
      "exactly these bytes (bytes: b' world'); None when there is none.");
  c.def("id_to_token", &Tokenizer::token_text, pyb::arg("id"),
        "The token as model files spell it: GPT-2's alphabet for a normal token ('Ġworld'), the text "
        "otherwise.");
  c.def(
      "token_bytes", [](const Tokenizer& t, int32_t id) { return pyb::bytes(t.token_bytes(id)); },
      pyb::arg("id"), "The bytes decode() gives for one token.");
  c.def("is_special", &Tokenizer::is_special, pyb::arg("id"),
        "True for unknown, control and user-defined tokens (matched in text only with allow_special).");
  c.def(
      "token_type", [](const Tokenizer& t, int32_t id) { return int32_t(t.token_type(id)); }, pyb::arg("id"),
      "GGUF's token type: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused.");
  c.def_property_readonly("vocab_size", &Tokenizer::vocab_size, "Number of tokens, specials included.");
  c.def("__len__", &Tokenizer::vocab_size);
  c.def_property_readonly(
      "bos_id", [](const Tokenizer& t) { return id_or_none(t.bos_id()); }, "BOS token id, or None.");
  c.def_property_readonly(
      "eos_id", [](const Tokenizer& t) { return id_or_none(t.eos_id()); }, "EOS token id, or None.");
  c.def_property_readonly("add_bos", &Tokenizer::add_bos,
                          "Whether the model expects BOS before each text (encode() never adds it).");
  c.def_property_readonly("ignore_merges", &Tokenizer::ignore_merges,
                          "Whether a piece that is itself a token becomes that token without merging.");
  c.def_property_readonly(
      "pre_tokenizer", [](const Tokenizer& t) { return std::string(pre_tokenizer_name(t.pre_tokenizer())); },
      "'gpt2', 'smollm', 'llama3' or 'qwen2'.");
  c.def_property_readonly("special_ids", &Tokenizer::special_ids, "Ids of the special tokens, ascending.");
  c.def_property_readonly(
      "missing_bytes",
      [](const Tokenizer& t) {
        std::vector<uint8_t> b = t.missing_bytes();
        return pyb::bytes(reinterpret_cast<const char*>(b.data()), b.size());
      },
      "The byte values with no single-byte token (encode() drops them).");
  c.def("__repr__", &repr);
}

}  // namespace retort::py
