// The chunked lm-head + loss scheduler behind the fused linear losses (fused_linear.h), shared by the CPU and
// CUDA backends. It owns the loop — chunk size from a memory budget, per chunk the logits GEMM(s), the row
// loss with its gradient written in place, the gradient GEMMs — and talks to a backend only through the
// ChunkExecutor interface below, so that the [N, V] logits never exist whole on any backend.
//
// Rules the scheduler keeps so that a device backend can run it unchanged:
//   - It never reads or writes executor memory itself: every pointer it holds (inputs, outputs, scratch) is
//     only passed back to the executor, offset by whole rows. A device pointer is never dereferenced on the
//     host.
//   - The one value it needs from the data, the number of rows that count (the mean's divisor, hence the
//     gradient's scale), comes from ChunkExecutor::validate, called once before the loop; nothing in the
//     loop waits for the device. An executor may even keep that count on the device (kCountOnDevice) and
//     apply the mean's 1/count itself, so that nothing waits at all.
//   - Scratch is requested once, before the loop, and reused by every chunk: work on one chunk must finish
//     (in stream order) before the next chunk's GEMM overwrites it, which in-order execution gives for free.
//
// Per chunk of C rows (hidden_c [C, H], W [V, H]):
//   logits_c = hidden_c · Wᵀ (+ bias)              GEMM into scratch [C, Vp], Vp = V rounded up to 128 (f32,
//                                                   or 16-bit: FusedLinearProblem::logits_dtype)
//   teacher_c = t_hidden_c · t_Wᵀ (+ t_bias)        only for distillation against an online teacher
//   row loss → per-row outputs, and d(loss)/d(logits) written over logits_c, already scaled
//   dhidden_c = dlogits · W                         GEMM into the dhidden output
//   dW (+)= dlogitsᵀ · hidden_c                     GEMM, f32 accumulator (overwritten by the first chunk)
//   dbias (+)= column sums of dlogits
// The K-sparse top-K path (normalize_topk, no hard loss, no full-vocabulary LSE asked for) replaces the three
// GEMMs with K dot products per row and K-sparse gradient updates.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "../../core/error.h"
#include "fused_linear.h"
#include "losses.h"
#include "row_kernels.h"
#include "row_loss.h"

namespace retort {
class ThreadPool;
struct Tensor;
}  // namespace retort

namespace retort::loss {

// Logit rows in scratch are padded to a multiple of this many entries (alignment of every row; the GEMMs
// still compute exactly V columns).
inline constexpr int64_t kVocabPad = 128;
// Chunk rows from the memory budget are rounded to a multiple of this when the budget allows (GEMM tiles).
inline constexpr int64_t kRowAlign = 128;

// Where the K-sparse top-K path's gradients go (ChunkExecutor::scatter_grads): f32 dhidden [rows, H],
// dweight [V, H], dbias [1, V]; an empty block is not wanted. accumulate_*: add into it; otherwise overwrite.
struct SparseGrads {
  Block dhidden, dweight, dbias;
  bool accumulate_dhidden = false, accumulate_dweight = false, accumulate_dbias = false;
};

// A dense chunk handed whole to an executor that can run it without the logits' round trip through memory
// (ChunkExecutor::softmax_chunk).
struct SoftmaxChunk {
  Block hidden;            // [c, H]: the chunk's rows
  Block weight;            // [Vg, H]: W as the GEMMs see it (zero-padded to Vp rows when the plan pads)
  int64_t v = 0;           // the real vocabulary (Vg ≥ v)
  void* logits = nullptr;  // the chunk's logits scratch, at least c·vp·2 bytes, 256-byte aligned
  int64_t vp = 0;          // its row length in elements
  DType logits_dtype = DType::F32;  // the plan's logits dtype: 16-bit allows 16-bit precision for z
  LossSpec spec;                    // cut to the chunk
  RowOut out;                       // loss, lse, hard, soft and grad_scale (out.grad is not used)
  bool grad = false;                // the gradients below are wanted (any of them)
  Block row_upstream;               // [c, 1] per-row upstream gradient, or empty
  Block dhidden;                    // [c, H] f32, or empty
  bool accumulate_dhidden = false;
  Block dweight;  // [V, H] f32, or empty
  bool accumulate_dweight = false;
};

// A K-sparse top-K chunk handed whole to an executor (FastPath::Kind::SparseChunk): gather_logits, the
// gathered row loss (loss, soft part and LSE into out, its gradient into g) and the dhidden half of
// scatter_grads in one pass.
struct SparseChunk {
  Block hidden, weight, bias;  // the chunk's rows, W [V, H], bias [1, V] or empty
  TopKSide side;               // cut to the chunk
  Block g;                     // f32 [rows, K]: d loss / d gathered logit
  RowOut out;
  Block dhidden;  // [rows, H] f32
  bool accumulate_dhidden = false;
};

// Work an executor may take whole instead of the scheduler's generic steps (ChunkExecutor::fast_path).
struct FastPath {
  enum class Kind {
    DenseWhole,   // a question, asked once before planning: would every DenseChunk of this problem be taken?
                  // dense holds all N rows, W as the caller gave it (unpadded) and no logits pointer. A yes
                  // lets the scheduler skip the zero-padded W copy, which such a path does not need.
    DenseChunk,   // a dense chunk (logits GEMM, row loss, gradient GEMMs) without the logits' round trip
                  // through memory, for a loss whose logits gradient is a scaled softmax plus one entry per
                  // row
    SparseChunk,  // a K-sparse top-K chunk in one pass (sparse)
  };
  Kind kind = Kind::DenseChunk;
  SoftmaxChunk dense;  // DenseWhole, DenseChunk
  SparseChunk sparse;  // SparseChunk
};

// What an executor can do, asked once per problem (ChunkExecutor::caps).
struct ExecutorCaps {
  // The automatic memory budget (FusedLinearOptions::logits_budget 0): fused_linear_auto_budget of the
  // memory free, read at the backend's first fused call so that every step of a run chunks alike.
  size_t auto_budget = kFusedLinearAutoMin;
  // The logits GEMMs should run over the padded vocabulary Vp (a multiple of kVocabPad): the scheduler then
  // copies W (and an online teacher's W) into zero-padded [Vp, H] scratch with copy(), so that the logits
  // GEMM's N and the dhidden GEMM's K are multiples of 128 (a GPU's tensor-core kernels need aligned
  // extents: at V = 50,257 cuBLASLt otherwise falls back to 1-element-aligned kernels, several times
  // slower). The pad columns of the logits are then h·0 = 0, and the pad rows of W are 0, so they add
  // nothing.
  bool pads_vocab = false;
  // Bytes the executor keeps per student logit of a chunk beside the scheduler's scratch while a gradient is
  // computed (the CUDA executor's 16-bit copy of the logits gradient): counted in the memory budget when the
  // logits are f32 (a 16-bit logits block takes its gradient in place: no copy).
  size_t shadow_bytes_per_logit = 0;
  // The logits may be kept in 16 bits (BF16 or F16, FusedLinearProblem::logits_dtype) when both operands of
  // every logits GEMM are of that dtype: gemm() then writes that c (beta 0) and add_bias, scale_rows,
  // column_sums and row_loss read it.
  bool logits16 = false;
};

// What a backend provides. All Blocks and pointers address executor memory (host memory on the CPU, device
// memory on a GPU); calls are issued in order and may run asynchronously on a device, except validate().
// f32 blocks the scheduler allocates are row-major with a unit column stride; input blocks keep the
// caller's strides (an executor that cannot read a layout throws retort::Error naming it).
class ChunkExecutor {
 public:
  virtual ~ChunkExecutor() = default;

  // validate() may return this instead of the count: see there.
  static constexpr int64_t kCountOnDevice = -1;

  // Checks the side data of all `rows` rows (labels and ids in [0, v)) and returns the number of rows that
  // count (label != ignore_index; all rows for losses without labels). Throws retort::Error naming `what`
  // before anything is computed. The only call that may wait for the device. `reduction` is how the
  // per-row losses are reduced (None for selective log-softmax): under Mean the scheduler scales every
  // gradient (RowOut::grad_scale) and every reduce() by 1/count. An executor that would rather not wait may
  // return kCountOnDevice instead: the scheduler then leaves 1/count out of those scales, and the executor
  // multiplies it in itself, from device memory, in row_loss() and reduce() under Mean (and reports bad side
  // data when it can, at the latest when the results are read).
  virtual int64_t validate(const LossSpec& spec, int64_t rows, int64_t v, Reduction reduction,
                           const std::string& what) = 0;

  // At least `bytes` of uninitialized memory, aligned to 256 bytes, valid until the executor is destroyed.
  virtual void* scratch(size_t bytes) = 0;

  // c = alpha · op(a) · op(b) + beta · c, op(x) = x or xᵀ (trans): op(a) is [m, k], op(b) [k, n], c an
  // [m, n] block with a unit column stride. a and b may be f32, bf16 or f16; products accumulate in f32.
  // beta is 0 (c is not read, NaN there does not leak) or 1. c is f32, or 16-bit with beta = 0 (16-bit
  // logits: the f32 result rounded once; only asked for when supports_16bit_logits() said yes).
  virtual void gemm(const Block& a, bool trans_a, const Block& b, bool trans_b, const Block& c, float alpha,
                    float beta) = 0;
  // c[r, j] += bias[0, j]: c [rows, V] f32 or the 16-bit logits block (the sum in f32, rounded once),
  // bias [1, V] of any float dtype.
  virtual void add_bias(const Block& c, const Block& bias) = 0;
  // dbias[0, j] = (accumulate ? dbias[0, j] : 0) + Σ_r g[r, j]: g [rows, V] f32 or 16-bit (the logits
  // block), dbias f32 [1, V]. Rows are
  // summed in order (the result does not depend on how the work is split).
  virtual void column_sums(const Block& g, const Block& dbias, bool accumulate) = 0;
  // g[r, :] *= u[r, 0]: g [rows, V] f32 or 16-bit (the logits block), u [rows, 1] of any float dtype (a
  // per-row upstream gradient).
  virtual void scale_rows(const Block& g, const Block& u) = 0;
  // Every element of the block b = 0 (f32; a backend may accept 16-bit blocks too).
  virtual void zero(const Block& b) = 0;
  // The row loss spec.kind on one chunk, by the contract of row_kernels.h: logits [rows, V] (spec already
  // cut to the same rows), f32 or 16-bit (then read into f32 math; an online teacher's block has the same
  // dtype), per-row outputs into out, the gradient scaled by out.grad_scale over the logits when out.grad is
  // set (it is the logits block itself, so a 16-bit block gets a 16-bit gradient in place).
  virtual void row_loss(const LossSpec& spec, const Block& logits, const RowOut& out) = 0;
  // out[0] = scale · Σ_{r < n} v[r], summed in a fixed order.
  virtual void reduce(const float* v, int64_t n, float scale, float* out) = 0;

  // What this executor can do (see ExecutorCaps), asked once per problem.
  virtual ExecutorCaps caps() const { return {}; }
  // Told once per problem, before its first gemm(): dt is 16-bit when the problem accepts 16-bit logits of
  // that dtype (FusedLinearProblem::logits_dtype, on a path that could keep them) but its plan keeps them
  // f32; the executor may then give the gradient GEMMs the f32 logits gradient rounded to dt, the precision
  // 16-bit logits would have had. F32 otherwise: an exact f32 gradient. Default: ignored.
  virtual void gradient_may_round_to(DType dt) { (void)dt; }
  // dst = src, element for element (same dtype, [rows, cols]); dst is row-major. Only called when
  // caps().pads_vocab.
  virtual void copy(const Block& src, const Block& dst) {
    (void)src;
    (void)dst;
    RT_FAIL("ChunkExecutor::copy is not implemented by this executor");
  }

  // K-sparse top-K. out f32 [rows, K]: out[r, k] = hidden[r, :] · w[id_rk, :] (+ bias[0, id_rk]) for the
  // valid slots of side (mask != 0 and logprob != −inf), 0 for the others (whose ids are never read).
  virtual void gather_logits(const Block& hidden, const Block& w, const Block& bias, const TopKSide& side,
                             const Block& out) = 0;
  // From g f32 [rows, K] (d loss / d gathered logit; 0 on padding slots), over the valid slots of side:
  // dhidden[r, :] (+)= Σ_k g[r, k]·w[id_rk, :]; dw[id, :] (+)= Σ g[r, k]·hidden[r, :] and dbias[0, id] (+)=
  // Σ g[r, k], added per id in row order, so the result is deterministic and does not depend on the
  // chunking. Without accumulate_*, every element of that gradient is written (0 where no slot points).
  virtual void scatter_grads(const Block& g, const Block& hidden, const Block& w, const TopKSide& side,
                             const SparseGrads& out) = 0;
  // Optional: runs job (or, for Kind::DenseWhole, answers for it) on a faster path than the generic steps
  // and returns true; returns false, having done nothing, when the executor has none for it. The CUDA
  // executor's are the softmax epilogue on sm_90a (src/cuda/loss/softmax_chunk.h: cross-entropy without
  // label smoothing or softcap, top-K forward KL at T = 1, bf16 operands, no bias), offered every dense
  // cross-entropy and top-K chunk without bias, and the one-pass K-sparse forward KL.
  virtual bool fast_path(const FastPath& job) {
    (void)job;
    return false;
  }
};

// The CPU executor (cpu_chunk_exec.cpp): the packed CPU GEMM and the CPU row kernels, on pool's threads.
std::unique_ptr<ChunkExecutor> make_cpu_chunk_executor(ThreadPool& pool);

// One fused linear loss problem: inputs, options, and where the results go. Null pointers and empty blocks
// are outputs not wanted. Any gradient wanted puts the scheduler in gradient mode: the row loss writes the
// logits gradient and the gradient GEMMs run.
struct FusedLinearProblem {
  LossSpec spec;  // side data of all N rows
  Block hidden;   // [N, H]
  Block weight;   // [V, H]
  Block bias;     // [1, V] or empty
  // Distillation against an online teacher: [N, Ht], [V, Ht], [1, V] (or empty); empty teacher_weight: the
  // teacher logits are spec.distill.teacher.
  Block teacher_hidden, teacher_weight, teacher_bias;
  Reduction reduction = Reduction::Mean;

  // Outputs. loss: [1] (Mean, Sum) or [N] (None: the per-row losses; per_row is then not written). per_row,
  // lse: [N]. hard, soft: like loss. Selective log-softmax writes spec.selective.values and lse instead.
  float* loss = nullptr;
  float* per_row = nullptr;
  float* lse = nullptr;
  float* hard = nullptr;
  float* soft = nullptr;

  // Gradients, f32: dhidden [N, H], dweight [V, H], dbias [1, V]. Each gradient is d(loss)/d(input) times
  // grad_scale, and per row times row_upstream [N, 1] when that is given (the backward of a Reduction::None
  // loss, whose upstream gradient is one value per row). Selective log-softmax takes its upstream gradient
  // [N, K] in spec.selective.values instead.
  Block dhidden, dweight, dbias;
  // Add into dweight / dbias instead of overwriting them (a graph's gradient accumulator).
  bool accumulate_dhidden = false, accumulate_dweight = false, accumulate_dbias = false;
  float grad_scale = 1.0f;
  // An f32 in the backend's memory that multiplies every gradient too (a graph seeded with a leaf: a
  // data-parallel rank's share), read when the gradients are computed, or null. Executors take it at
  // construction; run_fused_linear requires it null.
  const float* grad_factor = nullptr;
  Block row_upstream;

  // Bytes of chunk logits (FusedLinearOptions::logits_budget); 0: automatic, resolved by run_fused_linear
  // from the executor's caps().auto_budget (plan_chunks, which has no executor, takes 0 as
  // kFusedLinearAutoMin).
  size_t logits_budget = kFusedLinearAutoBudget;
  int64_t chunk_rows = 0;  // > 0: exactly this many rows per chunk, whatever the budget
  std::string what;        // the op and shapes, for error messages
  // FusedLinearOptions::logits_dtype: BF16 / F16 asks for 16-bit chunk logits, which the scheduler uses when
  // the executor supports them (caps().logits16), the loss is not selective log-softmax and the path
  // is not K-sparse; otherwise (and for F32) the logits are f32.
  DType logits_dtype = DType::F32;

  bool wants_grad() const { return !dhidden.empty() || !dweight.empty() || !dbias.empty(); }
  bool online_teacher() const { return !teacher_weight.empty(); }
};

// How a problem will run.
struct ChunkPlan {
  int64_t chunk_rows = 0;    // rows per chunk (the last chunk may be shorter); from the budget: the fewest
                             // chunks it allows, evened out, rounded up to kRowAlign rows where that fits
  int64_t padded_vocab = 0;  // Vp: row length of the logits scratch, in floats
  bool sparse = false;       // the K-sparse top-K path
  size_t scratch_bytes = 0;  // everything the scheduler asks the executor for
  bool pad_weights = false;  // W (and the teacher's) copied into zero-padded [Vp, H] scratch
  DType logits_dtype = DType::F32;  // of the logits blocks (student and online teacher)
};
// pad_weights: the executor's caps().pads_vocab (only honoured when Vp > V, the padded rows can be zeroed as
// whole floats, and the padded copies leave room in the memory budget for a chunk of kRowAlign rows or of all
// rows; the copies are then counted in it);
// shadow: the executor's caps().shadow_bytes_per_logit (not counted with 16-bit logits); logits16: the
// executor supports the problem's 16-bit logits_dtype (caps().logits16 and every logits GEMM's operands of
// that dtype).
ChunkPlan plan_chunks(const FusedLinearProblem& p, bool pad_weights = false, size_t shadow = 0,
                      bool logits16 = false);
// Bytes of a zero-padded [vp, cols] copy of w (aligned), or 0 when w cannot be padded.
size_t padded_bytes(const Block& w, int64_t vp);

// Runs the problem on ex. Throws retort::Error (from validation) before anything is written.
void run_fused_linear(ChunkExecutor& ex, const FusedLinearProblem& p);

// The problem a placed fused-linear graph node describes (one of the five forward ops, or FusedLinearBack),
// every input, option, output and gradient wired to the node's tensors (fused_linear.cpp). A backend's node
// kernel is run_fused_linear(its executor, problem_from_node(node)): the CPU's is exactly that.
FusedLinearProblem problem_from_node(const Tensor* node);

}  // namespace retort::loss
