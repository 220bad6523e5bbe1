#include "tcp_group.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "../core/checked.h"
#include "../core/error.h"

namespace retort::dist {

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kMagic = 0x47445452;  // "RTDG"
constexpr uint32_t kVersion = 1;

enum OpCode : uint32_t { kAllReduce = 1, kBroadcast, kAllGather, kReduceScatter, kBarrier, kSumI64, kSumF64 };

const char* op_text(uint32_t op) {
  switch (op) {
    case kAllReduce: return "all_reduce";
    case kBroadcast: return "broadcast";
    case kAllGather: return "all_gather";
    case kReduceScatter: return "reduce_scatter";
    case kBarrier: return "barrier";
    case kSumI64: return "sum of counts";
    case kSumF64: return "sum of doubles";
  }
  return "unknown call";
}

// What every rank says before its part of a call; rank 0 checks that all say the same.
struct Header {
  uint32_t op = 0, dtype = 0, root = 0, pad = 0;
  uint64_t count = 0;
  bool operator==(const Header&) const = default;
};

std::string header_text(const Header& h) {
  return detail::concat(op_text(h.op), " of ", h.count, " elements (dtype ", h.dtype, ", root ", h.root, ")");
}

double seconds_left(Clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

// Waits until fd is ready for `events` or the deadline passes (then throws naming the peer).
void wait_ready(int fd, short events, Clock::time_point deadline, const std::string& peer, double timeout_s) {
  for (;;) {
    const double left = seconds_left(deadline);
    RT_CHECK(left > 0, "distributed: no answer from ", peer, " within ", timeout_s,
             " s (is it hung or dead? RETORT_DIST_TIMEOUT sets the limit)");
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, int(std::min(left * 1000.0, 1000.0)) + 1);
    if (r > 0) return;
    RT_CHECK(r == 0 || errno == EINTR, "distributed: poll on the connection to ", peer,
             " failed: ", std::strerror(errno));
  }
}

void send_all(int fd, const void* p, size_t n, Clock::time_point deadline, const std::string& peer,
              double timeout_s) {
  const char* b = static_cast<const char*>(p);
  while (n > 0) {
    wait_ready(fd, POLLOUT, deadline, peer, timeout_s);
    const ssize_t k = ::send(fd, b, n, MSG_NOSIGNAL);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    RT_CHECK(k > 0, "distributed: sending to ", peer, " failed: ", std::strerror(errno),
             " (did it exit?)");
    b += k;
    n -= size_t(k);
  }
}

void recv_all(int fd, void* p, size_t n, Clock::time_point deadline, const std::string& peer,
              double timeout_s) {
  char* b = static_cast<char*>(p);
  while (n > 0) {
    wait_ready(fd, POLLIN, deadline, peer, timeout_s);
    const ssize_t k = ::recv(fd, b, n, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    RT_CHECK(k != 0, "distributed: ", peer, " closed the connection (did it exit or fail?)");
    RT_CHECK(k > 0, "distributed: receiving from ", peer, " failed: ", std::strerror(errno));
    b += k;
    n -= size_t(k);
  }
}

void set_nonblocking_nodelay(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string rank_name(int r) { return "rank " + std::to_string(r); }

// The status word rank 0 sends before its answer: 0, or 1 followed by the text of what went wrong.
void send_status(int fd, const std::string& err, Clock::time_point deadline, int peer, double t) {
  const uint32_t h[2] = {err.empty() ? 0u : 1u, uint32_t(err.size())};
  send_all(fd, h, sizeof h, deadline, rank_name(peer), t);
  if (!err.empty()) send_all(fd, err.data(), err.size(), deadline, rank_name(peer), t);
}

void recv_status(int fd, Clock::time_point deadline, double t) {
  uint32_t h[2];
  recv_all(fd, h, sizeof h, deadline, "rank 0", t);
  if (h[0] == 0) return;
  std::string msg(std::min<uint32_t>(h[1], 4096), '\0');
  recv_all(fd, msg.data(), msg.size(), deadline, "rank 0", t);
  RT_FAIL("distributed: rank 0 reports: ", msg);
}

float load(const void* p, DType t, int64_t i) { return load_f32(p, t, i); }

}  // namespace

struct TcpGroup::Impl {
  int listen_fd = -1;
  std::vector<int> fds;  // rank 0: one per rank (fds[0] unused); others: fds[0] is rank 0
  std::vector<uint8_t> scratch;
  ~Impl() {
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
    if (listen_fd >= 0) ::close(listen_fd);
  }
};

namespace {

int listen_on(int port) {
  const int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  const bool v6 = fd >= 0;
  const int s = v6 ? fd : ::socket(AF_INET, SOCK_STREAM, 0);
  RT_CHECK(s >= 0, "distributed: rank 0 cannot open a socket: ", std::strerror(errno));
  int one = 1, zero = 0;
  ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc;
  if (v6) {
    ::setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // IPv4 peers too
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(uint16_t(port));
    rc = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(uint16_t(port));
    rc = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  if (rc != 0 || ::listen(s, 256) != 0) {
    const int e = errno;
    ::close(s);
    RT_FAIL("distributed: rank 0 cannot listen on port ", port, ": ", std::strerror(e),
            " (is another run using MASTER_PORT=", port, "? pick a free one)");
  }
  set_nonblocking_nodelay(s);
  return s;
}

// Connects to addr:port, retrying until the deadline (rank 0 may start later than this rank).
int connect_to(const World& w, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(w.master_port);
  const int g = ::getaddrinfo(w.master_addr.c_str(), port.c_str(), &hints, &res);
  RT_CHECK(g == 0, "distributed: MASTER_ADDR=", w.master_addr, " does not resolve: ", gai_strerror(g));
  std::string last = "no address";
  for (;;) {
    for (addrinfo* a = res; a; a = a->ai_next) {
      const int s = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (s < 0) continue;
      if (::connect(s, a->ai_addr, a->ai_addrlen) == 0) {
        ::freeaddrinfo(res);
        set_nonblocking_nodelay(s);
        return s;
      }
      last = std::strerror(errno);
      ::close(s);
    }
    if (seconds_left(deadline) <= 0) {
      ::freeaddrinfo(res);
      RT_FAIL("distributed: rank ", w.rank, " could not reach rank 0 at ", w.master_addr, ":", w.master_port,
              " within ", w.timeout_s, " s (", last, "; is rank 0 running, and MASTER_ADDR right?)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

TcpGroup::TcpGroup(const World& world) : world_(world), impl_(std::make_unique<Impl>()) {
  RT_CHECK(world.size >= 1 && world.rank >= 0 && world.rank < world.size, "distributed: bad world ",
           world.describe());
  if (world.size == 1) return;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(world.timeout_s));
  const double t = world.timeout_s;
  if (world.rank != 0) {
    const int fd = connect_to(world, deadline);
    impl_->fds = {fd};
    const uint32_t hello[4] = {kMagic, kVersion, uint32_t(world.rank), uint32_t(world.size)};
    send_all(fd, hello, sizeof hello, deadline, "rank 0", t);
    recv_status(fd, deadline, t);
    return;
  }
  impl_->listen_fd = listen_on(world.master_port);
  impl_->fds.assign(size_t(world.size), -1);
  int joined = 1;
  std::string fault;
  std::vector<int> strays;  // connections that were refused: told why, then closed
  while (joined < world.size && fault.empty()) {
    if (seconds_left(deadline) <= 0) {
      std::string missing;
      for (int r = 1; r < world.size; ++r)
        if (impl_->fds[size_t(r)] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      fault = detail::concat("rank(s) ", missing, " did not join the rendezvous at port ", world.master_port,
                             " within ", t, " s (did they start? same MASTER_ADDR/MASTER_PORT?)");
      break;
    }
    pollfd p{impl_->listen_fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const int fd = ::accept(impl_->listen_fd, nullptr, nullptr);
    if (fd < 0) continue;
    set_nonblocking_nodelay(fd);
    uint32_t hello[4] = {};
    try {
      recv_all(fd, hello, sizeof hello, Clock::now() + std::chrono::seconds(10), "a joining process", 10);
    } catch (const Error&) {
      ::close(fd);  // not one of ours (a port scanner, a stale client): ignore it
      continue;
    }
    std::string why;
    if (hello[0] != kMagic || hello[1] != kVersion)
      why = "a process that is not a retort rank of this version connected to the rendezvous port";
    else if (int(hello[3]) != world.size)
      why = detail::concat("rank ", hello[2], " has WORLD_SIZE=", hello[3], " but rank 0 has WORLD_SIZE=",
                           world.size, " (every rank must be given the same world size)");
    else if (hello[2] == 0 || int(hello[2]) >= world.size)
      why = detail::concat("a process claims rank ", hello[2], " in a world of ", world.size);
    else if (impl_->fds[hello[2]] >= 0)
      why = detail::concat("two processes claim rank ", hello[2], " (each rank needs its own RANK)");
    if (why.empty()) {
      impl_->fds[hello[2]] = fd;
      ++joined;
    } else {
      fault = why;
      strays.push_back(fd);
    }
  }
  for (int fd : strays) {
    try {
      send_status(fd, fault, Clock::now() + std::chrono::seconds(2), -1, 2);
    } catch (const Error&) {
    }
    ::close(fd);
  }
  for (int r = 1; r < world.size; ++r)
    if (impl_->fds[size_t(r)] >= 0) send_status(impl_->fds[size_t(r)], fault, deadline, r, t);
  RT_CHECK(fault.empty(), "distributed: rendezvous failed: ", fault);
}

TcpGroup::~TcpGroup() = default;

// ---- the calls ------------------------------------------------------------------------------------------
// Each call: every rank but 0 sends its header and its part; rank 0 checks the headers, computes and answers
// each rank with a status word and its share of the result.

namespace {

struct Call {
  Header h;
  size_t send_bytes;  // this rank's part
  size_t recv_bytes;  // what each rank gets back
};

}  // namespace

void TcpGroup::all_reduce_sum(void* data, int64_t n, DType dtype) {
  RT_CHECK(n >= 0 && (dtype == DType::F32 || dtype == DType::BF16), "all_reduce_sum: ", n, " elements of ",
           dtype_name(dtype), " (F32 or BF16 expected)");
  if (world_.size == 1 || n == 0) return;
  const size_t bytes = checked_mul(size_t(n), dtype_size(dtype), "all_reduce_sum");
  const double t = world_.timeout_s;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(t));
  const Header h{kAllReduce, uint32_t(dtype), 0, 0, uint64_t(n)};
  if (world_.rank != 0) {
    const int fd = impl_->fds[0];
    send_all(fd, &h, sizeof h, deadline, "rank 0", t);
    send_all(fd, data, bytes, deadline, "rank 0", t);
    recv_status(fd, deadline, t);
    recv_all(fd, data, bytes, deadline, "rank 0", t);
    return;
  }
  std::vector<float> acc(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) acc[size_t(i)] = load(data, dtype, i);
  impl_->scratch.resize(bytes);
  std::string fault;
  for (int r = 1; r < world_.size; ++r) {
    Header got;
    recv_all(impl_->fds[size_t(r)], &got, sizeof got, deadline, rank_name(r), t);
    if (!(got == h)) {
      fault = detail::concat("rank ", r, " called ", header_text(got), " where rank 0 called ", header_text(h),
                             " (the ranks' calls must match)");
      break;
    }
    recv_all(impl_->fds[size_t(r)], impl_->scratch.data(), bytes, deadline, rank_name(r), t);
    for (int64_t i = 0; i < n; ++i) acc[size_t(i)] += load(impl_->scratch.data(), dtype, i);
  }
  if (fault.empty())
    for (int64_t i = 0; i < n; ++i) store_f32(data, dtype, i, acc[size_t(i)]);
  for (int r = 1; r < world_.size; ++r) {
    send_status(impl_->fds[size_t(r)], fault, deadline, r, t);
    if (fault.empty()) send_all(impl_->fds[size_t(r)], data, bytes, deadline, rank_name(r), t);
  }
  RT_CHECK(fault.empty(), "distributed: ", fault);
}

namespace {

// The generic call: parts (rank 0's own first) are gathered on rank 0, `answer` turns them into each rank's
// reply, and every rank returns its own reply.
template <typename Answer>
std::vector<uint8_t> star_call(const World& w, std::vector<int>& fds, const Header& h, const void* part,
                               size_t part_bytes, const std::vector<size_t>& part_sizes, Answer answer) {
  const double t = w.timeout_s;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(t));
  if (w.rank != 0) {
    send_all(fds[0], &h, sizeof h, deadline, "rank 0", t);
    send_all(fds[0], part, part_bytes, deadline, "rank 0", t);
    recv_status(fds[0], deadline, t);
    uint64_t n = 0;
    recv_all(fds[0], &n, sizeof n, deadline, "rank 0", t);
    std::vector<uint8_t> reply(n);
    recv_all(fds[0], reply.data(), n, deadline, "rank 0", t);
    return reply;
  }
  std::vector<std::vector<uint8_t>> parts(size_t(w.size));
  parts[0].assign(static_cast<const uint8_t*>(part), static_cast<const uint8_t*>(part) + part_bytes);
  std::string fault;
  for (int r = 1; r < w.size && fault.empty(); ++r) {
    Header got;
    recv_all(fds[size_t(r)], &got, sizeof got, deadline, rank_name(r), t);
    if (!(got == h)) {
      fault = detail::concat("rank ", r, " called ", header_text(got), " where rank 0 called ", header_text(h),
                             " (the ranks' calls must match)");
      break;
    }
    parts[size_t(r)].resize(part_sizes[size_t(r)]);
    recv_all(fds[size_t(r)], parts[size_t(r)].data(), parts[size_t(r)].size(), deadline, rank_name(r), t);
  }
  std::vector<std::vector<uint8_t>> replies;
  if (fault.empty()) replies = answer(parts);
  for (int r = 1; r < w.size; ++r) {
    send_status(fds[size_t(r)], fault, deadline, r, t);
    if (!fault.empty()) continue;
    const uint64_t n = replies[size_t(r)].size();
    send_all(fds[size_t(r)], &n, sizeof n, deadline, rank_name(r), t);
    send_all(fds[size_t(r)], replies[size_t(r)].data(), n, deadline, rank_name(r), t);
  }
  RT_CHECK(fault.empty(), "distributed: ", fault);
  return std::move(replies[0]);
}

}  // namespace

void TcpGroup::broadcast(void* data, size_t bytes, int root) {
  RT_CHECK(root >= 0 && root < world_.size, "broadcast: root ", root, " is not a rank of ", world_.describe());
  if (world_.size == 1 || bytes == 0) return;
  const Header h{kBroadcast, 0, uint32_t(root), 0, uint64_t(bytes)};
  std::vector<size_t> sizes(size_t(world_.size), 0);
  sizes[size_t(root)] = bytes;
  auto reply = star_call(world_, impl_->fds, h, data, world_.rank == root ? bytes : 0, sizes,
                         [&](const std::vector<std::vector<uint8_t>>& parts) {
                           return std::vector<std::vector<uint8_t>>(size_t(world_.size), parts[size_t(root)]);
                         });
  std::memcpy(data, reply.data(), bytes);
}

void TcpGroup::all_gather(const void* send, void* recv, size_t bytes) {
  if (world_.size == 1) {
    if (bytes) std::memmove(recv, send, bytes);
    return;
  }
  const Header h{kAllGather, 0, 0, 0, uint64_t(bytes)};
  const size_t total = checked_mul(bytes, size_t(world_.size), "all_gather");
  auto reply = star_call(world_, impl_->fds, h, send, bytes, std::vector<size_t>(size_t(world_.size), bytes),
                         [&](const std::vector<std::vector<uint8_t>>& parts) {
                           std::vector<uint8_t> all;
                           all.reserve(total);
                           for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
                           return std::vector<std::vector<uint8_t>>(size_t(world_.size), all);
                         });
  std::memcpy(recv, reply.data(), total);
}

void TcpGroup::reduce_scatter_sum(const void* send, void* recv, int64_t n, DType dtype) {
  RT_CHECK(n >= 0 && (dtype == DType::F32 || dtype == DType::BF16), "reduce_scatter_sum: ", n,
           " elements of ", dtype_name(dtype), " (F32 or BF16 expected)");
  const size_t es = dtype_size(dtype);
  const size_t slice = checked_mul(size_t(n), es, "reduce_scatter_sum");
  const size_t total = checked_mul(slice, size_t(world_.size), "reduce_scatter_sum");
  if (world_.size == 1) {
    if (slice) std::memmove(recv, send, slice);
    return;
  }
  const Header h{kReduceScatter, uint32_t(dtype), 0, 0, uint64_t(n)};
  auto reply = star_call(world_, impl_->fds, h, send, total, std::vector<size_t>(size_t(world_.size), total),
                         [&](const std::vector<std::vector<uint8_t>>& parts) {
                           std::vector<std::vector<uint8_t>> out(size_t(world_.size), std::vector<uint8_t>(slice));
                           for (int r = 0; r < world_.size; ++r)
                             for (int64_t i = 0; i < n; ++i) {
                               const int64_t at = int64_t(r) * n + i;
                               float s = 0;
                               for (const auto& p : parts) s += load(p.data(), dtype, at);
                               store_f32(out[size_t(r)].data(), dtype, i, s);
                             }
                           return out;
                         });
  std::memcpy(recv, reply.data(), slice);
}

template <typename T>
static void host_sum(const World& w, std::vector<int>& fds, std::vector<T>& values, uint32_t op) {
  if (w.size == 1) return;
  const size_t bytes = values.size() * sizeof(T);
  const Header h{op, uint32_t(sizeof(T)), 0, 0, uint64_t(values.size())};
  auto reply = star_call(w, fds, h, values.data(), bytes, std::vector<size_t>(size_t(w.size), bytes),
                         [&](const std::vector<std::vector<uint8_t>>& parts) {
                           std::vector<T> s(values.size(), T(0));
                           for (const auto& p : parts)
                             for (size_t i = 0; i < s.size(); ++i) {
                               T x;
                               std::memcpy(&x, p.data() + i * sizeof(T), sizeof(T));
                               s[i] += x;
                             }
                           std::vector<uint8_t> b(bytes);
                           std::memcpy(b.data(), s.data(), bytes);
                           return std::vector<std::vector<uint8_t>>(size_t(w.size), b);
                         });
  std::memcpy(values.data(), reply.data(), bytes);
}

void TcpGroup::all_reduce_sum(std::vector<int64_t>& values) { host_sum(world_, impl_->fds, values, kSumI64); }
void TcpGroup::all_reduce_sum(std::vector<double>& values) { host_sum(world_, impl_->fds, values, kSumF64); }

void TcpGroup::barrier() {
  if (world_.size == 1) return;
  const Header h{kBarrier, 0, 0, 0, 0};
  star_call(world_, impl_->fds, h, nullptr, 0, std::vector<size_t>(size_t(world_.size), 0),
            [&](const std::vector<std::vector<uint8_t>>&) {
              return std::vector<std::vector<uint8_t>>(size_t(world_.size));
            });
}

}  // namespace retort::dist
