#include "world.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <optional>

#include "../core/error.h"

namespace retort::dist {

namespace {

using Getenv = std::function<const char*(const char*)>;

// The variable as an integer in [lo, hi], or nothing when unset or empty.
std::optional<long> int_var(const Getenv& env, const char* name, long lo, long hi) {
  const char* v = env(name);
  if (!v || !*v) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  RT_CHECK(errno == 0 && end != v && *end == '\0', "distributed setup: ", name, "='", v,
           "' is not an integer");
  RT_CHECK(x >= lo && x <= hi, "distributed setup: ", name, "=", x, " is outside [", lo, ", ", hi, "]");
  return x;
}

struct Family {
  const char* label;
  const char *rank, *size, *local_rank, *local_size;
};

// Launchers in the order they are trusted: the contract's own names first.
constexpr Family kFamilies[] = {
    {"RANK/WORLD_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"MPICH", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};

}  // namespace

std::string World::describe() const {
  std::string s = "rank " + std::to_string(rank) + " of " + std::to_string(size) + " (local " +
                  std::to_string(local_rank) + " of " + std::to_string(local_size) + ")";
  if (size > 1) s += ", rendezvous " + master_addr + ":" + std::to_string(master_port);
  return s;
}

World world_from_env(const Getenv& env) {
  World w;
  const Family* used = nullptr;
  for (const Family& f : kFamilies) {
    const auto r = int_var(env, f.rank, 0, kMaxWorldSize - 1);
    const auto n = int_var(env, f.size, 1, kMaxWorldSize);
    if (!r && !n) continue;
    RT_CHECK(r && n, "distributed setup: ", r ? f.rank : f.size, " is set but ", r ? f.size : f.rank,
             " is not (", f.label, " launchers set both)");
    RT_CHECK(*r < *n, "distributed setup: ", f.rank, "=", *r, " must be below ", f.size, "=", *n);
    if (!used) {
      used = &f;
      w.rank = int(*r);
      w.size = int(*n);
      w.source = f.label;
      continue;
    }
    // A second launcher's variables (srun running torchrun, say) must describe the same process.
    RT_CHECK(*r == w.rank && *n == w.size, "distributed setup: ", used->rank, "=", w.rank, " ", used->size,
             "=", w.size, " disagree with ", f.rank, "=", *r, " ", f.size, "=", *n,
             " (two launchers' variables describe different worlds; unset one)");
  }
  if (used) {
    // Slurm gives tasks per node as "4(x2)" on heterogeneous allocations: only a plain number is read.
    const char* ls_text = env(used->local_size);
    const bool plain = ls_text && *ls_text && std::string(ls_text).find_first_not_of("0123456789") ==
                                                  std::string::npos;
    const auto ls = plain ? int_var(env, used->local_size, 1, w.size) : std::nullopt;
    const auto lr = int_var(env, used->local_rank, 0, kMaxWorldSize - 1);
    w.local_rank = lr ? int(*lr) : w.rank;
    w.local_size = ls ? int(*ls) : (lr ? std::max(w.local_rank + 1, 1) : w.size);
    RT_CHECK(w.local_rank <= w.rank, "distributed setup: ", used->local_rank, "=", w.local_rank,
             " is larger than ", used->rank, "=", w.rank, " (a host's ranks are a subset of the world's)");
    RT_CHECK(!ls || w.local_rank < w.local_size, "distributed setup: ", used->local_rank, "=", w.local_rank,
             " must be below ", used->local_size, "=", w.local_size);
  }
  const char* addr = env("MASTER_ADDR");
  if (addr && *addr) w.master_addr = addr;
  RT_CHECK(w.size == 1 || (addr && *addr), "distributed setup: WORLD_SIZE=", w.size,
           " but MASTER_ADDR is not set (the host rank 0 runs on; 127.0.0.1 on one host)");
  if (const auto p = int_var(env, "MASTER_PORT", 1, 65535)) w.master_port = int(*p);
  if (const char* t = env("RETORT_DIST_TIMEOUT"); t && *t) {
    char* end = nullptr;
    const double s = std::strtod(t, &end);
    RT_CHECK(end != t && *end == '\0' && s > 0 && s <= 86400, "distributed setup: RETORT_DIST_TIMEOUT='", t,
             "' must be a number of seconds in (0, 86400]");
    w.timeout_s = s;
  }
  return w;
}

World world_from_env() {
  return world_from_env([](const char* n) { return std::getenv(n); });
}

}  // namespace retort::dist
