// Beyond one process, on the CPU: the launcher environment (good, bad and inconsistent values), the TCP
// rendezvous and its timeouts (a rank that never comes, dies or hangs), the CPU collective in worlds of 2 to
// 4 forked processes on loopback against float64 references, the loader's sharding by rank, and data-parallel
// training: a world of 2 follows the loss curve of one process with twice the batch, and repeats itself
// bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <thread>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../io/io_test_util.h"
#include "core/cpu_backend.h"
#include "dist/process_group.h"
#include "io/batch_loader.h"
#include "io/shards.h"
#include "nn/lm.h"
#include "ops/collective_ops.h"
#include "core/op_table.h"

namespace retort {
namespace {

using dist::TcpGroup;
using dist::World;
using test::expect_error;
using test::ScratchDir;

// ---- helpers --------------------------------------------------------------------------------------------

// A port nothing listens on now (the kernel's pick for a socket bound to port 0).
int free_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  EXPECT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

World loopback(int rank, int size, int port, double timeout_s = 20) {
  World w;
  w.rank = rank;
  w.size = size;
  w.local_rank = rank;
  w.local_size = size;
  w.master_addr = "127.0.0.1";
  w.master_port = port;
  w.timeout_s = timeout_s;
  return w;
}

struct RankResult {
  int status = -1;      // exit code, or -1 when killed
  std::string message;  // what the rank wrote (its error, when it failed)
};

// Runs body(rank) in `ranks` forked processes (only those listed in `run`, when given) and waits at most
// limit_s for them; a rank's return value is its exit code and a thrown exception's text its message.
std::vector<RankResult> run_ranks(int ranks, const std::function<int(int)>& body, double limit_s = 60,
                                  std::set<int> run = {}) {
  ScratchDir dir;
  std::vector<pid_t> pids(size_t(ranks), -1);
  for (int r = 0; r < ranks; ++r) {
    if (!run.empty() && !run.count(r)) continue;
    const pid_t pid = ::fork();
    if (pid == 0) {
      int rc = 0;
      std::string msg;
      try {
        rc = body(r);
      } catch (const std::exception& e) {
        msg = e.what();
        rc = 3;
      }
      std::ofstream(dir.file("rank" + std::to_string(r))) << msg;
      std::_Exit(rc);
    }
    pids[size_t(r)] = pid;
  }
  std::vector<RankResult> out(static_cast<size_t>(ranks));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  for (int r = 0; r < ranks; ++r) {
    if (pids[size_t(r)] < 0) continue;
    int st = 0;
    while (::waitpid(pids[size_t(r)], &st, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pids[size_t(r)], SIGKILL);
        ::waitpid(pids[size_t(r)], &st, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    out[size_t(r)].status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    std::ifstream f(dir.file("rank" + std::to_string(r)));
    std::getline(f, out[size_t(r)].message, '\0');
  }
  return out;
}

void expect_all_ok(const std::vector<RankResult>& res) {
  for (size_t r = 0; r < res.size(); ++r)
    EXPECT_EQ(res[r].status, 0) << "rank " << r << ": " << res[r].message;
}

// ---- the environment contract ---------------------------------------------------------------------------

using Env = std::map<std::string, std::string>;
World from(const Env& env) {
  return dist::world_from_env([&](const char* n) -> const char* {
    const auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(World, NothingSetIsAWorldOfOne) {
  const World w = from({});
  EXPECT_EQ(w.rank, 0);
  EXPECT_EQ(w.size, 1);
  EXPECT_EQ(w.local_rank, 0);
}

TEST(World, TorchrunVariables) {
  const World w = from({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                        {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "1234"}, {"RETORT_DIST_TIMEOUT", "7.5"}});
  EXPECT_EQ(w.rank, 5);
  EXPECT_EQ(w.size, 8);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_size, 4);
  EXPECT_EQ(w.master_addr, "node0");
  EXPECT_EQ(w.master_port, 1234);
  EXPECT_DOUBLE_EQ(w.timeout_s, 7.5);
}

TEST(World, MpiAndSlurmVariables) {
  const World o = from({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                        {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"MASTER_ADDR", "h"}});
  EXPECT_EQ(o.rank, 2);
  EXPECT_EQ(o.size, 4);
  EXPECT_EQ(o.local_rank, 0);
  EXPECT_EQ(o.source, "Open MPI");
  const World s = from({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"},
                        {"SLURM_NTASKS_PER_NODE", "2(x2)"}, {"MASTER_ADDR", "h"}});
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.local_rank, 1);
  EXPECT_EQ(s.source, "Slurm");
  // srun starting torchrun-style variables that agree with its own is fine.
  const World both = from({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"},
                           {"MASTER_ADDR", "h"}});
  EXPECT_EQ(both.rank, 3);
}

TEST(World, BadValuesAreClearErrors) {
  expect_error([] { from({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}); },
               {"RANK=2", "below", "WORLD_SIZE=2"});
  expect_error([] { from({{"RANK", "x1"}, {"WORLD_SIZE", "2"}}); }, {"RANK='x1'", "not an integer"});
  expect_error([] { from({{"RANK", "0"}, {"WORLD_SIZE", "0"}}); }, {"WORLD_SIZE=0", "outside"});
  expect_error([] { from({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}); }, {"RANK=-1", "outside"});
  expect_error([] { from({{"RANK", "1"}}); }, {"RANK is set but WORLD_SIZE is not"});
  expect_error([] { from({{"WORLD_SIZE", "2"}}); }, {"WORLD_SIZE is set but RANK is not"});
  expect_error([] { from({{"RANK", "1"}, {"WORLD_SIZE", "2"}}); }, {"MASTER_ADDR is not set"});
  expect_error([] { from({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}}); },
               {"MASTER_PORT=70000", "outside"});
  expect_error([] { from({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"MASTER_ADDR", "h"}}); },
               {"LOCAL_RANK=2", "larger than", "RANK=1"});
  expect_error(
      [] {
        from({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "1"},
              {"MASTER_ADDR", "h"}});
      },
      {"LOCAL_RANK=1", "LOCAL_WORLD_SIZE=1"});
  expect_error([] { from({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}}); },
               {"disagree", "SLURM_PROCID=2"});
  expect_error([] { from({{"RETORT_DIST_TIMEOUT", "0"}}); }, {"RETORT_DIST_TIMEOUT='0'"});
}

// ---- the rendezvous -------------------------------------------------------------------------------------

TEST(Rendezvous, RankThatNeverComesTimesOut) {
  const int port = free_port();
  const auto t0 = std::chrono::steady_clock::now();
  // Only rank 0 of a world of 3 starts: it must fail naming the ranks missing, within its 1 s timeout.
  const auto res = run_ranks(3, [&](int r) { TcpGroup g(loopback(r, 3, port, 1.0)); return 0; }, 20, {0});
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(res[0].status, 3);
  EXPECT_NE(res[0].message.find("rank(s) 1, 2 did not join"), std::string::npos) << res[0].message;
  EXPECT_LT(took, 10.0);
}

TEST(Rendezvous, NoRankZeroTimesOut) {
  const int port = free_port();
  const auto res = run_ranks(2, [&](int r) { TcpGroup g(loopback(r, 2, port, 1.0)); return 0; }, 20, {1});
  EXPECT_EQ(res[1].status, 3);
  EXPECT_NE(res[1].message.find("could not reach rank 0"), std::string::npos) << res[1].message;
}

TEST(Rendezvous, DisagreeingWorldSizesAndDuplicateRanksFail) {
  int port = free_port();
  auto res = run_ranks(2, [&](int r) { TcpGroup g(loopback(r, r == 0 ? 2 : 3, port, 5)); return 0; });
  for (const auto& x : res) {
    EXPECT_EQ(x.status, 3);
    EXPECT_NE(x.message.find("WORLD_SIZE=3 but rank 0 has WORLD_SIZE=2"), std::string::npos) << x.message;
  }
  port = free_port();
  res = run_ranks(3, [&](int r) { TcpGroup g(loopback(r == 2 ? 1 : r, 3, port, 5)); return 0; });
  EXPECT_EQ(res[0].status, 3);
  EXPECT_NE(res[0].message.find("two processes claim rank 1"), std::string::npos) << res[0].message;
}

TEST(Rendezvous, DeadOrHungRankIsAnErrorWithinTheTimeout) {
  int port = free_port();
  // Rank 1 joins, then exits without taking part in the sum.
  auto res = run_ranks(2, [&](int r) {
    TcpGroup g(loopback(r, 2, port, 2.0));
    if (r == 1) return 0;
    float x = 1;
    g.all_reduce_sum(&x, 1, DType::F32);
    return 0;
  });
  EXPECT_EQ(res[1].status, 0);
  EXPECT_EQ(res[0].status, 3);
  EXPECT_NE(res[0].message.find("rank 1 closed the connection"), std::string::npos) << res[0].message;
  port = free_port();
  // Rank 1 joins, then hangs: rank 0 gives up after its 1 s timeout, and rank 1 then sees rank 0 gone.
  const auto t0 = std::chrono::steady_clock::now();
  res = run_ranks(2, [&](int r) {
    TcpGroup g(loopback(r, 2, port, 1.0));
    if (r == 1) std::this_thread::sleep_for(std::chrono::seconds(3));
    float x = 1;
    g.all_reduce_sum(&x, 1, DType::F32);
    return 0;
  });
  EXPECT_EQ(res[0].status, 3);
  EXPECT_NE(res[0].message.find("no answer from rank 1 within 1 s"), std::string::npos) << res[0].message;
  EXPECT_EQ(res[1].status, 3);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 15.0);
}

TEST(Rendezvous, MismatchedCallsAreNamed) {
  const int port = free_port();
  const auto res = run_ranks(2, [&](int r) {
    TcpGroup g(loopback(r, 2, port, 5));
    std::vector<float> x(size_t(r == 0 ? 4 : 5), 1.0f);
    g.all_reduce_sum(x.data(), int64_t(x.size()), DType::F32);
    return 0;
  });
  for (const auto& x : res) {
    EXPECT_EQ(x.status, 3);
    EXPECT_NE(x.message.find("all_reduce of 5 elements"), std::string::npos) << x.message;
  }
}

// ---- the CPU collective ---------------------------------------------------------------------------------

std::vector<float> rank_data(int rank, int64_t n, uint64_t seed) {
  std::mt19937 rng(uint32_t(seed * 131 + uint64_t(rank)));
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// Every call, every rank, against float64 sums of every rank's data; the results must also be bitwise the
// same on every rank (checked by gathering them).
int collective_checks(int rank, int size, int port, uint64_t seed) {
  TcpGroup g(loopback(rank, size, port));
  const int64_t n = 1000 + 37 * size;  // not a multiple of anything
  int bad = 0;
  for (DType dt : {DType::F32, DType::BF16}) {
    std::vector<uint8_t> buf(size_t(n) * dtype_size(dt));
    const auto mine = rank_data(rank, n, seed);
    for (int64_t i = 0; i < n; ++i) store_f32(buf.data(), dt, i, mine[size_t(i)]);
    g.all_reduce_sum(buf.data(), n, dt);
    std::vector<std::vector<float>> every;
    for (int r = 0; r < size; ++r) every.push_back(rank_data(r, n, seed));
    for (int64_t i = 0; i < n; ++i) {
      double ref = 0;
      for (int r = 0; r < size; ++r) {
        const float x = every[size_t(r)][size_t(i)];
        ref += dt == DType::BF16 ? bf16_to_f32(f32_to_bf16(x)) : x;
      }
      const double tol = dt == DType::BF16 ? 0.02 * (std::fabs(ref) + 1) : 1e-5 * (std::fabs(ref) + 1);
      if (std::fabs(double(load_f32(buf.data(), dt, i)) - ref) > tol) ++bad;
    }
    std::vector<uint8_t> all(buf.size() * size_t(size));
    g.all_gather(buf.data(), all.data(), buf.size());
    for (int r = 1; r < size; ++r)
      if (std::memcmp(all.data(), all.data() + size_t(r) * buf.size(), buf.size()) != 0) ++bad;
  }
  // broadcast from the last rank
  std::vector<float> b = rank_data(rank, 33, seed + 1);
  g.broadcast(b.data(), b.size() * 4, size - 1);
  if (b != rank_data(size - 1, 33, seed + 1)) ++bad;
  // reduce_scatter: rank r gets the sum of every rank's slice r
  const int64_t m = 17;
  const auto send = rank_data(rank, m * size, seed + 2);
  std::vector<float> slice(static_cast<size_t>(m));
  g.reduce_scatter_sum(send.data(), slice.data(), m, DType::F32);
  for (int64_t i = 0; i < m; ++i) {
    double ref = 0;
    for (int r = 0; r < size; ++r) ref += rank_data(r, m * size, seed + 2)[size_t(rank * m + i)];
    if (std::fabs(slice[size_t(i)] - ref) > 1e-5 * (std::fabs(ref) + 1)) ++bad;
  }
  // host sums and a barrier
  std::vector<int64_t> counts{rank + 1, int64_t(1) << 40};
  g.all_reduce_sum(counts);
  if (counts[0] != int64_t(size) * (size + 1) / 2 || counts[1] != (int64_t(size) << 40)) ++bad;
  g.barrier();
  if (bad) throw Error("rank " + std::to_string(rank) + ": " + std::to_string(bad) + " wrong values");
  return 0;
}

TEST(TcpCollective, WorldsOfTwoToFour) {
  for (int size = 2; size <= 4; ++size) {
    const int port = free_port();
    const uint64_t seed = std::random_device{}();
    SCOPED_TRACE("world " + std::to_string(size) + ", seed " + std::to_string(seed));
    expect_all_ok(run_ranks(size, [&](int r) { return collective_checks(r, size, port, seed); }));
  }
}

TEST(TcpCollective, WorldOfOneIsANoOp) {
  TcpGroup g(loopback(0, 1, 1));
  float x = 2.5f;
  g.all_reduce_sum(&x, 1, DType::F32);
  g.barrier();
  EXPECT_EQ(x, 2.5f);
  CpuBackend be(1);
  dist::ProcessGroup pg(loopback(0, 1, 1), be);
  EXPECT_EQ(pg.device(), nullptr);
  EXPECT_EQ(pg.transport(), "none");
}

// ---- sharding by rank -----------------------------------------------------------------------------------

TEST(Sharding, RanksSplitTheGlobalBatchWithNoOverlapAndNoGap) {
  ScratchDir dir;
  std::vector<int32_t> toks(3000);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t(i % 50);
  ShardWriteOptions so;
  so.val_fraction = 0;
  so.tokens_per_shard = 700;
  const ShardSet set = write_shards(toks, dir.file("s"), 50, so);
  for (int world : {1, 2, 3, 4}) {
    const int64_t B = 3, T = 8, steps = 40;  // several epochs
    BatchLoaderOptions one;
    one.batch = B * world;
    one.seq_len = T;
    one.seed = 9;
    BatchLoader whole(set.train, one);
    std::vector<BatchLoader> ranks;
    for (int r = 0; r < world; ++r) {
      BatchLoaderOptions o = one;
      o.batch = B;
      o.rank = r;
      o.world = world;
      ranks.emplace_back(set.train, o);
    }
    for (int64_t s = 0; s < steps; ++s) {
      const Batch all = whole.next();
      std::multiset<int64_t> got;
      for (int r = 0; r < world; ++r) {
        const Batch b = ranks[size_t(r)].next();
        for (int64_t i = 0; i < B; ++i) {
          EXPECT_EQ(b.starts[size_t(i)], all.starts[size_t(r * B + i)]) << "world " << world << " rank " << r;
          got.insert(b.starts[size_t(i)]);
        }
        EXPECT_EQ(ranks[size_t(r)].cursor(), whole.cursor());
        EXPECT_EQ(ranks[size_t(r)].epoch(), whole.epoch());
      }
      EXPECT_EQ(got, std::multiset<int64_t>(all.starts.begin(), all.starts.end()));
      // No window twice within a step (the global batch is smaller than an epoch here).
      EXPECT_EQ(std::set<int64_t>(got.begin(), got.end()).size(), got.size());
    }
  }
  BatchLoaderOptions bad;
  bad.batch = 2;
  bad.seq_len = 8;
  bad.rank = 2;
  bad.world = 2;
  expect_error([&] { BatchLoader(set.train, bad); }, {"rank 2 of a world of 2"});
}

// ---- data-parallel training -----------------------------------------------------------------------------

TransformerConfig tiny_config() {
  TransformerConfig c;
  c.vocab = 48;
  c.context = 8;
  c.layers = 2;
  c.d_model = 16;
  c.heads = 2;
  return c;
}

ShardSet tiny_shards(const ScratchDir& dir) {
  std::mt19937 rng(3);
  std::vector<int32_t> toks(4000);
  for (size_t i = 0; i < toks.size(); ++i)
    toks[i] = i > 0 && rng() % 3 ? int32_t((toks[i - 1] * 7 + 3) % 48) : int32_t(rng() % 48u);
  ShardWriteOptions o;
  o.val_fraction = 0.1;
  o.tokens_per_shard = 1500;
  return write_shards(toks, dir.file("d"), 48, o);
}

// Trains `steps` steps at per-rank batch B in a world (of 1 when size is 1) and writes each step's loss and
// grad norm, then every parameter's bytes, to out.
struct RunPlan {
  bool zero1 = false;
  int until = 8;           // the last step to run (of 8)
  std::string save, resume;  // a checkpoint to write at the end (every rank calls save) / to start from
  bool tie = true;           // the lm-head is the token embedding
};

void train_rank(int rank, int size, int port, int64_t B, DType wire, const ShardSet& set,
                const std::string& out, const RunPlan& plan = {}) {
  CpuBackend be(1);
  Context ctx(be);
  dist::ProcessGroup pg(loopback(rank, size, port), be);
  TransformerConfig c = tiny_config();
  c.tie_embeddings = plan.tie;
  Transformer model(ctx, c, 11);
  TrainerOptions o;
  o.steps = 8;
  o.batch = B;
  o.seq_len = 8;
  o.warmup = 2;
  o.lr = 1e-2f;
  o.min_lr = 1e-3f;
  o.seed = 5;
  o.group = &pg;
  o.bucket_dtype = wire;
  o.bucket_mib = 1;
  o.zero1 = plan.zero1;
  LmTrainer tr(ctx, model, set.train, o);
  if (!plan.resume.empty()) tr.resume(Checkpoint(plan.resume));
  // The optimizer state this rank holds, and the parameters' size.
  int64_t state = 0, params = 0;
  for (const Tensor* m : tr.optimizer().m()) state += m->nelements();
  for (const Tensor* v : tr.optimizer().v()) state += v->nelements();
  for (const Tensor* p : model.parameters()) params += p->nelements();
  std::ofstream(out + ".state") << state << " " << params;
  std::ofstream(out + ".sync") << tr.grad_sync().sparse;
  std::ofstream f(out, std::ios::binary);
  while (tr.steps_done() < plan.until) {
    const auto r = tr.step();
    f.write(reinterpret_cast<const char*>(&r.loss), sizeof r.loss);
    f.write(reinterpret_cast<const char*>(&r.grad_norm), sizeof r.grad_norm);
  }
  for (const Tensor* p : model.parameters()) {
    const auto b = get_bytes(p);
    f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  }
  if (!plan.save.empty() && (rank == 0 || tr.zero1())) tr.save(plan.save);
}

std::vector<double> curve(const std::string& path, int steps) {
  const auto bytes = test::slurp(path);
  std::vector<double> v(size_t(2 * steps));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(double));
  return v;
}

// A world of 2 at per-rank batch B against one process at 2B: the same losses and norms up to f32 rounding,
// the same bits on both ranks, and the same bits in a second run. sparse: whether the embedding's scatter
// rows are to be gathered (sparse_embedding_exchange) rather than summed with the dense table.
void follow_one_process(bool tie, int64_t B, bool sparse) {
  ScratchDir dir;
  const ShardSet set = tiny_shards(dir);
  RunPlan plan;
  plan.tie = tie;
  ASSERT_EQ(sparse_embedding_exchange(2, B * 8, 48, 16, DType::F32), sparse) << "batch " << B;
  expect_all_ok(run_ranks(1, [&](int) {
    train_rank(0, 1, 0, 2 * B, DType::F32, set, dir.file("w1"), plan);
    return 0;
  }));
  for (int run = 0; run < 2; ++run) {
    const int port = free_port();
    expect_all_ok(run_ranks(2, [&](int r) {
      train_rank(r, 2, port, B, DType::F32, set,
                 dir.file("w2." + std::to_string(run) + "." + std::to_string(r)), plan);
      return 0;
    }));
  }
  int gathered = -1;
  std::ifstream(dir.file("w2.0.0.sync")) >> gathered;
  EXPECT_EQ(gathered, sparse ? 1 : 0) << "embeddings exchanged sparsely";
  const auto one = curve(dir.file("w1"), 8);
  const auto two = curve(dir.file("w2.0.0"), 8);
  // Means over the same tokens summed in another order, then 8 AdamW steps: f32 rounding only. The
  // tolerance: 2e-4 relative on the loss and the grad norm.
  for (size_t i = 0; i < one.size(); ++i)
    EXPECT_NEAR(two[i], one[i], 2e-4 * std::fabs(one[i]) + 1e-6) << (i % 2 ? "grad norm" : "loss") << " at step "
                                                                   << i / 2 + 1;
  EXPECT_LT(two[14], two[0]) << "the loss did not go down";
  // Every rank ends with the same parameters, and a second run repeats the first bit for bit.
  const auto r0 = test::slurp(dir.file("w2.0.0")), r1 = test::slurp(dir.file("w2.0.1"));
  EXPECT_EQ(r0, r1) << "the ranks' losses or parameters differ";
  EXPECT_EQ(r0, test::slurp(dir.file("w2.1.0"))) << "two runs of the same world differ";
}

TEST(DataParallel, WorldOfTwoFollowsOneProcessWithTwiceTheBatch) {
  follow_one_process(true, 2, true);
}

TEST(DataParallel, UntiedEmbeddingGatheredSparsely) {
  follow_one_process(false, 2, true);
}

TEST(DataParallel, EmbeddingSummedDenselyWhenItsRowsOutweighTheTable) {
  // 2 ranks x 48 rows x (16 + 1) x 4 bytes gathered against 2 x 48 x 16 x 4 summed: the dense sum wins.
  follow_one_process(true, 6, false);
  follow_one_process(false, 6, false);
}

TEST(DataParallel, SparseExchangeDecidesByBytes) {
  // Gathered: world x rows x (dim + 1 id) x 4 bytes; summed: 2 x vocab x dim x the wire's bytes.
  EXPECT_TRUE(sparse_embedding_exchange(2, 8192, 50257, 512, DType::F32));
  EXPECT_TRUE(sparse_embedding_exchange(4, 16384, 50257, 512, DType::F32));
  EXPECT_FALSE(sparse_embedding_exchange(8, 16384, 50257, 512, DType::F32));
  EXPECT_FALSE(sparse_embedding_exchange(4, 16384, 50257, 512, DType::BF16));
  EXPECT_FALSE(sparse_embedding_exchange(2, 512, 256, 64, DType::F32));
  EXPECT_FALSE(sparse_embedding_exchange(int64_t(1) << 40, int64_t(1) << 40, 1, 1, DType::F32));
}

// One step's gradients of the tiny model (tied or untied) over tokens/targets [B, 8], in a world of 2 (rank
// r's share of the rows, weighted by its share of the valid targets) or alone (comm null: every row).
std::vector<std::vector<float>> step_grads(Collective* comm, bool tie, const std::vector<int32_t>& toks,
                                           const std::vector<int32_t>& tgts, int* sparse) {
  CpuBackend be(1);
  Context ctx(be);
  TransformerConfig c = tiny_config();
  c.tie_embeddings = tie;
  Transformer model(ctx, c, 7);
  const int64_t B = int64_t(toks.size()) / 8;
  Tensor* tok = ctx.input(DType::I32, {B, 8}, "t");
  Tensor* tgt = ctx.input(DType::I32, {B, 8}, "y");
  set_data_int(tok, std::vector<int64_t>(toks.begin(), toks.end()));
  set_data_int(tgt, std::vector<int64_t>(tgts.begin(), tgts.end()));
  const LossOutputs out = lm_cross_entropy(ctx, model, tok, tgt);
  Graph g(ctx);
  g.backward(out.loss, comm ? ctx.tensor(DType::F32, {1}, "weight") : nullptr);
  g.set_poison(true);
  if (comm) {
    const GradSync sync = append_grad_sync(g, *comm, out.loss, {}, DType::F32, 1 << 10);
    *sparse = sync.sparse;
    std::vector<int64_t> n{0};
    for (int32_t y : tgts) n[0] += y != -100;
    const float mine = float(n[0]);
    dist::TcpGroup* host = dynamic_cast<dist::TcpGroup*>(comm);
    host->all_reduce_sum(n);
    set_data(sync.weight, {mine / float(n[0])});
  }
  g.compute();
  std::vector<std::vector<float>> grads;
  for (const Tensor* p : model.parameters()) grads.push_back(get_data(g.grad(p)));
  return grads;
}

TEST(DataParallel, SparseExchangeSumsRepeatedIdsAsOneProcessDoes) {
  // Ids drawn from 5 of the 48 so that each repeats within a rank and across ranks; rank 1 ignores some
  // targets, so the ranks weigh differently. Each rank's embedding gradient (tied: with the lm-head's part)
  // must equal that of one process over both ranks' rows, and be the same bits on both ranks.
  for (const bool tie : {true, false})
    for (const int64_t B : {int64_t(2), int64_t(6)}) {
      std::mt19937 rng(unsigned(B) + (tie ? 100u : 0u));
      std::vector<int32_t> toks(size_t(2 * B * 8)), tgts(toks.size());
      for (size_t i = 0; i < toks.size(); ++i) {
        toks[i] = int32_t(3 + 7 * (rng() % 5u));
        tgts[i] = i >= toks.size() / 2 && rng() % 4u == 0 ? -100 : int32_t(rng() % 48u);
      }
      ScratchDir dir;
      const int port = free_port();
      expect_all_ok(run_ranks(2, [&](int r) {
        dist::TcpGroup comm(loopback(r, 2, port));
        const size_t half = toks.size() / 2, lo = size_t(r) * half;
        int sparse = -1;
        const auto grads =
            step_grads(&comm, tie, std::vector<int32_t>(toks.begin() + lo, toks.begin() + lo + half),
                       std::vector<int32_t>(tgts.begin() + lo, tgts.begin() + lo + half), &sparse);
        std::ofstream f(dir.file("g" + std::to_string(r)), std::ios::binary);
        for (const auto& v : grads)
          f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * 4));
        std::ofstream(dir.file("s" + std::to_string(r))) << sparse;
        return 0;
      }));
      const auto whole = step_grads(nullptr, tie, toks, tgts, nullptr);
      const auto g0 = test::slurp(dir.file("g0"));
      EXPECT_EQ(g0, test::slurp(dir.file("g1")))
          << "tie " << tie << " B " << B << ": the ranks' gradients differ";
      int sparse = -1;
      std::ifstream(dir.file("s0")) >> sparse;
      EXPECT_EQ(sparse, B == 2 ? 1 : 0) << "tie " << tie << " B " << B;
      size_t at = 0;
      for (size_t p = 0; p < whole.size(); ++p) {
        const std::vector<float>& want = whole[p];
        ASSERT_LE(at + want.size() * 4, g0.size());
        float scale = 0, worst = 0;
        for (float x : want) scale = std::max(scale, std::fabs(x));
        for (size_t i = 0; i < want.size(); ++i) {
          float got;
          std::memcpy(&got, g0.data() + at + 4 * i, 4);
          worst = std::max(worst, std::isfinite(got) ? std::fabs(got - want[i]) : INFINITY);
        }
        // Sums of the same terms in another order: f32 rounding of the largest element.
        EXPECT_LE(worst, 1e-5f * scale + 1e-9f) << "tie " << tie << " B " << B << " parameter " << p;
        at += want.size() * 4;
      }
      EXPECT_EQ(at, g0.size());
    }
}

TEST(DataParallel, ZeroOneStepsEqualPlainWithHalfTheOptimizerState) {
  ScratchDir dir;
  const ShardSet set = tiny_shards(dir);
  for (const bool zero1 : {false, true}) {
    const int port = free_port();
    expect_all_ok(run_ranks(2, [&](int r) {
      RunPlan plan;
      plan.zero1 = zero1;
      const std::string name = std::string(zero1 ? "z." : "p.") + std::to_string(r);
      train_rank(r, 2, port, 2, DType::F32, set, dir.file(name), plan);
      return 0;
    }));
  }
  // Each rank updates its share with the same summed gradients, the same global norm and the same elementwise
  // AdamW: the losses, norms and parameters equal the plain world's bit for bit, on every rank.
  const auto plain = test::slurp(dir.file("p.0"));
  EXPECT_EQ(test::slurp(dir.file("z.0")), plain) << "ZeRO-1 rank 0 differs from the plain world";
  EXPECT_EQ(test::slurp(dir.file("z.1")), plain) << "ZeRO-1 rank 1 differs from the plain world";
  // The moments: 2 x the parameters without ZeRO-1; split between the ranks with it (each group's slices
  // differ by its padding at most).
  int64_t ps = 0, pp = 0, s0 = 0, s1 = 0, p0 = 0;
  std::ifstream(dir.file("p.0.state")) >> ps >> pp;
  std::ifstream(dir.file("z.0.state")) >> s0 >> p0;
  std::ifstream(dir.file("z.1.state")) >> s1 >> p0;
  EXPECT_EQ(ps, 2 * pp);
  EXPECT_EQ(s0 + s1, ps);
  EXPECT_LE(std::abs(s0 - s1), 64) << "rank 0 holds " << s0 << ", rank 1 " << s1 << " moment elements";
}

TEST(DataParallel, ZeroOneCheckpointsHoldTheWholeOptimizerState) {
  // A ZeRO-1 world of 2 writes, from rank 0, the same checkpoint as the plain world (every moment gathered),
  // so it resumes at any world size as that one does; and a ZeRO-1 world resumes from it to the same end.
  ScratchDir dir;
  const ShardSet set = tiny_shards(dir);
  auto world = [&](const std::string& name, const RunPlan& plan) {
    const int port = free_port();
    expect_all_ok(run_ranks(2, [&](int r) {
      train_rank(r, 2, port, 2, DType::F32, set, dir.file(name + "." + std::to_string(r)), plan);
      return 0;
    }));
  };
  world("p4", {false, 4, dir.file("p4.st"), ""});
  world("z4", {true, 4, dir.file("z4.st"), ""});
  world("p8", {false, 8, "", ""});
  world("zr", {true, 8, "", dir.file("p4.st")});
  ASSERT_FALSE(test::slurp(dir.file("p4.st")).empty());
  EXPECT_EQ(test::slurp(dir.file("z4.st")), test::slurp(dir.file("p4.st")))
      << "the ZeRO-1 checkpoint differs from the plain world's";
  // Steps 5-8 and the parameters after them: the resumed ZeRO-1 world's equal the uninterrupted plain one's.
  const auto full = test::slurp(dir.file("p8.0")), resumed = test::slurp(dir.file("zr.0"));
  ASSERT_EQ(full.size(), resumed.size() + 4 * 2 * sizeof(double));
  EXPECT_TRUE(std::equal(resumed.begin(), resumed.end(), full.begin() + 4 * 2 * sizeof(double)))
      << "ZeRO-1 resumed at step 4 does not end as the uninterrupted run";
  EXPECT_EQ(test::slurp(dir.file("zr.1")), resumed);
}

TEST(DataParallel, Bf16BucketsStayClose) {
  ScratchDir dir;
  const ShardSet set = tiny_shards(dir);
  expect_all_ok(run_ranks(1, [&](int) { train_rank(0, 1, 0, 4, DType::F32, set, dir.file("w1")); return 0; }));
  const int port = free_port();
  expect_all_ok(run_ranks(2, [&](int r) {
    train_rank(r, 2, port, 2, DType::BF16, set, dir.file("b." + std::to_string(r)));
    return 0;
  }));
  const auto one = curve(dir.file("w1"), 8), two = curve(dir.file("b.0"), 8);
  // bf16 gradients on the wire (8 bits of mantissa): the losses stay within 1% over 8 steps.
  for (size_t i = 0; i < one.size(); i += 2) EXPECT_NEAR(two[i], one[i], 1e-2 * one[i]) << "step " << i / 2 + 1;
  EXPECT_EQ(test::slurp(dir.file("b.0")), test::slurp(dir.file("b.1")));
}

TEST(DataParallel, GradientBucketsRunBeforeTheEndOfBackward) {
  // A world of 2 with one rank in this process would wait for the other: build the graph against a
  // collective that only counts, to check where the buckets land.
  struct Counting final : Collective {
    int rank() const override { return 0; }
    int size() const override { return 2; }
    std::string name() const override { return "count"; }
    void all_reduce_sum(void*, int64_t, DType) override {}
    void broadcast(void*, size_t, int) override {}
    void all_gather(const void*, void*, size_t) override {}
    void reduce_scatter_sum(const void*, void*, int64_t, DType) override {}
  } comm;
  CpuBackend be(1);
  Context ctx(be);
  Transformer model(ctx, tiny_config(), 1);
  Tensor* tok = ctx.input(DType::I32, {2, 8}, "t");
  Tensor* tgt = ctx.input(DType::I32, {2, 8}, "y");
  const LossOutputs out = lm_cross_entropy(ctx, model, tok, tgt);
  Graph g(ctx);
  g.backward(out.loss, ctx.tensor(DType::F32, {1}, "weight"));
  const size_t before = g.nodes().size();
  const GradSync sync = append_grad_sync(g, comm, out.loss, {}, DType::F32, 1 << 10);
  EXPECT_GT(sync.buckets, 2);
  EXPECT_EQ(sync.sparse, 1) << "the tied embedding's rows are not gathered";
  auto gathers = [](const Tensor* n) { return n->op == Op::AllReduce && n->ip[3] == kGatherRowsMode; };
  int early = 0, seen = 0, gathered = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Tensor* n = g.nodes()[i];
    if (n->op != Op::AllReduce || n == sync.loss) continue;
    if (gathers(n)) {
      ++gathered;
      continue;
    }
    ++seen;
    early += i + 1 < before;
  }
  EXPECT_EQ(seen, sync.buckets);
  EXPECT_EQ(gathered, sync.sparse);
  EXPECT_GT(early, 0) << "no bucket was scheduled inside backward";
  EXPECT_EQ(g.nodes().back(), sync.loss);
  // Backward produces each layer's weight gradients as soon as its output gradient exists, so the first
  // bucket is summed before the gradient flowing into the first block (the last layer backward reaches) is
  // computed, and most buckets are on their way by then.
  const Tensor* into_first_block = nullptr;
  for (const Tensor* n : g.nodes())
    if (n->op == Op::GetRows && n->src[0] == model.embedding()) into_first_block = g.grad(n);
  ASSERT_NE(into_first_block, nullptr);
  const Tensor* emb_acc = g.grad(model.embedding());
  const Tensor* scatter = g.grad_writer(model.embedding());
  size_t grad_at = 0, first_bucket = g.nodes().size(), gather_at = 0, scatter_at = 0, head_at = 0;
  int before_it = 0;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (g.nodes()[i] == into_first_block) grad_at = i;
    if (g.nodes()[i] == scatter) scatter_at = i;
    if (gathers(g.nodes()[i])) gather_at = i;
  }
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Tensor* n = g.nodes()[i];
    if (n->op == Op::AllReduce && n != sync.loss && !gathers(n)) {
      if (first_bucket == g.nodes().size()) head_at = n->src[0]->view_src == emb_acc ? i : 0;
      first_bucket = std::min(first_bucket, i);
      before_it += i < grad_at;
    }
  }
  EXPECT_LT(first_bucket, grad_at) << "the first bucket waits for the gradient into the first block";
  EXPECT_GE(2 * before_it, sync.buckets)
      << before_it << " of " << sync.buckets << " buckets start before the first block's backward";
  // The tied head's dense part is the first bucket, summed before any layer's backward; the embedding's rows
  // are gathered once the gradient into the first block exists, and scattered after that onto the sum.
  EXPECT_EQ(head_at, first_bucket) << "the first bucket is not the tied head's gradient alone";
  EXPECT_EQ(g.nodes()[head_at]->src[4], nullptr) << "the tied head's bucket holds more than its gradient";
  EXPECT_GT(gather_at, grad_at);
  EXPECT_GT(scatter_at, gather_at);
  EXPECT_EQ(scatter->src[0], g.nodes()[gather_at]);
  // The rank's weight is the backward's seed, which the fused loss multiplies into the gradients it writes
  // (no pass of its own): a bucket of one f32 gradient is then summed where it lies, and only buckets of
  // several are packed (unweighted) into a staging buffer.
  EXPECT_EQ(sync.weight, g.seed());
  const Tensor* loss_node = out.loss;
  EXPECT_EQ(loss_node->src[9], g.seed()) << "the seed is not folded into the fused loss";
  for (const Tensor* n : g.nodes()) EXPECT_FALSE(n->op == Op::Mul && n->src[1] == g.seed()) << "a seed pass";
  int in_place = 0, packed = 0;
  for (const Tensor* n : g.nodes()) {
    if (n->op != Op::AllReduce || n == sync.loss || gathers(n)) continue;
    EXPECT_EQ(n->src[1], nullptr) << "a gradient bucket scales by the weight";
    const bool one = n->src[4] == nullptr;
    EXPECT_EQ(n->src[3] == nullptr, one) << "bucket at " << n->describe();
    (one ? in_place : packed) += 1;
  }
  EXPECT_GT(in_place, 10);
  EXPECT_EQ(packed, 0) << "1 KiB buckets hold one gradient each";
  EXPECT_EQ(g.nodes()[head_at]->src[3], nullptr) << "the tied head's bucket is packed";
  EXPECT_EQ(sync.loss->src[1], g.seed()) << "the loss is not weighted";
  // 1 MiB buckets: the tied head's alone, summed in place; the other gradients packed several to a bucket.
  {
    Context c2(be);
    Transformer m2(c2, tiny_config(), 1);
    Tensor* t2 = c2.input(DType::I32, {2, 8}, "t");
    const LossOutputs o2 = lm_cross_entropy(c2, m2, t2, c2.input(DType::I32, {2, 8}, "y"));
    Graph g2(c2);
    g2.backward(o2.loss, c2.tensor(DType::F32, {1}, "weight"));
    const GradSync s2 = append_grad_sync(g2, comm, o2.loss, {}, DType::F32, 1 << 20);
    int head = 0, several = 0;
    for (const Tensor* n : g2.nodes()) {
      if (n->op != Op::AllReduce || n == s2.loss || gathers(n)) continue;
      EXPECT_EQ(n->src[3] == nullptr, n->src[4] == nullptr) << n->describe();
      head += n->src[0]->view_src == g2.grad(m2.embedding()) && n->src[3] == nullptr;
      several += n->src[3] != nullptr;
    }
    EXPECT_EQ(head, 1) << "the tied head's part is not summed alone, in place";
    EXPECT_GT(several, 0);
  }
  {
    Context c3(be);
    Transformer m3(c3, tiny_config(), 1);
    const LossOutputs o3 =
        lm_cross_entropy(c3, m3, c3.input(DType::I32, {2, 8}, "t"), c3.input(DType::I32, {2, 8}, "y"));
    Graph unseeded(c3);
    unseeded.backward(o3.loss);
    expect_error([&] { append_grad_sync(unseeded, comm, o3.loss, {}, DType::F32, 1 << 10); },
                 {"seeded with the rank's weight"});
  }
}

}  // namespace
}  // namespace retort
