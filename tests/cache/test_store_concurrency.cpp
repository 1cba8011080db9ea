// Write-back queue, threads and processes sharing a store.  Run these under
// ThreadSanitizer too (CB_TSAN=ON).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include "cache/flash_store.h"
#include "cache/write_back_queue.h"
#include "cache_test_util.h"

namespace cb::cache {
namespace {

using namespace testing;

ChunkKV kv_for(int i) {
  return make_kv(small_shape(), 5000 + i);
}
ChunkKey key_for(int i) {
  return make_key(make_tokens(40, 5000 + i));
}

TEST(WriteBackQueue, RunsJobsInOrderAndFlushWaits) {
  std::vector<int> seen;
  std::mutex mu;
  WriteBackQueue q(64);
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(q.push([&, i] {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      std::lock_guard<std::mutex> lock(mu);
      seen.push_back(i);
    }));
  }
  q.flush();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(seen.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(seen[i], i);
}

TEST(WriteBackQueue, RefusesWhenFullInsteadOfBlocking) {
  std::atomic<bool> started{false}, release{false};
  WriteBackQueue q(2);
  ASSERT_TRUE(q.push([&] {
    started = true;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }));
  while (!started) std::this_thread::yield();
  // The running job does not count: exactly depth more are accepted.
  int accepted = 0;
  for (int i = 0; i < 5; ++i) accepted += q.push([] {});
  EXPECT_EQ(accepted, 2);
  EXPECT_EQ(q.pending(), 3u);
  release = true;
  q.flush();
  EXPECT_EQ(q.pending(), 0u);
}

TEST(WriteBackQueue, DestructorDrainsPendingJobs) {
  std::atomic<int> ran{0};
  {
    WriteBackQueue q(8);
    for (int i = 0; i < 8; ++i) q.push([&] { ran++; });
  }
  EXPECT_EQ(ran, 8);
}

TEST(AsyncPut, FlushMakesEntriesVisible) {
  TempDir dir;
  auto store = FlashStore::open(dir.path());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(store->put_async(key_for(i), kv_for(i)));
  store->flush();
  for (int i = 0; i < 10; ++i) {
    auto h = store->lookup(key_for(i));
    ASSERT_TRUE(h) << i;
    EXPECT_TRUE(equals_f16_of(*fetch_all(*store, *h), kv_for(i)));
  }
  const StoreStats st = store->stats();
  EXPECT_EQ(st.async_queued, 10u);
  EXPECT_EQ(st.puts, 10u);
  EXPECT_EQ(st.async_failed, 0u);
}

TEST(AsyncPut, CloseFlushesPendingWrites) {
  TempDir dir;
  {
    auto store = FlashStore::open(dir.path());
    for (int i = 0; i < 6; ++i) ASSERT_TRUE(store->put_async(key_for(i), kv_for(i)));
  }
  auto store = FlashStore::open(dir.path());
  EXPECT_EQ(store->stats().entries, 6u);
}

TEST(AsyncPut, FailuresAreCountedNotThrown) {
  TempDir dir;
  auto store = FlashStore::open(dir.path());
  ChunkKV bad = kv_for(0);
  bad.k[3] = INFINITY;
  ASSERT_TRUE(store->put_async(key_for(0), std::move(bad)));
  store->flush();
  const StoreStats st = store->stats();
  EXPECT_EQ(st.async_failed, 1u);
  EXPECT_NE(st.last_async_error.find("finite"), std::string::npos) << st.last_async_error;
  EXPECT_EQ(st.entries, 0u);
}

TEST(AsyncPut, FullQueueDropsAndCounts) {
  TempDir dir;
  StoreOptions opt;
  opt.write_back_depth = 1;
  auto store = FlashStore::open(dir.path(), opt);
  int accepted = 0;
  for (int i = 0; i < 30; ++i) accepted += store->put_async(key_for(i), kv_for(i));
  store->flush();
  const StoreStats st = store->stats();
  EXPECT_LT(accepted, 30);
  EXPECT_EQ(st.async_dropped, 30u - accepted);
  EXPECT_EQ(st.entries, static_cast<uint64_t>(accepted));
}

// Readers check every byte they get against the data the key implies, while
// a writer adds entries and an evictor removes them.
void hammer(FlashStore& writer_store, FlashStore& reader_store, int n_keys) {
  std::atomic<bool> stop{false};
  std::atomic<int> written{0}, bad{0}, hits{0};
  std::thread writer([&] {
    for (int i = 0; i < n_keys; ++i) {
      writer_store.put(key_for(i), kv_for(i).view());
      written = i + 1;
      if (i % 7 == 3) writer_store.remove(key_for(i - 2));
    }
    stop = true;
  });
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&, r] {
      std::mt19937 rng(r);
      while (!stop) {
        const int w = written;
        if (w == 0) continue;
        const int i = static_cast<int>(rng() % w);
        auto h = reader_store.lookup(key_for(i));
        if (!h) continue;
        auto got = fetch_all(reader_store, *h);
        if (!got || !equals_f16_of(*got, kv_for(i))) bad++;
        hits++;
      }
    });
  }
  writer.join();
  for (auto& t : readers) t.join();
  EXPECT_EQ(bad, 0);
  EXPECT_GT(hits, 0);
  EXPECT_EQ(reader_store.stats().corrupt_drops, 0u);
}

TEST(Concurrency, ReadersAndAWriterOnOneStore) {
  TempDir dir;
  auto store = FlashStore::open(dir.path());
  hammer(*store, *store, 60);
}

TEST(Concurrency, TwoStoreObjectsOnOneDirectory) {
  TempDir dir;
  auto a = FlashStore::open(dir.path());
  auto b = FlashStore::open(dir.path());
  hammer(*a, *b, 60);
  // Both see the same index.
  EXPECT_EQ(a->stats().entries, b->stats().entries);
}

TEST(Concurrency, OpeningWhileAnotherObjectWritesLosesNothing) {
  TempDir dir;
  auto a = FlashStore::open(dir.path());
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (int i = 0; i < 40; ++i)
      ASSERT_EQ(a->put(key_for(i), kv_for(i).view()), PutResult::kStored);
    done = true;
  });
  // Each open() runs orphan reconciliation against the writer's in-flight blobs.
  while (!done) FlashStore::open(dir.path());
  writer.join();
  auto b = FlashStore::open(dir.path());
  for (int i = 0; i < 40; ++i) {
    auto h = b->lookup(key_for(i));
    ASSERT_TRUE(h) << i;
    EXPECT_TRUE(fetch_all(*b, *h));
  }
}

// Two processes write disjoint and overlapping keys and read each other's.
TEST(Concurrency, TwoProcessesShareAStore) {
  TempDir dir;
  { FlashStore::open(dir.path()); }
  pid_t pids[2];
  for (int p = 0; p < 2; ++p) {
    pids[p] = fork();
    ASSERT_GE(pids[p], 0);
    if (pids[p] == 0) {
      int failures = 0;
      try {
        auto store = FlashStore::open(dir.path());
        for (int i = 0; i < 40; ++i) {
          const int own = p * 100 + i;  // disjoint
          const int shared = 1000 + i;  // both write these
          store->put(key_for(own), kv_for(own).view());
          store->put(key_for(shared), kv_for(shared).view());
          const int other = (1 - p) * 100 + i / 2;
          if (auto h = store->lookup(key_for(other))) {
            auto got = fetch_all(*store, *h);
            failures += !got || !equals_f16_of(*got, kv_for(other));
          }
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child %d: %s\n", p, e.what());
        _exit(3);
      }
      _exit(failures == 0 ? 0 : 1);
    }
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
  auto store = FlashStore::open(dir.path());
  EXPECT_EQ(store->stats().entries, 120u);  // 40 + 40 own, 40 shared, no duplicates
  for (int i : {0, 39, 100, 139, 1000, 1039}) {
    auto h = store->lookup(key_for(i));
    ASSERT_TRUE(h) << i;
    EXPECT_TRUE(equals_f16_of(*fetch_all(*store, *h), kv_for(i)));
  }
}

}  // namespace
}  // namespace cb::cache
