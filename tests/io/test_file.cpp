#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "io/file.h"
#include "io_test_util.h"
#include "retort.h"

namespace retort::test {
namespace {

using namespace retort::io;

TEST(Crc32, KnownVectors) {
  EXPECT_EQ(crc32("", 0), 0u);
  EXPECT_EQ(crc32("123456789", 9), 0xCBF43926u);
  const char* fox = "The quick brown fox jumps over the lazy dog";
  EXPECT_EQ(crc32(fox, std::strlen(fox)), 0x414FA339u);
  std::vector<uint8_t> zeros(32, 0);
  EXPECT_EQ(crc32(zeros.data(), zeros.size()), 0x190A55ADu);
}

// Every length from 0 to 600 (below, at and past the folding path's 64-byte start and its 16- and 64-byte
// steps), every start alignment and a carried-in register, against a bit-at-a-time reference; and 3 MB.
TEST(Crc32, EveryLengthAlignmentAndRegisterMatchesTheBitwiseReference) {
  auto bitwise = [](uint32_t crc, const uint8_t* p, size_t n) {
    uint32_t r = ~crc;
    for (size_t i = 0; i < n; ++i) {
      r ^= p[i];
      for (int k = 0; k < 8; ++k) r = (r & 1u) ? (0xEDB88320u ^ (r >> 1)) : (r >> 1);
    }
    return ~r;
  };
  std::vector<uint8_t> data(size_t(3) << 20);
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (uint8_t& b : data) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    b = uint8_t(s >> 24);
  }
  for (size_t n = 0; n <= 600; ++n)
    for (size_t off : {size_t(0), size_t(1), size_t(7), size_t(13)}) {
      const uint32_t in = uint32_t(n * 2654435761u + off);
      ASSERT_EQ(crc32_update(in, data.data() + off, n), bitwise(in, data.data() + off, n))
          << "length " << n << " offset " << off;
    }
  EXPECT_EQ(crc32_update(0x12345678u, data.data() + 3, data.size() - 3),
            bitwise(0x12345678u, data.data() + 3, data.size() - 3));
}

TEST(Crc32, StreamingEqualsOneShotAtEverySplit) {
  // The slice-by-8 loop and the byte tail must agree wherever a buffer is cut.
  std::vector<uint8_t> data(301);
  for (size_t i = 0; i < data.size(); ++i) data[i] = uint8_t((i * 131 + 7) ^ (i >> 3));
  uint32_t whole = crc32(data.data(), data.size());
  for (size_t cut = 0; cut <= data.size(); ++cut) {
    uint32_t c = crc32_update(0, data.data(), cut);
    c = crc32_update(c, data.data() + cut, data.size() - cut);
    ASSERT_EQ(c, whole) << "cut at " << cut;
  }
  // And against a bit-at-a-time reference.
  uint32_t ref = 0xFFFFFFFFu;
  for (uint8_t b : data) {
    ref ^= b;
    for (int k = 0; k < 8; ++k) ref = (ref & 1u) ? (0xEDB88320u ^ (ref >> 1)) : (ref >> 1);
  }
  EXPECT_EQ(whole, ~ref);
}

TEST(LittleEndian, RoundTripsAndByteOrder) {
  uint8_t b[8];
  store_le32(b, 0x11223344u);
  EXPECT_EQ(b[0], 0x44);
  EXPECT_EQ(b[3], 0x11);
  EXPECT_EQ(load_le32(b), 0x11223344u);
  store_le64(b, 0x0102030405060708ull);
  EXPECT_EQ(b[0], 0x08);
  EXPECT_EQ(b[7], 0x01);
  EXPECT_EQ(load_le64(b), 0x0102030405060708ull);
  store_le16(b, 0xBEEF);
  EXPECT_EQ(b[0], 0xEF);
  EXPECT_EQ(load_le16(b), 0xBEEF);
  std::vector<uint8_t> v;
  append_le16(v, 1);
  append_le32(v, 2);
  append_le64(v, 3);
  ASSERT_EQ(v.size(), 14u);
  EXPECT_EQ(load_le16(v.data()), 1);
  EXPECT_EQ(load_le32(v.data() + 2), 2u);
  EXPECT_EQ(load_le64(v.data() + 6), 3u);
}

TEST(AtomicWrite, WritesAndReplaces) {
  ScratchDir dir;
  std::string p = dir.file("a.bin");
  write_file_atomic(p, "hello", 5);
  EXPECT_EQ(read_text_file(p), "hello");
  write_file_atomic(p, [](FileWriter& w) {
    w.write("0123456789", 10);
    w.write_at(2, "AB", 2);  // patch bytes already written, like a header checksum
    w.write("!", 1);
    EXPECT_EQ(w.bytes_written(), 11u);
  });
  EXPECT_EQ(read_text_file(p), "01AB456789!");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"a.bin"});
}

TEST(AtomicWrite, LargeWritesCrossTheBuffer) {
  ScratchDir dir;
  std::string p = dir.file("big.bin");
  std::vector<uint8_t> big(3u << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = uint8_t(i * 2654435761u >> 24);
  write_file_atomic(p, [&](FileWriter& w) {
    w.write(big.data(), 100);
    w.write(big.data() + 100, big.size() - 200);  // larger than the buffer: goes straight through
    w.write(big.data() + big.size() - 100, 100);
    w.write_at(big.size() - 4, big.data() + big.size() - 4, 4);
  });
  EXPECT_EQ(slurp(p), big);
}

TEST(AtomicWrite, ThrowingWriterLeavesOldFileIntact) {
  ScratchDir dir;
  std::string p = dir.file("ckpt.bin");
  write_file_atomic(p, "old contents", 12);
  struct Boom {};
  EXPECT_THROW(write_file_atomic(p,
                                 [](FileWriter& w) {
                                   std::vector<uint8_t> half(2u << 20, 0xAB);  // well past the buffer
                                   w.write(half.data(), half.size());
                                   throw Boom{};
                                 }),
               Boom);
  EXPECT_EQ(read_text_file(p), "old contents");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"ckpt.bin"}) << "the temporary file must be removed";
}

TEST(AtomicWrite, AbandonedAtomicFileLeavesNothing) {
  ScratchDir dir;
  std::string p = dir.file("x.bin");
  {
    AtomicFile f(p);
    f.writer().write("partial", 7);
    // no commit
  }
  EXPECT_TRUE(dir.entries().empty());
  AtomicFile f(p);
  f.writer().write("done", 4);
  f.commit();
  EXPECT_EQ(read_text_file(p), "done");
  expect_error([&] { f.commit(); }, {p, "already committed"});
}

TEST(AtomicWrite, UnwritableDirectoryNamesThePath) {
  std::string p = "/nonexistent-retort-dir/sub/file.bin";
  expect_error([&] { write_file_atomic(p, "x", 1); }, {p, "cannot create the temporary file", ".tmp."});
}

TEST(AtomicWrite, WriteAtPastTheEndThrows) {
  ScratchDir dir;
  std::string p = dir.file("w.bin");
  expect_error(
      [&] {
        write_file_atomic(p, [](FileWriter& w) {
          w.write("abc", 3);
          w.write_at(2, "xy", 2);
        });
      },
      {p, "write_at"});
  EXPECT_TRUE(dir.entries().empty());
}

TEST(ReadFile, ErrorsNameTheFile) {
  ScratchDir dir;
  expect_error([&] { read_file(dir.file("missing.bin")); }, {"missing.bin", "cannot open"});
  expect_error([&] { read_file(dir.path()); }, {dir.path(), "not a regular file"});
  expect_error([&] { MappedFile m(dir.file("missing.bin")); }, {"missing.bin", "cannot open"});
}

TEST(MappedFile, MapsContentsAndEmptyFiles) {
  ScratchDir dir;
  std::string p = dir.file("m.bin");
  write_file_atomic(p, "mapped!", 7);
  MappedFile m(p);
  ASSERT_EQ(m.size(), 7u);
  EXPECT_EQ(std::memcmp(m.data(), "mapped!", 7), 0);
  MappedFile moved = std::move(m);
  EXPECT_EQ(moved.size(), 7u);
  EXPECT_EQ(m.size(), 0u);
  write_file_atomic(dir.file("e.bin"), "", 0);
  MappedFile e(dir.file("e.bin"));
  EXPECT_EQ(e.size(), 0u);
  EXPECT_EQ(e.data(), nullptr);
}

TEST(ByteReader, BoundsChecksNameFieldOffsetAndFile) {
  std::vector<uint8_t> b = {'M', 'A', 'G', 'I', 'C', 1, 0, 0, 0, 7};
  ByteReader r(b, "some/file.bin");
  r.expect_magic("MAGIC", "test");
  EXPECT_EQ(r.u32("version"), 1u);
  EXPECT_EQ(r.u8("byte"), 7);
  std::string m = expect_error([&] { r.u32("count"); }, {"some/file.bin", "truncated", "count", "offset 10"});
  ByteReader bad(b, "other.bin");
  expect_error([&] { bad.expect_magic("RTXX\x01", "retort thing"); },
               {"other.bin", "wrong magic", "\"RTXX\\x01\"", "\"MAGIC\"", "not a retort thing file"});
  std::vector<uint8_t> tiny = {'M'};
  ByteReader short_r(tiny, "tiny.bin");
  expect_error([&] { short_r.expect_magic("MAGIC", "test"); }, {"tiny.bin", "truncated", "too short"});
}

// Issue 25: a writer killed before its rename left "<path>.tmp.<pid>" behind for good. The next write to the
// same path removes those of dead processes, and keeps a live writer's and other paths' temporaries.
TEST(AtomicWrite, StaleTemporariesOfDeadWritersAreRemoved) {
  ScratchDir dir;
  const std::string p = dir.file("ck.bin");
  const pid_t dead = fork();
  ASSERT_GE(dead, 0);
  if (dead == 0) _exit(0);
  int status = 0;
  ASSERT_EQ(waitpid(dead, &status, 0), dead);
  const std::string stale = p + ".tmp." + std::to_string(dead);
  const std::string live = p + ".tmp." + std::to_string(getppid());
  const std::string other = dir.file("other.bin") + ".tmp." + std::to_string(dead);
  const std::string odd = p + ".tmp.x1";
  for (const std::string& f : {stale, live, other, odd}) spit(f, {1, 2, 3});
  write_file_atomic(p, "new", 3);
  EXPECT_EQ(read_text_file(p), "new");
  const std::vector<std::string> e = dir.entries();
  auto has = [&](const std::string& f) {
    return std::find(e.begin(), e.end(), f.substr(f.rfind('/') + 1)) != e.end();
  };
  EXPECT_FALSE(has(stale)) << "the dead writer's temporary stayed";
  EXPECT_TRUE(has(live)) << "a live process's temporary was removed";
  EXPECT_TRUE(has(other));
  EXPECT_TRUE(has(odd));
}

}  // namespace
}  // namespace retort::test
