// Which process this is among the processes of one training run: the environment contract that torchrun,
// mpirun (Open MPI, MPICH) and srun already set, read once and checked.
//
//   RANK, WORLD_SIZE          this process's rank in [0, WORLD_SIZE) and the number of processes
//   LOCAL_RANK                its rank on this host: the GPU it drives (default: 0 in a world of 1, else RANK)
//   LOCAL_WORLD_SIZE          processes on this host (optional; checked against LOCAL_RANK when given)
//   MASTER_ADDR, MASTER_PORT  where rank 0 listens for the rendezvous (needed when WORLD_SIZE > 1)
//   RETORT_DIST_TIMEOUT       seconds any rank waits for another before failing (default 300)
//
// Without RANK / WORLD_SIZE, Open MPI's OMPI_COMM_WORLD_*, MPICH's PMI_RANK / PMI_SIZE and Slurm's
// SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID are read instead. None of them set: a world of 1.
#pragma once
#include <functional>
#include <string>

namespace retort::dist {

inline constexpr int kMaxWorldSize = 4096;
inline constexpr double kDefaultTimeoutSeconds = 300;

struct World {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  double timeout_s = kDefaultTimeoutSeconds;
  std::string source = "default";  // which variables it came from ("RANK/WORLD_SIZE", "Open MPI", ...)

  bool is_root() const { return rank == 0; }
  // "rank 1 of 4 (local 1 of 4), rendezvous 10.0.0.1:29500"
  std::string describe() const;
};

// Reads the contract through getenv (a parameter so tests need not touch the process environment). Throws
// retort::Error naming the variable and its value on a malformed number, a rank outside [0, size), a size
// outside [1, kMaxWorldSize], a LOCAL_RANK that does not fit, a port outside [1, 65535], a missing
// MASTER_ADDR in a world larger than 1, a rank given without a size (or the reverse), or two launchers'
// variables that disagree.
World world_from_env(const std::function<const char*(const char*)>& getenv);
// The same from the process environment.
World world_from_env();

}  // namespace retort::dist
