// The read-throughput cap.  Only lower bounds on elapsed time are asserted:
// a loaded machine may always be slower.
#include "cache/throttle.h"

#include <gtest/gtest.h>

#include <thread>

#include "cache/flash_store.h"
#include "cache_test_util.h"

namespace cb::cache {
namespace {

using namespace testing;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

TEST(Throttle, SingleThreadTakesAtLeastBytesOverRate) {
  Throttle t(1'000'000);  // 1 MB/s
  const auto t0 = Clock::now();
  for (int i = 0; i < 10; ++i) t.acquire(20'000);
  EXPECT_GE(seconds_since(t0), 0.2 * 0.999);
}

TEST(Throttle, ThreadsShareOneBudget) {
  Throttle t(2'000'000);
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int j = 0; j < 10; ++j) t.acquire(10'000);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_GE(seconds_since(t0), 400'000 / 2e6 * 0.999);
}

TEST(Throttle, ZeroRateIsUnlimitedAndRateCanChange) {
  Throttle t(0);
  t.acquire(1ull << 40);  // would take forever if capped
  t.set_rate(1'000'000);
  EXPECT_EQ(t.rate(), 1'000'000u);
  const auto t0 = Clock::now();
  t.acquire(50'000);
  EXPECT_GE(seconds_since(t0), 0.05 * 0.999);
}

TEST(Throttle, StoreReadsAreCapped) {
  TempDir dir;
  StoreOptions opt;
  opt.read_bytes_per_sec = 4'000'000;
  auto store = FlashStore::open(dir.path(), opt);
  const ChunkKey key = make_key(make_tokens(128, 1));
  ASSERT_EQ(store->put(key, make_kv({4, 128, 3, 64}, 1).view()), PutResult::kStored);
  auto h = store->lookup(key);
  ASSERT_TRUE(h);
  const auto t0 = Clock::now();
  ASSERT_TRUE(fetch_all(*store, *h));
  const double want = static_cast<double>(h->total_bytes()) / 4e6;  // ~0.1 s
  EXPECT_GE(seconds_since(t0), want * 0.999);
  EXPECT_EQ(store->stats().bytes_read, h->total_bytes());
  EXPECT_GE(store->stats().read_ns, static_cast<uint64_t>(want * 1e9 * 0.999));
  // Lifting the cap at run time.
  store->set_read_bytes_per_sec(0);
  ASSERT_TRUE(fetch_all(*store, *h));
}

}  // namespace
}  // namespace cb::cache
