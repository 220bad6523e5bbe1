// The programs' command line and run: flags, the one place every failure is reported (run_main), stopping
// on Ctrl-C, and output paths checked before any work. Declared in common.h.
#include <cerrno>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <fcntl.h>
#include <unistd.h>

#include "common.h"

namespace ex {

// ---- command line ---------------------------------------------------------------------------------------

void Args::fail(const std::string& msg) const {
  throw UsageError(msg);
}

void Args::check_machine(int threads, const std::string& device) const {
  check(threads >= 0 && threads <= 1024,
        "--threads must be in [0, 1024] (0: all cores), got " + std::to_string(threads));
  check(device == "auto" || device == "cpu" || device == "cuda",
        "--device is auto, cpu or cuda, got '" + device + "'");
}

void Args::check_model(const TransformerConfig& c) const {
  const auto in = [&](const std::string& flag, int64_t v, int64_t lo, int64_t hi) {
    check(v >= lo && v <= hi, flag + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                  "], got " + std::to_string(v));
  };
  in("--layers", c.layers, 1, 1024);
  in("--d-model", c.d_model, 2, 65536);
  in("--heads", c.heads, 1, 1024);
  in("--kv-heads", c.kv_heads, 0, 1024);
  in("--d-ff", c.d_ff, 0, 1 << 20);
  in("--context", c.context, 0, 1 << 20);
}

int run_main(const std::string& prog, const std::function<int()>& body,
             const std::function<std::string()>& memory_hint) {
  const auto hint = [&]() -> std::string {
    if (!memory_hint) return "";
    try {
      return "; " + memory_hint();
    } catch (...) {
      return "";
    }
  };
  // Output already on the line (a progress bar) would run into the message: end that line first.
  const auto report = [&](const std::string& msg) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s%s: %s\n", isatty(1) ? "\n" : "", prog.c_str(), msg.c_str());
  };
  try {
    return body();
  } catch (const UsageError& e) {
    report(std::string(e.what()) + "\n(run " + prog + " --help for the options)");
    return 2;
  } catch (const Error& e) {
    const std::string what = e.what();
    const bool oom =
        what.find("cannot allocate") != std::string::npos || what.find("out of memory") != std::string::npos;
    report(what + (oom ? hint() : ""));
    return 1;
  } catch (const std::bad_alloc&) {
    report("out of memory: an allocation failed" + hint());
    return 1;
  } catch (const std::system_error& e) {
    report(std::string("the system refused: ") + e.what() + " (" + e.code().message() + ")");
    return 1;
  } catch (const std::exception& e) {
    report(std::string("failed: ") + e.what());
    return 1;
  } catch (...) {
    report("failed with an unknown exception");
    return 1;
  }
}

// ---- stopping -------------------------------------------------------------------------------------------

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;
char g_stop_message[256];

extern "C" void on_stop_signal(int sig) {
  if (g_stop_signal != 0) {
    // The second request: no more waiting for the step.
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_stop_signal = sig;
  const ssize_t n = write(2, g_stop_message, std::strlen(g_stop_message));
  (void)n;
}
}  // namespace

void install_stop_handler(const std::string& prog) {
  std::snprintf(g_stop_message, sizeof g_stop_message,
                "\n%s: stopping at the end of this step to save the run (press Ctrl-C again to abort)\n",
                prog.c_str());
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART;  // a read or write under way goes on rather than failing with EINTR
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

bool stop_requested() {
  return g_stop_signal != 0;
}
int stop_signal() {
  return int(g_stop_signal);
}
int stopped_status() {
  return 128 + (g_stop_signal ? int(g_stop_signal) : SIGINT);
}

// ---- output paths ---------------------------------------------------------------------------------------

namespace {
// Creates dir (and its parents) and proves it writable by creating and removing a file in it.
void check_writable_dir(const std::filesystem::path& dir, const std::string& what, const std::string& flag) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path d = dir.empty() ? fs::path(".") : dir;
  if (!fs::exists(d, ec)) {
    fs::create_directories(d, ec);
    if (ec)
      throw UsageError(flag + " " + what + ": cannot create the directory " + d.string() + " (" +
                       ec.message() + ")");
  }
  if (!fs::is_directory(d, ec))
    throw UsageError(flag + " " + what + ": " + d.string() + " is not a directory");
  const std::string probe = (d / (".retort-write-check." + std::to_string(getpid()))).string();
  const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_EXCL, 0600);
  if (fd < 0)
    throw UsageError(flag + " " + what + ": cannot write in " + d.string() + " (" + std::strerror(errno) +
                     ")");
  ::close(fd);
  ::unlink(probe.c_str());
}
}  // namespace

void check_output_path(const std::string& path, const std::string& flag) {
  namespace fs = std::filesystem;
  if (path.empty()) throw UsageError(flag + " is empty");
  std::error_code ec;
  if (fs::is_directory(path, ec))
    throw UsageError(flag + " " + path + " is a directory; give a file name (e.g. " +
                     (fs::path(path) / "model.safetensors").string() + ")");
  check_writable_dir(fs::path(path).parent_path(), path, flag);
  remove_stale_temporaries(path);
}

int remove_stale_temporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p = fs::absolute(path);
  const std::string stem = p.filename().string() + ".tmp.";
  std::error_code ec;
  int removed = 0;
  for (const auto& e : fs::directory_iterator(p.parent_path(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= stem.size() || name.compare(0, stem.size(), stem) != 0) continue;
    const std::string pid = name.substr(stem.size());
    if (pid.find_first_not_of("0123456789") != std::string::npos || pid.size() > 9) continue;
    // A live process may be writing it (another run on the same path): only a dead writer's file goes.
    if (::kill(pid_t(std::stol(pid)), 0) == 0 || errno != ESRCH) continue;
    removed += fs::remove(e.path(), ec) ? 1 : 0;
  }
  return removed;
}

void check_output_prefix(const std::string& prefix, const std::string& flag) {
  namespace fs = std::filesystem;
  if (prefix.empty()) throw UsageError(flag + " is empty");
  if (prefix.back() == '/')
    throw UsageError(flag + " " + prefix + " names a directory; give a prefix for the files (e.g. " + prefix +
                     "data)");
  check_writable_dir(fs::path(prefix).parent_path(), prefix, flag);
}

void Args::add(const std::string& flag, int64_t* v) {
  setters_[flag] = [this, flag, v](const std::string& s) {
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end) fail(flag + " wants an integer, got '" + s + "'");
    if (errno == ERANGE) fail(flag + " " + s + " is out of range");
    *v = x;
  };
}
void Args::add(const std::string& flag, int* v) {
  setters_[flag] = [this, flag, v](const std::string& s) {
    char* end = nullptr;
    errno = 0;
    const long x = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end) fail(flag + " wants an integer, got '" + s + "'");
    if (errno == ERANGE || x < INT_MIN || x > INT_MAX) fail(flag + " " + s + " is out of range");
    *v = int(x);
  };
}
void Args::add(const std::string& flag, uint64_t* v) {
  setters_[flag] = [this, flag, v](const std::string& s) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long x = std::strtoull(s.c_str(), &end, 10);
    if (s.empty() || *end || s[0] == '-') fail(flag + " wants a non-negative integer, got '" + s + "'");
    if (errno == ERANGE) fail(flag + " " + s + " is out of range");
    *v = x;
  };
}
void Args::add(const std::string& flag, double* v) {
  setters_[flag] = [this, flag, v](const std::string& s) {
    char* end = nullptr;
    const double x = std::strtod(s.c_str(), &end);
    if (s.empty() || *end || !std::isfinite(x)) fail(flag + " wants a number, got '" + s + "'");
    *v = x;
  };
}
void Args::add(const std::string& flag, float* v) {
  setters_[flag] = [this, flag, v](const std::string& s) {
    char* end = nullptr;
    const double x = std::strtod(s.c_str(), &end);
    if (s.empty() || *end || !std::isfinite(x)) fail(flag + " wants a number, got '" + s + "'");
    *v = float(x);
  };
}
void Args::add(const std::string& flag, std::string* v) {
  setters_[flag] = [v](const std::string& s) { *v = s; };
}
void Args::add(const std::string& flag, bool* v) {
  setters_[flag] = [this, flag, v](const std::string& s) {
    if (s == "1" || s == "true" || s == "on" || s == "yes")
      *v = true;
    else if (s == "0" || s == "false" || s == "off" || s == "no")
      *v = false;
    else
      fail(flag + " wants 0 or 1, got '" + s + "'");
  };
}

void Args::parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    if (f == "--help" || f == "-h") {
      std::fputs(help_.c_str(), stdout);
      std::exit(0);
    }
    std::string value;
    const size_t eq = f.find('=');
    const bool inline_value = f.rfind("--", 0) == 0 && eq != std::string::npos;
    if (inline_value) {
      value = f.substr(eq + 1);
      f.resize(eq);
    }
    const auto it = setters_.find(f);
    if (it == setters_.end())
      fail(f.rfind("-", 0) == 0 ? "unknown option " + f
                                : "unexpected argument '" + f + "' (options start with --)");
    if (!inline_value) {
      if (i + 1 >= argc) fail(f + " needs a value");
      value = argv[++i];
    }
    it->second(value);
    given_[f] = true;
  }
}

}  // namespace ex
