// The file primitives every layer that keeps files needs: reading a whole file, and writing one atomically
// (temporary name, fsync, rename: a crash leaves either the old file or the new one, never a torn one). They
// live in core so that io's formats and the CUDA backend's GEMM tune cache share them without an include
// across layers. Every failure throws retort::Error naming the file and the fault.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "error.h"

namespace retort {

// "<path>: <message>" as a retort::Error.
[[noreturn]] void file_error(const std::string& path, const std::string& message);
// strerror(errno), for the messages of failed system calls.
std::string errno_text();

// ---- reading --------------------------------------------------------------------------------------------
// Opens path read-only and checks it is a regular file; returns the descriptor (the caller closes it) and its
// size. Throws retort::Error "<path>: cannot open: <reason>" and the like.
int open_regular(const std::string& path, size_t& size);
// The whole file in memory. Throws retort::Error "<path>: cannot open: <reason>" and the like.
std::vector<uint8_t> read_file(const std::string& path);
// The whole file as a string (text formats).
std::string read_text_file(const std::string& path);

// ---- writing --------------------------------------------------------------------------------------------
// Buffered sequential writer into an AtomicFile's temporary file. write() appends; write_at() overwrites
// bytes already written (for a header whose checksum is known only at the end). Errors throw retort::Error
// naming the final path.
class FileWriter {
 public:
  // Only an AtomicFile can make the key, so only an AtomicFile makes writers.
  class Key {
    Key() = default;
    friend class AtomicFile;
  };
  FileWriter(Key, int fd, std::string path, std::string tmp_path);

  void write(const void* data, size_t n);
  void write(std::span<const uint8_t> s) { write(s.data(), s.size()); }
  void write_at(uint64_t offset, const void* data, size_t n);
  uint64_t bytes_written() const { return written_; }
  const std::string& path() const { return path_; }  // the final path, for messages

  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

 private:
  friend class AtomicFile;
  void flush();
  int fd_;
  std::string path_, tmp_path_;
  std::vector<uint8_t> buf_;
  uint64_t written_ = 0;  // logical size: bytes in the file plus bytes buffered
};

// A file written under "<path>.tmp.<pid>" and renamed over path by commit() after an fsync (then the
// directory is fsync'ed), so a crash leaves the old file or the new one, never a torn one. Destroyed without
// commit() (an exception, an abandoned writer), it removes the temporary file and leaves the old file
// untouched. One writer per path at a time within a process (the temporary name is per process). Opening one
// removes the temporaries of the same path that writers killed before their rename left (those whose pid is
// no live process).
class AtomicFile {
 public:
  // Creates the temporary file; throws retort::Error naming path when it cannot (missing directory, ...).
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  FileWriter& writer() { return *writer_; }
  // Flush, fsync, rename. Throws retort::Error naming path on any failure (the temporary file is removed).
  void commit();
  const std::string& path() const { return path_; }

 private:
  void abandon() noexcept;
  std::string path_, tmp_;
  int fd_ = -1;
  std::unique_ptr<FileWriter> writer_;
  bool done_ = false;
};

// Writes path atomically with an AtomicFile: fill() writes, then commit(). If fill() throws, the old file is
// untouched, the temporary removed, and the exception propagates.
void write_file_atomic(const std::string& path, const std::function<void(FileWriter&)>& fill);
// Atomic write of one buffer.
void write_file_atomic(const std::string& path, const void* data, size_t n);

}  // namespace retort
