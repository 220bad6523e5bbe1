// The multi-GPU check, one process per GPU under a launcher (tools/launch.sh -n N build-gpu/tests/dist_check):
// NCCL's calls against float64 references and bitwise-equal on every rank, then data-parallel training of a
// small transformer on the GPUs against one GPU with the world's batch (the loss curve within a stated
// tolerance), against itself (bit for bit), and with ZeRO-1 against the plain world (bit for bit), with the
// embedding's gradient summed densely (batch 4) and exchanged sparsely (batch 1, tied and untied head). Rank 0
// prints one line per check and "dist_check: PASS" or "dist_check: FAIL" last; every rank exits non-zero on
// a failure. Without a GPU, without NCCL or alone (WORLD_SIZE 1) it says why and exits 77 (skipped).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "retort.h"

namespace {

using namespace retort;

int failures = 0;

void report(const dist::World& w, bool ok, const std::string& what) {
  if (!ok) ++failures;
  if (w.rank == 0 || !ok) std::printf("%s%s: %s\n", w.rank ? ("[rank " + std::to_string(w.rank) + "] ").c_str() : "",
                                      ok ? "ok  " : "FAIL", what.c_str());
  std::fflush(stdout);
}

std::vector<float> rank_data(int rank, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed * 131u + uint32_t(rank));
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// Every rank's bytes equal rank 0's (compared over the host group).
bool same_everywhere(dist::ProcessGroup& pg, const std::vector<uint8_t>& bytes) {
  std::vector<uint8_t> all(bytes.size() * size_t(pg.size()));
  pg.host().all_gather(bytes.data(), all.data(), bytes.size());
  for (int r = 1; r < pg.size(); ++r)
    if (std::memcmp(all.data(), all.data() + size_t(r) * bytes.size(), bytes.size()) != 0) return false;
  return true;
}

void check_collectives(dist::ProcessGroup& pg, Backend& be) {
  const dist::World& w = pg.world();
  Collective& c = *pg.device();
  Context ctx(be);
  const int64_t n = 1000003;  // not a multiple of anything
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor* t = ctx.tensor(dt, {n}, "x");
    set_data(t, rank_data(w.rank, n, 1));
    c.all_reduce_sum(t->data, n, dt);
    c.join();
    const std::vector<float> got = get_data(t);
    std::vector<std::vector<float>> every;
    for (int r = 0; r < w.size; ++r) every.push_back(rank_data(r, n, 1));
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) {
      double ref = 0, mag = 0;
      for (int r = 0; r < w.size; ++r) {
        const float x = every[size_t(r)][size_t(i)];
        ref += dt == DType::BF16 ? bf16_to_f32(f32_to_bf16(x)) : x;
        mag += std::fabs(x);
      }
      // Relative to the summed magnitudes: a partial sum can be far larger than a sum that cancels.
      worst = std::max(worst, std::fabs(got[size_t(i)] - ref) / (mag + 1));
    }
    // NCCL sums bf16 in a ring, rounding each partial sum to bf16: at most one half ulp of Σ|x| per hop.
    const double tol = dt == DType::BF16 ? double(w.size) / 256 : 1e-5;
    report(w, worst <= tol, detail::concat("all_reduce ", dtype_name(dt), " of ", n, " elements: worst error ",
                                           worst, " relative (tolerance ", tol, ")"));
    report(w, same_everywhere(pg, get_bytes(t)), detail::concat("all_reduce ", dtype_name(dt), " bitwise equal on every rank"));
  }
  Tensor* b = ctx.tensor(DType::F32, {4099}, "b");
  set_data(b, rank_data(w.rank, 4099, 2));
  c.broadcast(b->data, b->nbytes(), w.size - 1);
  c.join();
  report(w, get_data(b) == rank_data(w.size - 1, 4099, 2), "broadcast from the last rank");
  Tensor* mine = ctx.tensor(DType::F32, {513}, "mine");
  Tensor* all = ctx.tensor(DType::F32, {513 * int64_t(w.size)}, "all");
  set_data(mine, rank_data(w.rank, 513, 3));
  c.all_gather(mine->data, all->data, mine->nbytes());
  c.join();
  std::vector<float> want;
  for (int r = 0; r < w.size; ++r) {
    const auto v = rank_data(r, 513, 3);
    want.insert(want.end(), v.begin(), v.end());
  }
  report(w, get_data(all) == want, "all_gather");
  const int64_t m = 777;
  Tensor* send = ctx.tensor(DType::F32, {m * w.size}, "send");
  Tensor* slice = ctx.tensor(DType::F32, {m}, "slice");
  set_data(send, rank_data(w.rank, m * w.size, 4));
  c.reduce_scatter_sum(send->data, slice->data, m, DType::F32);
  c.join();
  const auto got = get_data(slice);
  double worst = 0;
  for (int64_t i = 0; i < m; ++i) {
    double ref = 0;
    for (int r = 0; r < w.size; ++r) ref += rank_data(r, m * w.size, 4)[size_t(w.rank * m + i)];
    worst = std::max(worst, std::fabs(got[size_t(i)] - ref) / (std::fabs(ref) + 1));
  }
  report(w, worst <= 1e-5, detail::concat("reduce_scatter: worst error ", worst, " relative (tolerance 1e-5)"));
}

struct Curve {
  std::vector<double> loss, norm;
  std::vector<uint8_t> params;
  int sparse = 0;  // embeddings whose gradient rows were gathered instead of summed
};

Curve train(Backend& be, dist::ProcessGroup* pg, const ShardSet& set, int64_t batch, DType wire, int steps,
            bool zero1 = false, int64_t* state = nullptr, bool tie = true) {
  Context ctx(be);
  TransformerConfig c;
  c.vocab = 256;
  c.context = 64;
  c.layers = 2;
  c.d_model = 64;
  c.heads = 4;
  c.compute_dtype = DType::F32;
  c.tie_embeddings = tie;
  Transformer model(ctx, c, 11);
  TrainerOptions o;
  o.steps = steps;
  o.batch = batch;
  o.seq_len = 64;
  o.warmup = std::min(steps, 2);
  o.lr = 3e-3f;
  o.min_lr = 3e-4f;
  o.seed = 5;
  o.group = pg;
  o.bucket_dtype = wire;
  o.bucket_mib = 1;  // several buckets even for this small model
  o.zero1 = zero1;
  LmTrainer tr(ctx, model, set.train, o);
  if (state) {
    *state = 0;
    for (const auto* moments : {&tr.optimizer().m(), &tr.optimizer().v()})
      for (const Tensor* t : *moments) *state += t->nelements();
  }
  Curve out;
  out.sparse = tr.grad_sync().sparse;
  for (int s = 0; s < steps; ++s) {
    const auto r = tr.step();
    out.loss.push_back(r.loss);
    out.norm.push_back(r.grad_norm);
  }
  for (const Tensor* p : model.parameters()) {
    const auto b = get_bytes(p);
    out.params.insert(out.params.end(), b.begin(), b.end());
  }
  return out;
}

// Batch 1 (64 rows a rank): the embedding's gradient rows and ids are gathered and scattered on every rank
// (with a tied head, its dense part summed in a bucket of its own) instead of summing the whole table.
void check_sparse_embedding(dist::ProcessGroup& pg, Backend& be, const ShardSet& set, int steps) {
  const dist::World& w = pg.world();
  for (const bool tie : {true, false}) {
    const std::string what = tie ? "tied" : "untied";
    const Curve s = train(be, &pg, set, 1, DType::F32, steps, false, nullptr, tie);
    const Curve again = train(be, &pg, set, 1, DType::F32, steps, false, nullptr, tie);
    report(w, s.sparse == 1, detail::concat("batch 1, ", what, ": the embedding's rows gathered (", s.sparse,
                                            " embedding(s) exchanged sparsely)"));
    report(w, s.loss == again.loss && s.params == again.params,
           detail::concat("batch 1, ", what, ": two runs of ", steps, " steps bitwise equal"));
    report(w, same_everywhere(pg, s.params), detail::concat("batch 1, ", what, ": every rank ends the same"));
    if (tie) {
      const Curve z = train(be, &pg, set, 1, DType::F32, steps, true, nullptr, tie);
      report(w, z.loss == s.loss && z.params == s.params,
             "batch 1, tied: ZeRO-1 bitwise equal to the plain world's");
    }
    Curve one;
    if (w.rank == 0) one = train(be, nullptr, set, w.size, DType::F32, steps, false, nullptr, tie);
    pg.host().barrier();
    if (w.rank != 0) continue;
    double worst = 0;
    for (int i = 0; i < steps; ++i)
      worst = std::max(worst, std::fabs(s.loss[size_t(i)] - one.loss[size_t(i)]) / one.loss[size_t(i)]);
    report(w, worst <= 1e-3, detail::concat("batch 1, ", what, ": loss curve vs 1 GPU with ", w.size,
                                            "x batch: worst relative difference ", worst, " (tolerance 1e-3)"));
  }
}

void check_training(dist::ProcessGroup& pg, Backend& be) {
  const dist::World& w = pg.world();
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("retort-dist-check-" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir);
  std::mt19937 rng(3);
  std::vector<int32_t> toks(200000);
  for (size_t i = 0; i < toks.size(); ++i)
    toks[i] = i > 0 && rng() % 3 ? int32_t((toks[i - 1] * 7 + 3) % 256) : int32_t(rng() % 256u);
  ShardWriteOptions so;
  so.tokens_per_shard = 60000;
  const ShardSet set = write_shards(toks, dir + "/d", 256, so);
  const int steps = 20;
  const int64_t B = 4;
  const Curve a = train(be, &pg, set, B, DType::F32, steps);
  const Curve again = train(be, &pg, set, B, DType::F32, steps);
  report(w, a.loss == again.loss && a.params == again.params,
         detail::concat("world ", w.size, ": two runs of ", steps, " steps bitwise equal (losses and parameters)"));
  report(w, same_everywhere(pg, a.params), "every rank ends with the same parameters");
  const Curve bf = train(be, &pg, set, B, DType::BF16, steps);
  // ZeRO-1: each rank updates its slice with the same summed gradients and global norm, then gathers (NCCL
  // all_gather on the collective's stream): the same steps bit for bit, with 1/world of the moments.
  int64_t plain_state = 0, zero_state = 0;
  train(be, &pg, set, B, DType::F32, 1, false, &plain_state);
  const Curve z = train(be, &pg, set, B, DType::F32, steps, true, &zero_state);
  report(w, z.loss == a.loss && z.params == a.params,
         detail::concat("ZeRO-1, world ", w.size, ": ", steps, " steps bitwise equal to the plain world's"));
  std::vector<int64_t> total{zero_state};
  pg.host().all_reduce_sum(total);
  report(w, total[0] == plain_state && zero_state * w.size <= plain_state + 64 * w.size,
         detail::concat("ZeRO-1 moments on rank ", w.rank, ": ", zero_state, " of ", plain_state,
                        " elements (all ranks: ", total[0], ")"));
  // Rank 0 alone: one GPU with the world's batch; the others wait at the barrier.
  Curve one;
  if (w.rank == 0) one = train(be, nullptr, set, B * w.size, DType::F32, steps);
  pg.host().barrier();
  if (w.rank == 0) {
    double worst = 0, worst_bf = 0;
    for (int s = 0; s < steps; ++s) {
      worst = std::max(worst, std::fabs(a.loss[size_t(s)] - one.loss[size_t(s)]) / one.loss[size_t(s)]);
      worst_bf = std::max(worst_bf, std::fabs(bf.loss[size_t(s)] - one.loss[size_t(s)]) / one.loss[size_t(s)]);
    }
    std::printf("loss curve (step: 1 GPU x%d batch | world %d f32 buckets | world %d bf16 buckets)\n", w.size,
                w.size, w.size);
    for (int s = 0; s < steps; s += 4)
      std::printf("  %3d: %.6f | %.6f | %.6f\n", s + 1, one.loss[size_t(s)], a.loss[size_t(s)], bf.loss[size_t(s)]);
    report(w, worst <= 1e-3, detail::concat("loss curve, world ", w.size, " (f32 buckets) vs 1 GPU with ", w.size,
                                            "x batch: worst relative difference ", worst, " over ", steps,
                                            " steps (tolerance 1e-3)"));
    report(w, worst_bf <= 2e-2, detail::concat("loss curve, world ", w.size, " (bf16 buckets) vs 1 GPU with ",
                                               w.size, "x batch: worst relative difference ", worst_bf,
                                               " (tolerance 2e-2)"));
    report(w, a.loss.back() < a.loss.front(), "the loss goes down");
  }
  report(w, a.sparse == 0, detail::concat("batch ", B, ": the embedding's gradient summed densely (", w.size,
                                          " x ", B * 64, " rows outweigh the 256-row table)"));
  check_sparse_embedding(pg, be, set, steps);
  std::filesystem::remove_all(dir);
}

}  // namespace

int main() {
  try {
    const dist::World w = dist::world_from_env();
    std::string why;
    if (!cuda_available(&why)) {
      std::printf("dist_check: skipped: no usable GPU (%s)\n", why.c_str());
      return 77;
    }
    if (!nccl_available(&why)) {
      std::printf("dist_check: skipped: %s\n", why.c_str());
      return 77;
    }
    if (w.size < 2) {
      std::printf("dist_check: skipped: a world of 1 (start it with tools/launch.sh -n 2 or more)\n");
      return 77;
    }
    auto be = make_cuda_backend(w.local_rank);
    dist::ProcessGroup pg(w, *be);
    if (w.rank == 0) std::printf("dist_check: %s, NCCL on %s\n", w.describe().c_str(), be->name().c_str());
    check_collectives(pg, *be);
    check_training(pg, *be);
    // Every rank learns whether any failed, so all exit alike.
    std::vector<int64_t> bad{failures};
    pg.host().all_reduce_sum(bad);
    if (w.rank == 0) std::printf("dist_check: %s (%lld failed check(s) over %d ranks)\n", bad[0] ? "FAIL" : "PASS",
                                 (long long)bad[0], w.size);
    return bad[0] ? 1 : 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "dist_check: %s\n", e.what());
    return 1;
  }
}
