// The chunk cache: a RAG prefill through it on flash with the auto ratio
// calibrates the loading controller and saves what it learnt beside the
// store, after the request (by the save worker); requests too long for the
// context are refused before any work.
#include "runtime/blend/chunk_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "platform/error.h"
#include "runtime/blend/calibration.h"
#if CB_WITH_REDIS
#include "tests/cache/redis_test_util.h"
#endif
#include "tests/runtime/model_path.h"
#include "tests/runtime/rag_request_fixture.h"

namespace cb {
namespace {

namespace fs = std::filesystem;

class ChunkCacheTest : public testing::Test {
 protected:
  void SetUp() override {
    dir = fs::path(testing::TempDir()) / ("chunk_cache_" + std::to_string(::getpid()));
    fs::remove_all(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  fs::path dir;
};

TEST_F(ChunkCacheTest, AutoRatioCalibrationIsSavedBesideTheStore) {
  const Model& model = test::shared_model();
  const RagPrompt prompt = test::lighthouse_prompt(model);
  Session s(model, {.n_ctx = 512, .n_threads = 2});
  RagPrefillOptions opts;
  opts.min_ratio = 0.15;
  {
    ChunkCache cache(dir.string(), {}, 0.0);
    RagPrefillStats st;
    cache.prefill(s, prompt, opts, /*auto_ratio=*/true, 2, &st);
    EXPECT_EQ(st.cache_misses, 3);
    ASSERT_TRUE(st.choice.has_value());
    EXPECT_GE(st.choice->ratio, 0.15);
    cache.flush();  // the save worker is done
    const std::string device = default_device_id(s.backend().name(), 2);
    const Calibration saved = CalibrationDb::open((dir / "calibration.sqlite").string())
                                  ->load(device, model.fingerprint());
    EXPECT_TRUE(saved.compute.has_value());
  }
  // Too long for the context: refused before the controller's probe.
  Session tiny(model, {.n_ctx = 32, .n_threads = 2});
  ChunkCache cache(dir.string(), {}, 0.0);
  try {
    cache.prefill(tiny, prompt, opts, true, 2, nullptr);
    FAIL() << "a request longer than the context";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kContextOverflow) << e.what();
  }
  EXPECT_EQ(tiny.n_past(), 0);
}

TEST_F(ChunkCacheTest, AutoRatioNeedsFlash) {
  const Model& model = test::shared_model();
  Session s(model, {.n_ctx = 512, .n_threads = 2});
  ChunkCache in_ram;
  EXPECT_THROW(in_ram.prefill(s, test::lighthouse_prompt(model), {}, true, 2, nullptr), Error);
  EXPECT_EQ(s.n_past(), 0);
}

#if CB_WITH_REDIS
// A server that sends a reply header and then a byte every 50 ms (20 s in
// all) under a 10 s command timeout: the session's abort check (a chat's
// Ctrl-C) ends the request within a step, not when the server is done.
TEST_F(ChunkCacheTest, AbortEndsAWaitOnASlowServer) {
  const Model& model = test::shared_model();
  cache::testing::FakeServer server("$1000\r\n", 400, 50, 0);
  ChunkCacheTiers tiers;
  cache::RedisOptions ro;
  ro.port = server.port();
  ro.connect_timeout_ms = ro.command_timeout_ms = 10000;
  ro.reconnect_interval_ms = 0;
  tiers.redis = ro;
  ChunkCache cache(dir.string(), {}, 0.0, tiers);
  Session s(model, {.n_ctx = 512, .n_threads = 2});
  s.set_stop_check([&] { return server.seconds_since_asked() > 0.2; });
  try {
    cache.prefill(s, test::lighthouse_prompt(model), {}, false, 2, nullptr);
    FAIL() << "not cancelled";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCancelled) << e.what();
  }
  ASSERT_TRUE(server.asked());
  // From the first read of the server to the end: the abort's 200 ms and a
  // step, not the drip's 20 s.
  EXPECT_LT(server.seconds_since_asked(), 2.0);
  EXPECT_EQ(s.n_past(), 0);
}
#else
// A build without the Redis tier refuses one by name, before any work.
TEST_F(ChunkCacheTest, ARedisTierIsRefusedWithoutRedisSupport) {
  ChunkCacheTiers tiers;
  tiers.redis = cache::RedisOptions{};
  try {
    ChunkCache cache(dir.string(), {}, 0.0, tiers);
    FAIL() << "a Redis tier was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("Redis"), std::string::npos) << e.what();
  }
}
#endif

}  // namespace
}  // namespace cb
