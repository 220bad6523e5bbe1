// The thread pool: coverage of every index for many sizes, exceptions, nesting, concurrent callers, and the
// pool size; and that CPU results do not depend on the number of threads.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "core/thread_pool.h"
#include "harness.h"

namespace retort::test {
namespace {

TEST(ThreadPool, SizeIsSettable) {
  for (int n : {1, 2, 3, 8}) EXPECT_EQ(ThreadPool(n).size(), n);
  int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_EQ(ThreadPool(0).size(), hw);
  EXPECT_EQ(ThreadPool(-3).size(), hw);
  EXPECT_EQ(CpuBackend(3).threads(), 3);
  EXPECT_EQ(CpuBackend(1).pool().size(), 1);
}

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 4, 7, 16}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 3, 5, 16, 17, 100, 1000, 4097}) {
      for (int64_t chunk : {1, 3, 64, 10000}) {
        std::vector<std::atomic<int>> hits(size_t(n) + 1);
        std::mutex mu;
        std::vector<std::pair<int64_t, int64_t>> ranges;
        pool.parallel_for(
            n,
            [&](int64_t b, int64_t e) {
              for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
              std::lock_guard<std::mutex> lock(mu);
              ranges.emplace_back(b, e);
            },
            chunk);
        SCOPED_TRACE("threads " + std::to_string(threads) + ", n " + std::to_string(n) + ", chunk " +
                     std::to_string(chunk));
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "index " << i;
        if (n == 0) {
          EXPECT_TRUE(ranges.empty());
          continue;
        }
        // At most one range per thread, none empty, each at least min_chunk long unless there is only one.
        EXPECT_LE(int(ranges.size()), threads);
        for (auto [b, e] : ranges) {
          EXPECT_LT(b, e);
          if (ranges.size() > 1) {
            EXPECT_GE(e - b, chunk);
          }
        }
      }
    }
  }
}

TEST(ThreadPool, ManySmallJobsInARow) {
  ThreadPool pool(4);
  std::atomic<int64_t> total{0};
  for (int k = 0; k < 5000; ++k) pool.parallel_for(8, [&](int64_t b, int64_t e) { total += e - b; });
  EXPECT_EQ(total.load(), 5000 * 8);
}

TEST(ThreadPool, ExceptionsPropagate) {
  ThreadPool pool(4);
  // Thrown from the last share (a worker thread) and from the first (the calling thread).
  for (int64_t bad : {int64_t(999), int64_t(0)}) {
    std::atomic<int64_t> done{0};
    try {
      pool.parallel_for(1000, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          if (i == bad) throw std::runtime_error("boom at " + std::to_string(i));
          done++;
        }
      });
      FAIL() << "expected an exception";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "boom at " + std::to_string(bad));
    }
    EXPECT_GT(done.load(), 0);  // the other shares still ran
  }
  // Every share throws: exactly one exception comes out, and it is one of them.
  EXPECT_THROW(pool.parallel_for(100, [](int64_t, int64_t) { throw Error("all"); }), Error);
  // The pool still works afterwards.
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950);
}

TEST(ThreadPool, SingleThreadExceptionPropagates) {
  ThreadPool pool(1);
  EXPECT_THROW(pool.parallel_for(10, [](int64_t, int64_t) { throw std::logic_error("x"); }),
               std::logic_error);
}

TEST(ThreadPool, NestedParallelForRunsInline) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(64 * 32);
  std::atomic<int> inner_calls{0};
  pool.parallel_for(64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      std::thread::id outer = std::this_thread::get_id();
      pool.parallel_for(32, [&](int64_t b2, int64_t e2) {
        // Inline: the nested body runs whole, on the thread that asked for it.
        EXPECT_EQ(std::this_thread::get_id(), outer);
        EXPECT_EQ(b2, 0);
        EXPECT_EQ(e2, 32);
        inner_calls++;
        for (int64_t j = b2; j < e2; ++j) hits[size_t(i * 32 + j)]++;
      });
    }
  });
  EXPECT_EQ(inner_calls.load(), 64);
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPool, ConcurrentCallersShareOnePool) {
  ThreadPool pool(3);
  std::atomic<int64_t> totals[4] = {};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&, c] {
      for (int k = 0; k < 200; ++k)
        pool.parallel_for(
            1000, [&](int64_t b, int64_t e) { totals[c] += e - b; }, 10);
    });
  for (auto& t : callers) t.join();
  for (auto& t : totals) EXPECT_EQ(t.load(), 200 * 1000);
}

TEST(ThreadPool, ResultsDoNotDependOnThreadCount) {
  // Elementwise results are bit-equal across thread counts; reductions agree to f32 rounding.
  reseed("pool_threads");
  Vec xv = random_vec(300 * 257);
  std::vector<float> ew[2], red[2];
  int counts[2] = {1, 5};
  for (int k = 0; k < 2; ++k) {
    CpuBackend be(counts[k]);
    Context ctx(be);
    Tensor* x = ctx.input(DType::F32, {300, 257}, "x");
    set_data(x, std::vector<float>(xv.begin(), xv.end()));
    Tensor* y = gelu(ctx, mul(ctx, x, transpose(ctx, transpose(ctx, x))));
    Tensor* s = add(ctx, sum_rows(ctx, y), sum(ctx, y));
    y->flags |= kOutput;
    s->flags |= kOutput;
    Graph g(ctx);
    g.forward(y);
    g.forward(s);
    g.compute();
    ew[k] = get_data(y);
    red[k] = get_data(s);
  }
  EXPECT_EQ(ew[0], ew[1]);
  EXPECT_LE(nmse(to_f64(red[0]), to_f64(red[1])), 1e-13);
}

}  // namespace
}  // namespace retort::test
