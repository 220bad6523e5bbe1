// The file primitives below io (atomic_file.h).
#include "atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <utility>

namespace retort {

void file_error(const std::string& path, const std::string& message) {
  RT_FAIL(path, ": ", message);
}

std::string errno_text() {
  return std::strerror(errno);
}

// ---- reading --------------------------------------------------------------------------------------------

int open_regular(const std::string& path, size_t& size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) file_error(path, "cannot open: " + errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    std::string why = errno_text();
    ::close(fd);
    file_error(path, "cannot stat: " + why);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    file_error(path, "not a regular file");
  }
  size = size_t(st.st_size);
  return fd;
}

std::vector<uint8_t> read_file(const std::string& path) {
  size_t size = 0;
  int fd = open_regular(path, size);
  std::vector<uint8_t> out(size);
  size_t got = 0;
  while (got < size) {
    ssize_t r = ::read(fd, out.data() + got, size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      std::string why = r < 0 ? errno_text() : "unexpected end of file (did it shrink while being read?)";
      ::close(fd);
      file_error(path, "read failed after " + std::to_string(got) + " of " + std::to_string(size) +
                           " bytes: " + why);
    }
    got += size_t(r);
  }
  ::close(fd);
  return out;
}

std::string read_text_file(const std::string& path) {
  std::vector<uint8_t> b = read_file(path);
  return std::string(b.begin(), b.end());
}

// ---- writing --------------------------------------------------------------------------------------------

namespace {
constexpr size_t kWriteBuffer = size_t(1) << 20;

void write_all(int fd, const uint8_t* p, size_t n, const std::string& path, const std::string& tmp) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) file_error(path, "write to " + tmp + " failed: " + errno_text());
    p += w;
    n -= size_t(w);
  }
}
}  // namespace

FileWriter::FileWriter(Key, int fd, std::string path, std::string tmp_path)
    : fd_(fd), path_(std::move(path)), tmp_path_(std::move(tmp_path)) {
  buf_.reserve(kWriteBuffer);
}

void FileWriter::write(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  written_ += n;
  if (buf_.size() + n > kWriteBuffer) {
    flush();
    if (n >= kWriteBuffer) {  // large blocks go straight to the file
      write_all(fd_, p, n, path_, tmp_path_);
      return;
    }
  }
  buf_.insert(buf_.end(), p, p + n);
}

void FileWriter::write_at(uint64_t offset, const void* data, size_t n) {
  if (offset + n > written_)
    file_error(path_, "write_at(" + std::to_string(offset) + ", " + std::to_string(n) +
                          ") past the bytes written so far (" + std::to_string(written_) + ")");
  flush();
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t w = ::pwrite(fd_, p, n, off_t(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) file_error(path_, "write to " + tmp_path_ + " failed: " + errno_text());
    p += w;
    n -= size_t(w);
    offset += uint64_t(w);
  }
}

void FileWriter::flush() {
  if (buf_.empty()) return;
  write_all(fd_, buf_.data(), buf_.size(), path_, tmp_path_);
  buf_.clear();
}

namespace {

// Removes "<path>.tmp.<pid>" files that a writer killed before its rename left behind: only those whose pid
// names no live process (a live one may be another writer at work). Best effort: a directory that cannot be
// read, or a temporary that cannot be removed, is left alone; the write itself goes on.
void remove_stale_temps(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const std::string prefix = (slash == std::string::npos ? path : path.substr(slash + 1)) + ".tmp.";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name(e->d_name);
    if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) continue;
    const std::string_view digits = name.substr(prefix.size());
    if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string_view::npos) continue;
    const pid_t pid = pid_t(std::stol(std::string(digits)));
    if (pid <= 0 || pid == ::getpid()) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to signal: maybe alive
    ::unlink((dir + "/" + std::string(name)).c_str());
  }
  ::closedir(d);
}

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  remove_stale_temps(path_);
  tmp_ = path_ + ".tmp." + std::to_string(::getpid());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) file_error(path_, "cannot create the temporary file " + tmp_ + ": " + errno_text());
  try {
    writer_ = std::make_unique<FileWriter>(FileWriter::Key(), fd_, path_, tmp_);
  } catch (...) {
    abandon();
    throw;
  }
}

AtomicFile::~AtomicFile() {
  if (!done_) abandon();
}

void AtomicFile::abandon() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  done_ = true;
}

void AtomicFile::commit() {
  if (done_) file_error(path_, "commit() after the file was already committed or abandoned");
  try {
    writer_->flush();
    // fsync before rename: otherwise a crash can leave the new name pointing at a file whose blocks never
    // reached the disk, which is exactly the torn file this class exists to prevent.
    if (::fsync(fd_) != 0) file_error(path_, "fsync of " + tmp_ + " failed: " + errno_text());
    int closing = std::exchange(fd_, -1);
    if (::close(closing) != 0) file_error(path_, "close of " + tmp_ + " failed: " + errno_text());
    if (::rename(tmp_.c_str(), path_.c_str()) != 0)
      file_error(path_, "cannot rename " + tmp_ + " to it: " + errno_text());
  } catch (...) {
    abandon();
    throw;
  }
  done_ = true;
  // Make the rename itself durable. Best effort: some file systems refuse to fsync a directory.
  size_t slash = path_.find_last_of('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path_.substr(0, slash));
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomic(const std::string& path, const std::function<void(FileWriter&)>& fill) {
  AtomicFile f(path);
  fill(f.writer());
  f.commit();
}

void write_file_atomic(const std::string& path, const void* data, size_t n) {
  write_file_atomic(path, [&](FileWriter& w) { w.write(data, n); });
}

}  // namespace retort
