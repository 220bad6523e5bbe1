// retort.TransformerConfig, retort.Transformer and retort.Trainer: the model and the training step of
// examples/train.cpp, driven from NumPy token arrays.
//
// Threading: every call converts its Python arguments first, then releases the GIL and takes the model's
// mutex for all C++ work (graph building included, since that adds nodes to the model's context). Taking the
// mutex only after the GIL is released means a thread waiting for the model never holds the GIL that the
// thread inside needs to return.
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "common.h"

namespace retort::py {

namespace {

// Token ids (or targets) [B, T] from an integer array-like; a 1-D array is one sequence.
struct IdBatch {
  int64_t B = 0, T = 0;
  std::vector<int64_t> ids;
};

IdBatch id_batch(pyb::handle obj, const char* who, const char* what) {
  pyb::array arr = pyb::array::ensure(obj);
  RT_CHECK(arr, who, ": ", what, " must be an integer array [batch, seq], got ",
           std::string(pyb::str(pyb::type::handle_of(obj).attr("__name__"))));
  const char kind = arr.dtype().kind();
  RT_CHECK(kind == 'i' || kind == 'u', who, ": ", what, " must be an integer array [batch, seq], got dtype ",
           std::string(pyb::str(arr.dtype())));
  RT_CHECK(arr.ndim() == 1 || arr.ndim() == 2, who, ": ", what, " must be [batch, seq] (or [seq]), got ",
           arr.ndim(), " dims");
  IdBatch b;
  b.B = arr.ndim() == 2 ? int64_t(arr.shape(0)) : 1;
  b.T = int64_t(arr.shape(arr.ndim() - 1));
  RT_CHECK(b.B >= 1 && b.T >= 1, who, ": ", what, " is empty: [", b.B, ", ", b.T, "]");
  auto a = pyb::array_t<int64_t, pyb::array::c_style | pyb::array::forcecast>::ensure(arr);
  b.ids.assign(a.data(), a.data() + a.size());
  return b;
}

void check_same_shape(const IdBatch& x, const IdBatch& y, const char* who) {
  RT_CHECK(x.B == y.B && x.T == y.T, who, ": targets [", y.B, ", ", y.T, "] must have the shape of tokens [",
           x.B, ", ", x.T, "]");
}

}  // namespace

// A Transformer whose parameters (and every graph node built for it) live in one PyCtx, so that its
// parameters are ordinary retort Tensors for Python (retort.Graph, optimizers, numpy views).
struct PyModel {
  BackendPtr be;
  std::shared_ptr<PyCtx> ctx;
  std::unique_ptr<Transformer> model;
  std::shared_ptr<const Tokenizer> tokenizer;  // a loaded model's own; null otherwise
  // A loaded retort checkpoint's tokenizer identity (tokenizer, tokenizer.file, ...), kept when it is saved
  // again so that the programs see the same tokenizer.
  std::map<std::string, std::string> tokenizer_identity;
  std::string source;  // PretrainedModel::describe() of a loaded model
  std::mutex mu;
  // generate()'s KV-cached generator, made on first use and remade larger when a call needs it; gen_mu is
  // held for a whole generate(), gen_owner says by which thread (so its own callback cannot wait for it).
  std::unique_ptr<Generator> gen;
  std::mutex gen_mu;
  std::atomic<std::thread::id> gen_owner{};
  bool gen_slide = false;

  // Forward-only graphs, built on first use per batch shape and re-run with new ids.
  struct Eval {
    Tensor* tokens = nullptr;
    Tensor* targets = nullptr;
    Tensor* out = nullptr;  // logits [B*T, V] or the loss
    std::unique_ptr<Graph> graph;
  };
  std::map<std::tuple<int64_t, int64_t>, Eval> logits_graphs;
  std::map<std::tuple<int64_t, int64_t, int64_t>, Eval> loss_graphs;

  // Call with mu held.
  Eval& logits_graph(int64_t B, int64_t T) {
    Eval& e = logits_graphs[{B, T}];
    if (!e.graph) {
      e.tokens = ctx->input(DType::I32, {B, T}, "tokens");
      e.out = model->forward(*ctx, e.tokens);
      e.out->flags |= kOutput;
      e.graph = std::make_unique<Graph>(*ctx);
      e.graph->forward(e.out);
    }
    return e;
  }
  Eval& loss_graph(int64_t B, int64_t T, int64_t ignore_index) {
    Eval& e = loss_graphs[{B, T, ignore_index}];
    if (!e.graph) {
      e.tokens = ctx->input(DType::I32, {B, T}, "tokens");
      e.targets = ctx->input(DType::I32, {B, T}, "targets");
      e.out = lm_loss(*ctx, model->forward(*ctx, e.tokens), e.targets, ignore_index);
      e.out->flags |= kOutput;
      e.graph = std::make_unique<Graph>(*ctx);
      e.graph->forward(e.out);
    }
    return e;
  }
};
using ModelPtr = std::shared_ptr<PyModel>;

namespace {

// Runs g, and waits for a device, so that a fault (a token id out of range) is reported by this call.
void run_graph(PyModel& m, Graph& g) {
  g.compute();
  if (!m.be->backend->is_host()) m.be->backend->synchronize();
}

void check_range(const IdBatch& b, int64_t vocab, const char* who, const char* what, int64_t ignore) {
  for (int64_t id : b.ids)
    RT_CHECK((id >= 0 && id < vocab) || id == ignore, who, ": ", what, " holds id ", id,
             ", outside the vocabulary [0, ", vocab, ")");
}

// examples/train.cpp's step on a model: AdamW (one state per parameter), one training graph per batch shape.
struct PyTrainer {
  ModelPtr m;
  std::unique_ptr<AdamW> opt;
  float lr = 3e-3f, lr_min = 3e-4f, clip = 1.0f;
  int64_t warmup = 0, total = 1, ignore_index = -100;
  double last_loss = NAN, last_grad_norm = NAN;
  float last_lr = NAN;
  struct Train {
    Tensor* tokens = nullptr;
    Tensor* targets = nullptr;
    Tensor* loss = nullptr;
    Tensor* stats = nullptr;  // the optimizer's {loss, norm, clip scale, applied}, read once per step
    std::unique_ptr<Graph> graph;
  };
  std::map<std::tuple<int64_t, int64_t>, Train> graphs;

  double step(const IdBatch& x, const IdBatch& y) {
    Transformer& model = *m->model;
    RT_CHECK(!model.frozen(), "Trainer.step: the model's weights are frozen (Transformer.freeze_weights): its "
             "forward reads 16-bit copies that training would not update");
    RT_CHECK(x.T <= model.config().context, "Trainer.step: tokens [", x.B, ", ", x.T, "] have ", x.T,
             " positions, more than the model's context ", model.config().context);
    Train& t = graphs[{x.B, x.T}];
    if (!t.graph) {
      PyCtx& ctx = *m->ctx;
      t.tokens = ctx.input(DType::I32, {x.B, x.T}, "tokens");
      t.targets = ctx.input(DType::I32, {x.B, x.T}, "targets");
      t.loss = lm_loss(ctx, model.forward(ctx, t.tokens), t.targets, ignore_index);
      t.graph = std::make_unique<Graph>(ctx);
      t.graph->backward(t.loss);
      // The clip, the update and the non-finite check run on the device as the graph's last ops.
      t.stats = opt->append_step(*t.graph, t.loss, clip);
    }
    set_data_int(t.tokens, x.ids);
    set_data_int(t.targets, y.ids);
    const int64_t step = opt->steps() + 1;
    const float rate = cosine_lr(step, warmup, total, lr, lr_min);
    opt->begin_step(rate);
    t.graph->zero_grad();
    t.graph->compute();
    // The step's one wait for the device; it also reports a fault a kernel found (a token id out of range).
    const std::vector<float> s = get_data(t.stats);
    const bool applied = s[kStatOk] != 0.0f;
    opt->end_step(applied);
    const double l = s[kStatLoss];
    last_grad_norm = s[kStatNorm];
    RT_CHECK(std::isfinite(l), "Trainer.step: the loss became ", l, " at step ", step,
             " (try a lower lr or a smaller model)");
    // A finite loss can come with non-finite gradients: the device skipped the update; name the parameter.
    if (!applied) {
      check_finite_gradients(*t.graph, detail::concat("Trainer.step: step ", step, " (loss ", l, ")"));
      RT_FAIL("Trainer.step: the gradient norm became ", last_grad_norm, " at step ", step);
    }
    last_lr = rate;
    last_loss = l;
    return l;
  }
};

std::map<std::string, std::string> str_map(pyb::handle h) {
  std::map<std::string, std::string> out;
  if (h.is_none()) return out;
  for (auto kv : h.cast<pyb::dict>()) out[std::string(pyb::str(kv.first))] = std::string(pyb::str(kv.second));
  return out;
}

// The metadata that makes a Python-saved checkpoint one the programs read: the caller's keys, the tokenizer
// (tok, else the model's own) embedded under its identity ("embedded" when it has no file of its own; "none"
// without one, "bytes" when asked for), and program=python.
std::map<std::string, std::string> checkpoint_meta(const PyModel& p, pyb::handle metadata, pyb::handle tok) {
  std::map<std::string, std::string> md = str_map(metadata);
  for (const auto& [k, v] : md)
    RT_CHECK(k.rfind("tokenizer", 0) != 0, "save: metadata key '", k,
             "' is reserved (pass tokenizer= to embed a tokenizer)");
  std::shared_ptr<const Tokenizer> t = p.tokenizer;
  bool bytes = false;
  if (!tok.is_none()) {
    if (pyb::isinstance<pyb::str>(tok)) {
      RT_CHECK(tok.cast<std::string>() == "bytes",
               "save: tokenizer must be a retort.Tokenizer, 'bytes' or None, got '", tok.cast<std::string>(),
               "'");
      bytes = true;
      t = nullptr;
    } else {
      t = tok.cast<std::shared_ptr<Tokenizer>>();
    }
  }
  const int64_t V = p.model->config().vocab;
  if (bytes) {
    RT_CHECK(V >= 256, "save: tokenizer='bytes' needs a vocabulary of at least 256, the model has ", V);
    md["tokenizer"] = "bytes";
  } else if (t) {
    RT_CHECK(t->vocab_size() <= V, "save: the tokenizer has ", t->vocab_size(),
             " tokens, more than the model's vocabulary of ", V);
    if (tok.is_none() && !p.tokenizer_identity.empty())
      for (const auto& [k, v] : p.tokenizer_identity) md[k] = v;
    else
      md["tokenizer"] = "embedded";
    embed_tokenizer(md, *t);
  } else if (tok.is_none() && !p.tokenizer_identity.empty()) {
    for (const auto& [k, v] : p.tokenizer_identity) md[k] = v;
  } else {
    md["tokenizer"] = "none";
  }
  md.emplace("program", "python");
  return md;
}

// The identity keys of a checkpoint's tokenizer, to keep when a loaded model is saved again.
std::map<std::string, std::string> tokenizer_identity(const Checkpoint& ck) {
  std::map<std::string, std::string> id;
  for (const char* k : {"tokenizer", "tokenizer.file", "tokenizer.vocab", "tokenizer.crc32"})
    if (!ck.meta(k).empty()) id[k] = ck.meta(k);
  return id;
}

// Token ids from None, an int, or an iterable of ints.
std::vector<int32_t> id_list(pyb::handle obj, const char* who, const char* what) {
  std::vector<int32_t> out;
  if (obj.is_none()) return out;
  if (pyb::isinstance<pyb::int_>(obj)) return {obj.cast<int32_t>()};
  for (pyb::handle h : pyb::iter(obj)) {
    RT_CHECK(pyb::isinstance<pyb::int_>(h) || pyb::hasattr(h, "__index__"), who, ": ", what,
             " must hold integer token ids, got ",
             std::string(pyb::str(pyb::type::handle_of(h).attr("__name__"))));
    out.push_back(pyb::int_(pyb::reinterpret_borrow<pyb::object>(h)).cast<int32_t>());
  }
  return out;
}

// Transformer.generate with the GIL released and the model's mutex held, except while on_token runs: the
// callback gets the GIL and may use the model (a change to its weights shows in the tokens after).
std::vector<int32_t> generate(PyModel& p, const std::vector<int32_t>& prompt, int64_t n,
                              const SamplingOptions& so, const std::vector<int32_t>& stop,
                              const pyb::object& on_token, int64_t max_len, bool slide) {
  RT_CHECK(
      p.gen_owner.load() != std::this_thread::get_id(),
      "Transformer.generate: called from its own on_token callback (one generation at a time per model)");
  std::lock_guard<std::mutex> glock(p.gen_mu);
  p.gen_owner = std::this_thread::get_id();
  struct Release {
    PyModel& p;
    ~Release() { p.gen_owner = std::thread::id(); }
  } release{p};
  std::unique_lock<std::mutex> lock(p.mu);
  const int64_t context = p.model->config().context;
  RT_CHECK(max_len >= 0 && max_len <= context, "Transformer.generate: max_len must be in [0, ", context,
           "] (0: as the call needs), got ", max_len);
  // The cache the call needs (a power of two from 64, at most the context), unless max_len fixes it.
  const int64_t need = std::min(context, std::max<int64_t>(1, int64_t(prompt.size()) + n - 1));
  int64_t len = max_len;
  if (len == 0) {
    for (len = 64; len < need; len *= 2) {
    }
    len = std::min(len, context);
  }
  if (!p.gen || (max_len == 0 ? p.gen->max_len() < need : p.gen->max_len() != len) || p.gen_slide != slide) {
    p.gen.reset();
    GeneratorOptions go;
    go.max_len = len;
    go.slide = slide;
    p.gen = std::make_unique<Generator>(*p.ctx, *p.model, go);
    p.gen_slide = slide;
  }
  Generator::OnToken cb;
  if (!on_token.is_none())
    cb = [&](int32_t t) {
      lock.unlock();
      bool more = true;
      {
        pyb::gil_scoped_acquire gil;
        pyb::object r = on_token(t);
        more = r.is_none() || pyb::bool_(r);
      }
      lock.lock();
      return more;
    };
  return p.gen->generate(prompt, n, so, stop, cb);
}

void bind_config(pyb::module_& m) {
  pyb::class_<TransformerConfig> c(
      m, "TransformerConfig",
      "The shape of a Transformer: vocab, context, layers, d_model, heads, kv_heads (0: heads), d_ff (0: "
      "about "
      "8/3 d_model), rope_theta, norm_eps, tie_embeddings, qkv_bias. Every field is a read/write attribute.");
  c.def(
      pyb::init([](int64_t vocab, int64_t context, int64_t layers, int64_t d_model, int64_t heads,
                   int64_t kv_heads, int64_t d_ff, float rope_theta, float norm_eps, bool tie_embeddings,
                   bool qkv_bias) {
        TransformerConfig t;
        t.vocab = vocab, t.context = context, t.layers = layers, t.d_model = d_model, t.heads = heads;
        t.kv_heads = kv_heads, t.d_ff = d_ff, t.rope_theta = rope_theta, t.norm_eps = norm_eps;
        t.tie_embeddings = tie_embeddings, t.qkv_bias = qkv_bias;
        return t;
      }),
      pyb::kw_only(), pyb::arg("vocab") = 256, pyb::arg("context") = 128, pyb::arg("layers") = 4,
      pyb::arg("d_model") = 128, pyb::arg("heads") = 4, pyb::arg("kv_heads") = 0, pyb::arg("d_ff") = 0,
      pyb::arg("rope_theta") = 10000.0f, pyb::arg("norm_eps") = 1e-5f, pyb::arg("tie_embeddings") = true,
      pyb::arg("qkv_bias") = false,
      "A config (keywords only; the defaults are examples/train.cpp's). Checked when a Transformer is made, "
      "or by resolved().");
  c.def_readwrite("vocab", &TransformerConfig::vocab, "Vocabulary size.")
      .def_readwrite("context", &TransformerConfig::context, "Longest sequence forward accepts.")
      .def_readwrite("layers", &TransformerConfig::layers, "Transformer blocks.")
      .def_readwrite("d_model", &TransformerConfig::d_model, "Width of the residual stream.")
      .def_readwrite("heads", &TransformerConfig::heads, "Query heads; d_model / heads must be even.")
      .def_readwrite("kv_heads", &TransformerConfig::kv_heads,
                     "Key/value heads (0: heads); must divide heads.")
      .def_readwrite("d_ff", &TransformerConfig::d_ff,
                     "SwiGLU hidden width (0: 8/3 d_model rounded up to 32).")
      .def_readwrite("rope_theta", &TransformerConfig::rope_theta, "RoPE base.")
      .def_readwrite("norm_eps", &TransformerConfig::norm_eps, "RMSNorm epsilon (inside the square root).")
      .def_readwrite("tie_embeddings", &TransformerConfig::tie_embeddings, "The lm head is the embedding.")
      .def_readwrite("qkv_bias", &TransformerConfig::qkv_bias, "Biases on the q, k, v projections (Qwen2).")
      .def("resolved", &TransformerConfig::resolved,
           "The config with the 0 defaults filled in; raises retort.Error (ValueError) naming a bad field.")
      .def_property_readonly("head_dim", &TransformerConfig::head_dim, "d_model / heads.")
      .def("describe", &TransformerConfig::describe, "One line: 'layers=4 d_model=128 heads=4 ...'.")
      .def("__repr__",
           [](const TransformerConfig& t) { return "retort.TransformerConfig(" + t.describe() + ")"; });
}

void bind_transformer(pyb::module_& m) {
  pyb::class_<PyModel, ModelPtr>(
      m, "Transformer",
      "A Llama-style decoder (RMSNorm, RoPE, causal grouped-query attention, SwiGLU, optionally tied head), "
      "f32 parameters on one backend. logits() and loss() run cached forward graphs; forward() adds the "
      "model to a graph of your own; Trainer trains it.")
      .def(
          pyb::init([](const TransformerConfig& config, uint64_t seed, pyb::handle backend) {
            auto pm = std::make_shared<PyModel>();
            pm->be = parse_backend(backend);
            if (!pm->be) pm->be = cpu_backend(0);
            pm->ctx = std::make_shared<PyCtx>(pm->be);
            pyb::gil_scoped_release nogil;
            pm->model = std::make_unique<Transformer>(*pm->ctx, config, seed);
            return pm;
          }),
          pyb::arg("config"), pyb::arg("seed") = 0, pyb::arg("backend") = pyb::none(),
          "A model with examples/train.cpp's seeded init (N(0, 0.02) weights, residual projections scaled by "
          "1/sqrt(2 layers), norm weights 1) on backend (default: the CPU). Raises retort.Error on a bad "
          "config.")
      .def_property_readonly(
          "config", [](const PyModel& p) { return p.model->config(); }, "The resolved config (a copy).")
      .def_property_readonly(
          "backend", [](const PyModel& p) { return p.be; }, "The backend holding the parameters.")
      .def_property_readonly(
          "parameter_count", [](const PyModel& p) { return p.model->parameter_count(); },
          "The number of parameter elements.")
      .def_property_readonly(
          "parameters",
          [](const PyModel& p) {
            std::vector<TensorRef> out;
            for (Tensor* t : p.model->parameters()) out.push_back(make_ref(t, int(t->shape().size())));
            return out;
          },
          "Every parameter as a retort.Tensor, in a fixed order (embedding, blocks, final norm, untied "
          "head).")
      .def(
          "freeze_weights",
          [](PyModel& p) {
            RT_CHECK(p.gen_owner.load() != std::this_thread::get_id(),
                     "Transformer.freeze_weights: called from generate()'s on_token callback");
            pyb::gil_scoped_release nogil;
            std::lock_guard<std::mutex> gen_lock(p.gen_mu);
            std::lock_guard<std::mutex> lock(p.mu);
            p.model->freeze_weights();
            // Graphs built before read the f32 weights through casts: rebuilt on next use.
            p.logits_graphs.clear();
            p.loss_graphs.clear();
            p.gen.reset();
          },
          "For a model that only runs forward (a teacher) with a 16-bit compute dtype: keeps its matmul weights "
          "in that dtype, made now (no cast per run), and adds the out and down projections into the residual "
          "stream in their GEMMs. Later changes to the parameters are not seen, and a frozen model cannot be "
          "trained (Trainer.step raises). Nothing to do in f32.")
      .def_property_readonly(
          "frozen", [](const PyModel& p) { return p.model->frozen(); },
          "Whether freeze_weights() was called (with a 16-bit compute dtype).")
      .def(
          "state_dict",
          [](const PyModel& p, bool copy) {
            pyb::dict d;
            for (Tensor* t : p.model->parameters())
              d[pyb::str(t->name)] = to_numpy(make_ref(t, int(t->shape().size())), copy);
            return d;
          },
          pyb::arg("copy") = false,
          "{name: NumPy array} of every parameter. On the CPU (copy=False) the arrays are views: writing "
          "them "
          "changes the model, and they see every update. On a GPU they are copies.")
      .def(
          "forward",
          [](PyModel& p, pyb::handle tokens) {
            TensorRef tok = to_tensor(tokens, p.be, DType::I32, "tokens");
            Tensor* out = nullptr;
            {
              pyb::gil_scoped_release nogil;
              std::lock_guard<std::mutex> lock(p.mu);
              p.ctx->depend_on(tok.ctx);
              out = p.model->forward(*p.ctx, tok.t);
            }
            return make_ref(out, 2);
          },
          pyb::arg("tokens"),
          "The logits node [B*T, vocab] for tokens [B, T] (an integer array, copied to i32): nothing runs "
          "until a retort.Graph computes it, so it can feed losses of your own.")
      .def(
          "logits",
          [](PyModel& p, pyb::handle tokens) {
            const IdBatch x = id_batch(tokens, "Transformer.logits", "tokens");
            const int64_t V = p.model->config().vocab;
            std::vector<float> out;
            {
              pyb::gil_scoped_release nogil;
              std::lock_guard<std::mutex> lock(p.mu);
              check_range(x, V, "Transformer.logits", "tokens", -1);
              RT_CHECK(x.T <= p.model->config().context, "Transformer.logits: tokens [", x.B, ", ", x.T,
                       "] have more positions than the model's context ", p.model->config().context);
              PyModel::Eval& e = p.logits_graph(x.B, x.T);
              set_data_int(e.tokens, x.ids);
              run_graph(p, *e.graph);
              out = get_data(e.out);
            }
            pyb::array_t<float> a({x.B, x.T, V});
            std::memcpy(a.mutable_data(), out.data(), out.size() * sizeof(float));
            return a;
          },
          pyb::arg("tokens"),
          "Runs the model: float32 logits [B, T, vocab] for integer tokens [B, T] ([T] is one sequence); "
          "logits[b, t] predicts the token after position t. The GIL is released meanwhile.")
      .def(
          "loss",
          [](PyModel& p, pyb::handle tokens, pyb::handle targets, int64_t ignore_index) {
            const IdBatch x = id_batch(tokens, "Transformer.loss", "tokens");
            const IdBatch y = id_batch(targets, "Transformer.loss", "targets");
            check_same_shape(x, y, "Transformer.loss");
            pyb::gil_scoped_release nogil;
            std::lock_guard<std::mutex> lock(p.mu);
            const int64_t V = p.model->config().vocab;
            check_range(x, V, "Transformer.loss", "tokens", -1);
            check_range(y, V, "Transformer.loss", "targets", ignore_index);
            RT_CHECK(x.T <= p.model->config().context, "Transformer.loss: tokens [", x.B, ", ", x.T,
                     "] have more positions than the model's context ", p.model->config().context);
            PyModel::Eval& e = p.loss_graph(x.B, x.T, ignore_index);
            set_data_int(e.tokens, x.ids);
            set_data_int(e.targets, y.ids);
            run_graph(p, *e.graph);
            return double(get_data(e.out)[0]);
          },
          pyb::arg("tokens"), pyb::arg("targets"), pyb::arg("ignore_index") = -100,
          "Mean next-token cross-entropy (nats) of the model on tokens [B, T] against targets [B, T]; "
          "targets "
          "equal to ignore_index do not count. The GIL is released meanwhile.")
      .def(
          "generate",
          [](PyModel& p, pyb::handle prompt, int64_t max_new_tokens, float temperature, int64_t top_k,
             float top_p, uint64_t seed, pyb::handle stop, pyb::object on_token, int64_t max_len,
             bool slide) {
            RT_CHECK(!pyb::hasattr(prompt, "__len__") || pyb::len(prompt) > 0,
                     "Transformer.generate: prompt_ids is empty (give at least one token, e.g. BOS)");
            const IdBatch x = id_batch(prompt, "Transformer.generate", "prompt_ids");
            RT_CHECK(x.B == 1, "Transformer.generate: prompt_ids must be one sequence [seq], got [", x.B,
                     ", ", x.T, "]");
            const std::vector<int32_t> ids(x.ids.begin(), x.ids.end());
            check_range(x, p.model->config().vocab, "Transformer.generate", "prompt_ids", -1);
            const std::vector<int32_t> stops = id_list(stop, "Transformer.generate", "stop");
            RT_CHECK(on_token.is_none() || PyCallable_Check(on_token.ptr()),
                     "Transformer.generate: on_token must be callable or None");
            SamplingOptions so;
            so.temperature = temperature, so.top_k = top_k, so.top_p = top_p, so.seed = seed;
            so.check();
            std::vector<int32_t> out;
            {
              pyb::gil_scoped_release nogil;
              out = generate(p, ids, max_new_tokens, so, stops, on_token, max_len, slide);
            }
            return out;
          },
          pyb::arg("prompt_ids"), pyb::arg("max_new_tokens"), pyb::kw_only(), pyb::arg("temperature") = 1.0f,
          pyb::arg("top_k") = 0, pyb::arg("top_p") = 1.0f, pyb::arg("seed") = 0,
          pyb::arg("stop") = pyb::none(), pyb::arg("on_token") = pyb::none(), pyb::arg("max_len") = 0,
          pyb::arg("slide") = false,
          "Continues prompt_ids (integer ids, at least one) by up to max_new_tokens tokens and returns them "
          "as a "
          "list. Each token is drawn from softmax(logits / temperature) cut to the top_k most likely (0: no "
          "cut), "
          "then to the smallest set whose probability reaches top_p (1: no cut); temperature 0 takes the "
          "argmax. "
          "seed fixes the draws. A token in stop (an id or ids, e.g. EOS) ends the list after it. "
          "on_token(id) is "
          "called with each token as it comes (the GIL held; returning False stops). Keys and values are "
          "cached "
          "(a cache of max_len positions, 0: as the call needs); past the model's context it raises, unless "
          "slide=True goes on from the newest context / 2 tokens. The GIL is released meanwhile.")
      .def(
          "save",
          [](PyModel& p, const std::string& path, pyb::handle metadata, pyb::handle tokenizer) {
            const auto meta = checkpoint_meta(p, metadata, tokenizer);
            pyb::gil_scoped_release nogil;
            std::lock_guard<std::mutex> lock(p.mu);
            save_checkpoint(path, *p.model, nullptr, TrainState{}, meta);
          },
          pyb::arg("path"), pyb::arg("metadata") = pyb::none(), pyb::kw_only(),
          pyb::arg("tokenizer") = pyb::none(),
          "Writes the model as a retort checkpoint (atomically): the programs' format (eval, generate, "
          "teacher-cache, distill read it; retort.load_model opens it without being told the config). It "
          "holds "
          "the parameters, the config, the string metadata given, and the tokenizer: tokenizer= (a "
          "retort.Tokenizer, or 'bytes' for a byte-level model), else the model's own (.tokenizer).")
      .def(
          "export",
          [](PyModel& p, const std::string& path, const std::string& format, pyb::handle dtype,
             pyb::handle tokenizer, const std::string& name) {
            RT_CHECK(format == "gguf" || format == "hf", "export: format must be 'gguf' or 'hf', got '",
                     format, "'");
            std::string d = dtype.is_none() ? (format == "gguf" ? "f16" : "f32") : dtype.cast<std::string>();
            ExportOptions eo;
            eo.name = name;
            if (d == "f32") {
              eo.dtype = QuantType::F32;
            } else if (d == "f16") {
              eo.dtype = QuantType::F16;
            } else if (d == "bf16") {
              eo.dtype = QuantType::BF16;
            } else {
              RT_CHECK(d == "q8_0", "export: dtype must be 'f32', 'f16', 'bf16' or 'q8_0', got '", d, "'");
              eo.dtype = QuantType::Q8_0;
            }
            std::shared_ptr<const Tokenizer> t = p.tokenizer;
            if (!tokenizer.is_none()) {
              if (pyb::isinstance<pyb::str>(tokenizer)) {
                RT_CHECK(tokenizer.cast<std::string>() == "bytes",
                         "export: tokenizer must be a retort.Tokenizer, 'bytes' or None, got '",
                         tokenizer.cast<std::string>(), "'");
                t = nullptr;
              } else {
                t = tokenizer.cast<std::shared_ptr<Tokenizer>>();
              }
            }
            pyb::gil_scoped_release nogil;
            std::lock_guard<std::mutex> lock(p.mu);
            if (format == "gguf")
              export_gguf(*p.model, t.get(), path, eo);
            else
              export_hf(*p.model, t.get(), path, eo);
          },
          pyb::arg("path"), pyb::kw_only(), pyb::arg("format") = "gguf", pyb::arg("dtype") = pyb::none(),
          pyb::arg("tokenizer") = pyb::none(), pyb::arg("name") = "retort student",
          "Writes the model for other programs: format='gguf', a GGUF file llama.cpp runs (dtype 'f16' by "
          "default, 'bf16', 'f32' or 'q8_0' for the matrices; norms stay f32), or format='hf', a Hugging "
          "Face "
          "directory (config.json, model.safetensors, tokenizer.json, tokenizer_config.json, "
          "generation_config.json; dtype 'f32' by default, 'f16' or 'bf16'). The tokenizer is tokenizer= (a "
          "retort.Tokenizer, or 'bytes': the 256 bytes as tokens), else the model's own, else bytes. Raises "
          "retort.Error, leaving nothing at path, for what the format cannot hold (q8_0 rows that are not "
          "whole blocks of 32, two tokens with one spelling, ...) or a place that cannot be written.")
      .def(
          "load",
          [](PyModel& p, const std::string& path) {
            pyb::gil_scoped_release nogil;
            std::lock_guard<std::mutex> lock(p.mu);
            const Checkpoint ck(path);
            ck.load_model(*p.model);  // checks the config first: a refused file changes nothing
            if (ck.tokenizer()) p.tokenizer = ck.tokenizer();
            p.tokenizer_identity = tokenizer_identity(ck);
          },
          pyb::arg("path"),
          "Reads the parameters (and the tokenizer it embeds) from a retort checkpoint written by save(), "
          "Trainer.save() or the programs. Raises retort.Error naming the file and the fault (not a retort "
          "checkpoint, corrupt, a model of another config) before changing anything.")
      .def_property_readonly(
          "tokenizer", [](const PyModel& p) { return std::const_pointer_cast<Tokenizer>(p.tokenizer); },
          "A loaded model's own retort.Tokenizer: a GGUF file's or Hugging Face directory's, or the one a "
          "retort "
          "checkpoint embeds (None for a model made here or a byte-level checkpoint).")
      .def_property_readonly(
          "source", [](const PyModel& p) { return p.source; },
          "What a loaded model was read from (format, architecture, name, weight types); '' otherwise.")
      .def("__repr__", [](const PyModel& p) {
        return "retort.Transformer(" + p.model->config().describe() + ", " +
               std::to_string(p.model->parameter_count()) + " parameters, " + p.be->name() + ")";
      });
}

void bind_trainer(pyb::module_& m) {
  pyb::class_<PyTrainer>(
      m, "Trainer",
      "examples/train.cpp's training step for a Transformer: forward and backward on a batch, clip the "
      "global "
      "gradient norm, a learning rate from cosine_lr (linear warmup, cosine decay to lr_min at total_steps), "
      "AdamW with decoupled weight decay on every parameter.")
      .def(
          pyb::init([](ModelPtr model, int64_t total_steps, float lr, pyb::handle lr_min, int64_t warmup,
                       float weight_decay, float beta1, float beta2, float eps, float clip,
                       int64_t ignore_index) {
            RT_CHECK(model != nullptr, "Trainer: model is None");
            auto t = std::make_unique<PyTrainer>();
            t->m = model;
            t->lr = lr;
            t->lr_min = lr_min.is_none() ? lr / 10 : lr_min.cast<float>();
            t->warmup = warmup;
            t->total = total_steps;
            t->clip = clip;
            t->ignore_index = ignore_index;
            RT_CHECK(std::isfinite(clip) && clip >= 0, "Trainer: clip = ", clip,
                     " must be >= 0 (0 turns clipping off)");
            cosine_lr(0, t->warmup, t->total, t->lr, t->lr_min);  // checks the schedule's arguments
            pyb::gil_scoped_release nogil;
            std::lock_guard<std::mutex> lock(model->mu);
            t->opt = std::make_unique<AdamW>(model->model->parameters(),
                                             AdamWConfig{lr, beta1, beta2, eps, weight_decay});
            return t;
          }),
          pyb::arg("model"), pyb::kw_only(), pyb::arg("total_steps"), pyb::arg("lr") = 3e-3f,
          pyb::arg("lr_min") = pyb::none(), pyb::arg("warmup") = 0, pyb::arg("weight_decay") = 0.1f,
          pyb::arg("beta1") = 0.9f, pyb::arg("beta2") = 0.95f, pyb::arg("eps") = 1e-8f,
          pyb::arg("clip") = 1.0f, pyb::arg("ignore_index") = -100,
          "A trainer for total_steps steps (the schedule's length; more steps keep lr_min). lr_min defaults "
          "to lr / 10; clip 0 turns clipping off. The defaults are examples/train.cpp's. Raises retort.Error "
          "(ValueError) on a bad option.")
      .def(
          "step",
          [](PyTrainer& t, pyb::handle tokens, pyb::handle targets) {
            const IdBatch x = id_batch(tokens, "Trainer.step", "tokens");
            const IdBatch y = id_batch(targets, "Trainer.step", "targets");
            check_same_shape(x, y, "Trainer.step");
            pyb::gil_scoped_release nogil;
            std::lock_guard<std::mutex> lock(t.m->mu);
            const int64_t V = t.m->model->config().vocab;
            check_range(x, V, "Trainer.step", "tokens", -1);
            check_range(y, V, "Trainer.step", "targets", t.ignore_index);
            return t.step(x, y);
          },
          pyb::arg("tokens"), pyb::arg("targets"),
          "One step on tokens [B, T] and next-token targets [B, T] (integer arrays); returns the loss before "
          "the update. Raises retort.Error when the loss is not finite (nothing is updated then). The GIL is "
          "released meanwhile.")
      .def_property_readonly(
          "steps", [](const PyTrainer& t) { return t.opt->steps(); }, "Steps taken so far.")
      .def_property_readonly(
          "last_loss", [](const PyTrainer& t) { return t.last_loss; },
          "The loss of the last step (NaN before).")
      .def_property_readonly(
          "last_lr", [](const PyTrainer& t) { return t.last_lr; }, "The learning rate of the last step.")
      .def_property_readonly(
          "last_grad_norm", [](const PyTrainer& t) { return t.last_grad_norm; },
          "The global gradient norm of the last step, before clipping; a non-finite one stops the step.")
      .def_property_readonly(
          "model", [](const PyTrainer& t) { return t.m; }, "The model being trained.")
      .def(
          "save",
          [](PyTrainer& t, const std::string& path, pyb::handle metadata, pyb::handle tokenizer) {
            auto meta = checkpoint_meta(*t.m, metadata, tokenizer);
            meta["train.lr"] = std::to_string(t.lr);
            meta["train.warmup"] = std::to_string(t.warmup);
            meta["train.clip"] = std::to_string(t.clip);
            pyb::gil_scoped_release nogil;
            std::lock_guard<std::mutex> lock(t.m->mu);
            TrainState st;
            st.total_steps = t.total;
            save_checkpoint(path, *t.m->model, t.opt.get(), st, meta);
          },
          pyb::arg("path"), pyb::arg("metadata") = pyb::none(), pyb::kw_only(),
          pyb::arg("tokenizer") = pyb::none(),
          "A retort checkpoint of the run (the programs' format): Transformer.save()'s contents plus AdamW's "
          "moments and the step count, so that load() resumes where it stopped.")
      .def(
          "load",
          [](PyTrainer& t, const std::string& path) {
            pyb::gil_scoped_release nogil;
            std::lock_guard<std::mutex> lock(t.m->mu);
            const Checkpoint ck(path);
            RT_CHECK(ck.has_optimizer(), path,
                     ": holds no optimizer state (written by Transformer.save, not "
                     "Trainer.save): load it with Transformer.load");
            ck.load_model(*t.m->model);
            ck.load_optimizer(*t.opt, *t.m->model);
            if (ck.tokenizer()) t.m->tokenizer = ck.tokenizer();
          },
          pyb::arg("path"),
          "Restores a checkpoint written by save() (or by the programs train and distill): parameters, "
          "moments and step count, so that training resumes where it stopped.");
}

}  // namespace

void bind_pretrained(pyb::module_& m) {
  m.def(
      "load_model",
      [](const std::string& path, pyb::handle backend, pyb::handle compute_dtype) {
        auto pm = std::make_shared<PyModel>();
        pm->be = parse_backend(backend);
        if (!pm->be) pm->be = cpu_backend(0);
        const DType cd =
            compute_dtype.is_none() ? default_compute_dtype(*pm->be->backend) : parse_dtype(compute_dtype);
        pm->ctx = std::make_shared<PyCtx>(pm->be);
        pyb::gil_scoped_release nogil;
        const PretrainedModel src = PretrainedModel::open(path);
        TransformerConfig c = src.config();
        c.compute_dtype = cd;
        pm->model = std::make_unique<Transformer>(*pm->ctx, c, 0, false);
        src.load_into(*pm->model);
        pm->tokenizer = src.tokenizer();
        if (const Checkpoint* ck = src.checkpoint()) pm->tokenizer_identity = tokenizer_identity(*ck);
        pm->source = src.describe();
        return pm;
      },
      pyb::arg("path"), pyb::kw_only(), pyb::arg("backend") = pyb::none(),
      pyb::arg("compute_dtype") = pyb::none(),
      "A pretrained model as a retort.Transformer: a GGUF file (llama / qwen2; F32, F16, BF16, Q8_0, Q4_0/1, "
      "Q5_0/1, Q4_K, Q5_K, Q6_K weights dequantized to f32), a Hugging Face directory (config.json, "
      "model.safetensors or its shards, tokenizer.json) or a retort checkpoint (written by the programs or "
      "by "
      "Transformer.save / Trainer.save: the config comes from the file). Its .tokenizer is the file's "
      "tokenizer (a checkpoint's embedded one; None for a byte-level model). compute_dtype: the matmuls' "
      "dtype (default bf16 on a GPU, "
      "f32 "
      "on the CPU). Raises retort.Error naming the file and the fault.");
}

void bind_model(pyb::module_& m) {
  bind_config(m);
  bind_transformer(m);
  bind_trainer(m);
  bind_pretrained(m);
}

}  // namespace retort::py
