// The layerwise load pipeline: pipelined and serial fusion give bitwise
// identical results (chunks in RAM, in the flash store, on a Redis server,
// behind a read cap, where the loads overlap the computation);
// a chunk that fails on the loader side is computed instead, never a hang or
// a crash; the look-ahead bound holds; the auto ratio reaches the fusion.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <thread>

#include <unistd.h>

#if CB_WITH_REDIS
#include "../cache/redis_test_util.h"
#endif
#include "cache/flash_chunk_store.h"
#include "platform/error.h"
#include "platform/half.h"
#include "runtime/blend/layer_pipeline.h"
#include "runtime/blend/rag_request.h"
#if CB_WITH_REDIS
#include "cache/redis_chunk_store.h"
#endif
#include "runtime/llama_layer.h"
#include "tests/runtime/model_path.h"
#include "tests/runtime/rag_request_fixture.h"

namespace cb {
namespace {

namespace fs = std::filesystem;

const Model& model() {
  return test::shared_model();
}

using test::rel_l2;

using test::FailingSource;

// Records the highest layer fetched so far.
class RecordingSource final : public cache::ChunkLayerSource {
 public:
  explicit RecordingSource(cache::ChunkLayerSource& inner) : inner_(inner) {}
  bool fetch_layer(int64_t layer, float* k, float* v) override {
    int64_t seen = highest.load();
    while (layer > seen && !highest.compare_exchange_weak(seen, layer)) {
    }
    return inner_.fetch_layer(layer, k, v);
  }
  std::atomic<int64_t> highest{-1};

 private:
  cache::ChunkLayerSource& inner_;
};

class PipelineTest : public testing::Test, public test::LighthouseRequest {
 protected:
  PipelineTest() : LighthouseRequest(model()) {}
  void SetUp() override {
    dir = fs::path(testing::TempDir()) / ("pipeline_" + std::to_string(::getpid()));
    fs::remove_all(dir);
  }
  void TearDown() override { fs::remove_all(dir); }

  std::vector<float> fuse(std::span<const Segment> segs, const PipelineOptions& p,
                          FusionStats* st = nullptr, const BlendOptions& o = {}) {
    Session s(model(), {.n_ctx = 256, .n_threads = 2});
    auto l = fuse_prefill(s, segs, o, st, p);
    return {l.begin(), l.end()};
  }
  std::vector<float> rag(cache::ChunkStore& store, const RagPrefillOptions& o,
                         RagPrefillStats* st = nullptr) {
    Session s(model(), {.n_ctx = 256, .n_threads = 2});
    auto l = rag_prefill(s, prompt, &store, o, st);
    return {l.begin(), l.end()};
  }
  std::shared_ptr<cache::FlashStore> open_store(cache::Codec codec) {
    return std::shared_ptr<cache::FlashStore>(
        cache::FlashStore::open(dir.string(), {.codec = codec}).release());
  }

  fs::path dir;
};

const PipelineOptions kSerial{.enabled = false};

TEST_F(PipelineTest, PipelinedEqualsSerialBitwiseFromRam) {
  auto segs = segments();
  FusionStats serial_st;
  const auto want = fuse(segs, kSerial, &serial_st);
  EXPECT_FALSE(serial_st.pipelined);
  const uint64_t bytes =
      2 * sizeof(float) * model().hparams().n_layer * model().hparams().kv_dim() *
      (prompt.chunks[0].size() + prompt.chunks[1].size() + prompt.chunks[2].size());
  EXPECT_EQ(serial_st.bytes_read, bytes);
  // Serially, the compute side waits for every load.
  EXPECT_GE(serial_st.blocked_ms, serial_st.load_ms);
  for (const PipelineOptions& p :
       {PipelineOptions{.max_layers_ahead = 0}, PipelineOptions{.max_layers_ahead = 1},
        PipelineOptions{.max_layers_ahead = 2}, PipelineOptions{.max_layers_ahead = 5},
        PipelineOptions{.fetch_threads = 1}, PipelineOptions{.fetch_threads = 2},
        PipelineOptions{.max_layers_ahead = 1, .fetch_threads = 3},
        PipelineOptions{.fetch_threads = 8}}) {
    FusionStats st;
    const auto got = fuse(segs, p, &st);
    EXPECT_EQ(got, want) << "max_layers_ahead " << p.max_layers_ahead << ", fetch_threads "
                         << p.fetch_threads;
    EXPECT_TRUE(st.pipelined);
    EXPECT_EQ(st.bytes_read, bytes);
    EXPECT_EQ(st.final_rows, serial_st.final_rows);
    EXPECT_EQ(st.layer_ms.size(), static_cast<size_t>(model().hparams().n_layer));
    EXPECT_GT(st.load_ms, 0.0);
    EXPECT_GT(st.recompute_ms, 0.0);
    EXPECT_DOUBLE_EQ(st.ratio, kDefaultRatio);  // the schedule holds floats
  }
  // Reuse mode goes through the same loader.
  BlendOptions reuse{BlendMode::kReuse, {}};
  EXPECT_EQ(fuse(segs, {}, nullptr, reuse), fuse(segs, kSerial, nullptr, reuse));
}

TEST_F(PipelineTest, PipelinedEqualsSerialFromFlashAndUnderAReadCap) {
  for (cache::Codec codec : {cache::Codec::kF16, cache::Codec::kQ8}) {
    fs::remove_all(dir);
    auto store = open_store(codec);
    cache::FlashChunkStore flash(store);
    RagPrefillOptions serial;
    serial.pipeline.enabled = false;
    rag(flash, serial);  // computes and writes back the chunks
    store->flush();
    RagPrefillStats s1, s2, s3;
    const auto want = rag(flash, serial, &s1);
    ASSERT_EQ(s1.cache_hits, 3);
    const auto got = rag(flash, {}, &s2);
    EXPECT_EQ(got, want) << cache::codec_name(codec);
    // The bytes are the stored (encoded) ones.
    EXPECT_EQ(s2.fusion.bytes_read, s1.fusion.bytes_read);
    EXPECT_GT(s2.fusion.bytes_read, 0u);
    // Three threads reading the one store at once.
    RagPrefillOptions three;
    three.pipeline.fetch_threads = 3;
    RagPrefillStats s4;
    EXPECT_EQ(rag(flash, three, &s4), want) << cache::codec_name(codec);
    EXPECT_EQ(s4.fusion.bytes_read, s1.fusion.bytes_read);
    // Capped at 2 MB/s, a read cannot be faster than the cap, whatever the
    // threads reading (the cap is the store's).
    store->set_read_bytes_per_sec(2'000'000);
    for (const RagPrefillOptions& o : {RagPrefillOptions{}, three}) {
      const auto capped = rag(flash, o, &s3);
      EXPECT_EQ(capped, want) << cache::codec_name(codec);
      EXPECT_GE(s3.fusion.load_ms, 0.95 * 1e3 * static_cast<double>(s3.fusion.bytes_read) / 2e6);
    }
    store->set_read_bytes_per_sec(0);
  }
}

// The same from the remote tier (a real redis-server), and behind a read
// cap there the loader's reads overlap the computation: the compute side
// waits for less than the loads take (serially it waits for all of them).
#if CB_WITH_REDIS
TEST_F(PipelineTest, PipelinedEqualsSerialFromRedisAndOverlapsACappedRead) {
  cache::testing::RedisServer server;
  ASSERT_EQ(server.start(), "");
  cache::RedisOptions ro;
  ro.port = server.port();
  ro.codec = cache::Codec::kF16;
  auto redis = std::shared_ptr<cache::RedisStore>(cache::RedisStore::open(ro));
  cache::RedisChunkStore remote(redis);
  RagPrefillOptions serial;
  serial.pipeline.enabled = false;
  rag(remote, serial);  // computes the chunks and stores them on the server
  redis->flush();
  RagPrefillStats s1, s2;
  const auto want = rag(remote, serial, &s1);
  ASSERT_EQ(s1.cache_hits, 3);
  EXPECT_EQ(rag(remote, {}, &s2), want);
  EXPECT_EQ(s2.fusion.bytes_read, s1.fusion.bytes_read);
  RagPrefillOptions three;  // three threads on the store's connection at once
  three.pipeline.fetch_threads = 3;
  EXPECT_EQ(rag(remote, three), want);

  // Capped at 20 MB/s: about 70 ms of reads for the 1.4 MB of f16 KV, a
  // few times less than the computation they can hide behind.
  ro.read_bytes_per_sec = 20'000'000;
  cache::RedisChunkStore capped(std::shared_ptr<cache::RedisStore>(cache::RedisStore::open(ro)));
  RagPrefillStats cs, cp;
  EXPECT_EQ(rag(capped, serial, &cs), want);
  EXPECT_EQ(rag(capped, {}, &cp), want);
  const double floor_ms = 1e3 * static_cast<double>(cp.fusion.bytes_read) / 20e6;
  EXPECT_GE(cs.fusion.load_ms, 0.95 * floor_ms);
  EXPECT_GE(cp.fusion.load_ms, 0.95 * floor_ms);
  std::printf(
      "  capped at 20 MB/s: %.1f MB read; serial: load %.0f ms, blocked %.0f ms; "
      "pipelined: load %.0f ms, blocked %.0f ms, recompute %.0f ms\n",
      static_cast<double>(cp.fusion.bytes_read) / 1e6, cs.fusion.load_ms, cs.fusion.blocked_ms,
      cp.fusion.load_ms, cp.fusion.blocked_ms, cp.fusion.recompute_ms);
  EXPECT_GE(cs.fusion.blocked_ms, cs.fusion.load_ms);
  EXPECT_LT(cp.fusion.blocked_ms, cp.fusion.load_ms)
      << "load " << cp.fusion.load_ms << " ms, recompute " << cp.fusion.recompute_ms << " ms";
}
#else
TEST_F(PipelineTest, PipelinedEqualsSerialFromRedisAndOverlapsACappedRead) {
  GTEST_SKIP() << "this build has no Redis tier (CB_REDIS=OFF or hiredis not found)";
}
#endif

TEST_F(PipelineTest, LoaderErrorMidRequestComputesTheChunk) {
  auto segs = segments();
  // Reference: chunk 1 not cached at all, so it is computed.
  auto ref_segs = segs;
  ref_segs[2].cached = nullptr;
  const auto want = fuse(ref_segs, kSerial);
  for (bool throws : {false, true})
    for (int64_t fail_at : {int64_t{0}, int64_t{1}, int64_t{7}, model().hparams().n_layer - 1})
      for (const PipelineOptions& p :
           {PipelineOptions{}, PipelineOptions{true, 1}, kSerial,
            PipelineOptions{.fetch_threads = 2}, PipelineOptions{.fetch_threads = 3}}) {
        FailingSource broken(*sources[1], fail_at, throws);
        segs[2].cached = &broken;
        FusionStats st;
        const auto got = fuse(segs, p, &st);
        EXPECT_EQ(st.chunks_recomputed, 1);
        EXPECT_EQ(got, want) << "fail at " << fail_at << (throws ? " (throws)" : "")
                             << (p.enabled ? " pipelined" : " serial") << ", fetch_threads "
                             << p.fetch_threads;
      }
}

TEST_F(PipelineTest, EveryChunkFailingFallsBackToFullPrefill) {
  auto segs = segments();
  std::vector<std::unique_ptr<FailingSource>> broken;
  for (size_t i = 0; i < sources.size(); ++i) {
    broken.push_back(std::make_unique<FailingSource>(*sources[i], 3 + i, i % 2 == 1));
    segs[i + 1].cached = broken.back().get();
  }
  Session full(model(), {.n_ctx = 256, .n_threads = 2});
  const auto full_logits = full.prefill(prompt.tokens());
  const std::vector<float> want(full_logits.begin(), full_logits.end());
  for (int fetch_threads : {0, 3}) {
    FusionStats st;
    const auto got = fuse(segs, {.fetch_threads = fetch_threads}, &st);
    EXPECT_EQ(st.chunks_recomputed, 3);
    // With no cached KV left the request is a plain prefill: bitwise FULL.
    EXPECT_EQ(got, want) << fetch_threads << " fetch threads";
    EXPECT_EQ(st.ratio, 1.0);
  }
}

// Counts the fetches in flight, over all the sources of a request and per
// source; with `wait`, a fetch waits (up to a second) until two have been in
// flight at once, so that reads that can overlap do.
class ConcurrencySource final : public cache::ChunkLayerSource {
 public:
  struct Counters {
    bool wait = false;
    std::atomic<int> in_flight{0}, most{0}, overlaps_on_one_source{0};
  };
  ConcurrencySource(cache::ChunkLayerSource& inner, Counters& all) : inner_(inner), all_(all) {}
  bool fetch_layer(int64_t layer, float* k, float* v) override {
    if (mine_.fetch_add(1) != 0) ++all_.overlaps_on_one_source;
    const int now = all_.in_flight.fetch_add(1) + 1;
    int most = all_.most.load();
    while (now > most && !all_.most.compare_exchange_weak(most, now)) {
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (all_.wait && all_.most.load() < 2 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    const bool ok = inner_.fetch_layer(layer, k, v);
    all_.in_flight.fetch_sub(1);
    mine_.fetch_sub(1);
    return ok;
  }

 private:
  cache::ChunkLayerSource& inner_;
  Counters& all_;
  std::atomic<int> mine_{0};
};

TEST_F(PipelineTest, FetchThreadsReadDifferentChunksAtOnce) {
  const auto want = fuse(segments(), kSerial);
  for (int fetch_threads : {1, 3}) {
    ConcurrencySource::Counters counters;
    counters.wait = fetch_threads > 1;
    std::vector<std::unique_ptr<ConcurrencySource>> wrapped;
    auto segs = segments();
    for (size_t i = 0; i < sources.size(); ++i) {
      wrapped.push_back(std::make_unique<ConcurrencySource>(*sources[i], counters));
      segs[i + 1].cached = wrapped.back().get();
    }
    EXPECT_EQ(fuse(segs, {.fetch_threads = fetch_threads}), want);
    EXPECT_EQ(counters.overlaps_on_one_source, 0) << fetch_threads;
    if (fetch_threads == 1) {
      EXPECT_EQ(counters.most, 1);
    } else {
      EXPECT_GE(counters.most, 2);
    }
  }
  // Two references to one source: it is read by one thread only.
  ConcurrencySource::Counters counters;
  ConcurrencySource shared(*sources[0], counters);
  Session s(model(), {.n_ctx = 256, .n_threads = 2});
  const int32_t len = static_cast<int32_t>(prompt.chunks[0].size());
  LayerPipeline p(s, {{&shared, 0, len}, {&shared, len, len}}, {.fetch_threads = 2});
  for (int64_t l = 0; l < model().hparams().n_layer; ++l) ASSERT_TRUE(p.synchronize(l));
  EXPECT_EQ(counters.overlaps_on_one_source, 0);
  EXPECT_EQ(counters.most, 1);
}

TEST_F(PipelineTest, NegativeFetchThreadsIsAnError) {
  Session s(model(), {.n_ctx = 256, .n_threads = 2});
  const int32_t len = static_cast<int32_t>(prompt.chunks[0].size());
  try {
    LayerPipeline p(s, {{sources[0].get(), 0, len}}, {.fetch_threads = -1});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
}

TEST_F(PipelineTest, LookAheadIsBoundedAndTheLoaderAlwaysJoins) {
  Session s(model(), {.n_ctx = 256, .n_threads = 2});
  RecordingSource rec(*sources[0]);
  const int32_t begin = static_cast<int32_t>(prompt.head.size());
  const int32_t len = static_cast<int32_t>(prompt.chunks[0].size());
  {
    LayerPipeline p(s, {{&rec, begin, len}}, {.enabled = true, .max_layers_ahead = 1});
    ASSERT_TRUE(p.synchronize(0));
    ASSERT_TRUE(p.synchronize(1));
    // Give the loader every chance to run too far ahead.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_LE(rec.highest.load(), 2);
    EXPECT_GE(rec.highest.load(), 1);
    // Destroyed while the loader waits for the compute side: no hang.
  }
  {
    // The same with three threads reading three chunks: the bound holds for
    // each, and the helpers are stopped too.
    RecordingSource rec1(*sources[1]), rec2(*sources[2]);
    const int32_t len1 = static_cast<int32_t>(prompt.chunks[1].size());
    const int32_t len2 = static_cast<int32_t>(prompt.chunks[2].size());
    LayerPipeline p(
        s, {{&rec, begin, len}, {&rec1, begin + len, len1}, {&rec2, begin + len + len1, len2}},
        {.enabled = true, .max_layers_ahead = 1, .fetch_threads = 3});
    ASSERT_TRUE(p.synchronize(0));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (const RecordingSource* r : {&rec, &rec1, &rec2}) EXPECT_LE(r->highest.load(), 2);
  }
  // The loaded layer holds the chunk's K rotated to its positions.
  {
    LayerPipeline p(s, {{&rec, begin, len}}, {});
    ASSERT_TRUE(p.synchronize(0));
    const int64_t kv_dim = model().hparams().kv_dim();
    std::vector<float> k(static_cast<size_t>(len * kv_dim));
    std::copy_n(kv[0].k.data(), k.size(), k.begin());
    std::vector<int32_t> pos(static_cast<size_t>(len));
    std::iota(pos.begin(), pos.end(), begin);
    const auto& hp = model().hparams();
    rope_keys(s.backend(), hp, 0, s.layer_weights()[0], k.data(), pos.data(), len);
    // The session's default f16 cache: the rotated f32 rows, rounded once.
    ASSERT_EQ(s.kv_type(), KvType::kF16);
    std::vector<float> v(kv[0].v.begin(), kv[0].v.begin() + len * kv_dim);
    for (float& x : k) x = f16_to_f32(f32_to_f16(x));
    for (float& x : v) x = f16_to_f32(f32_to_f16(x));
    std::vector<float> got_k(k.size()), got_v(k.size());
    s.read_kv_rows(0, false, begin, len, got_k.data());
    s.read_kv_rows(0, true, begin, len, got_v.data());
    EXPECT_EQ(k, got_k);
    EXPECT_EQ(v, got_v);
    p.finish();
    EXPECT_GE(p.stats().layers_loaded, 1);
    EXPECT_FALSE(p.synchronize(1));  // finished: nothing more is loaded
  }
}

TEST_F(PipelineTest, AutoRatioFollowsTheStorageTier) {
  auto store = open_store(cache::Codec::kQ8);
  cache::FlashChunkStore flash(store);
  rag(flash, {});
  store->flush();
  Calibration cal;
  cal.compute = CalibratedCompute{{1e-4, 1e-8, 1e-4}};
  cal.tiers = {{{"fast", 1e12, 1}}, {{"glacial", 1.0, 0}}};
  LoadingController ctrl(cal);

  RagPrefillOptions fast;
  fast.controller = &ctrl;
  fast.storage_tier = "fast";
  RagPrefillStats st;
  const auto got = rag(flash, fast, &st);
  ASSERT_TRUE(st.choice);
  EXPECT_DOUBLE_EQ(st.choice->ratio, 0.15);
  EXPECT_DOUBLE_EQ(st.fusion.ratio, static_cast<float>(st.choice->ratio));
  EXPECT_EQ(st.shape->n_reused,
            static_cast<int64_t>(prompt.chunks[0].size() + prompt.chunks[1].size() +
                                 prompt.chunks[2].size()));
  ASSERT_EQ(st.shape->loads.size(), 1u);
  EXPECT_EQ(st.shape->loads[0].codec, cache::Codec::kQ8);
  RagPrefillOptions fixed;  // the controller's floor as a fixed ratio
  fixed.blend.schedule = single_check_schedule(fixed.blend.selection, 0.15f);
  EXPECT_EQ(got, rag(flash, fixed));
  // The request's timings refreshed the calibration.
  Calibration after = ctrl.calibration();
  EXPECT_EQ(after.compute->observations, 1);
  EXPECT_NE(after.compute->cost, cal.compute->cost);
  EXPECT_EQ(after.find_tier("fast")->observations, 1);
  // The codec, never calibrated, is measured by its first request.
  ASSERT_TRUE(after.find_decode(cache::Codec::kQ8) != nullptr);
  EXPECT_EQ(after.find_decode(cache::Codec::kQ8)->observations, 1);
  EXPECT_GT(after.find_decode(cache::Codec::kQ8)->s_per_byte, 0.0);

  // At 1 byte/s nothing can hide the load: r = 1, and since reading would
  // only add time, nothing is read (a full prefill).
  RagPrefillOptions slow = fast;
  slow.storage_tier = "glacial";
  const auto at_one = rag(flash, slow, &st);
  EXPECT_DOUBLE_EQ(st.choice->ratio, 1.0);
  EXPECT_TRUE(st.choice->skip_loads);
  EXPECT_EQ(st.fusion.bytes_read, 0u);
  Session full(model(), {.n_ctx = 256, .n_threads = 2});
  EXPECT_LE(rel_l2(at_one, full.prefill(prompt.tokens())), 1e-4);
}

// The measurement of the report (not a test: it prints timings).  8 chunks
// of 512 tokens + a 32-token query from the flash store (q8), read cap set
// so that load ~ compute at r = 0.15; pipelined vs serial.  HKVD: its one
// pass overlaps the loads (lookahead's loads end in its reuse pass).
TEST(PipelineBench, DISABLED_PipelinedVsSerialAtBalancedReadCap) {
  const fs::path dir =
      fs::path(testing::TempDir()) / ("pipeline_bench_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const int n_threads =
      std::getenv("CB_BENCH_THREADS") ? std::atoi(std::getenv("CB_BENCH_THREADS")) : 2;
  RagPrompt p = build_rag_prompt(model().tokenizer(), ChatFormat::kChatML,
                                 "Answer from the documents.", {}, "");
  uint32_t x = 12345;
  for (int c = 0; c < 8; ++c) {
    std::vector<int32_t> chunk(512);
    for (int32_t& t : chunk)
      t = static_cast<int32_t>(1000 + (x = x * 1664525u + 1013904223u) % 20000);
    p.chunks.push_back(chunk);
  }
  p.suffix.resize(32);
  for (int32_t& t : p.suffix)
    t = static_cast<int32_t>(1000 + (x = x * 1664525u + 1013904223u) % 20000);
  auto store = std::shared_ptr<cache::FlashStore>(
      cache::FlashStore::open(dir.string(), {.codec = cache::Codec::kQ8}).release());
  cache::FlashChunkStore flash(store);
  Session s(model(), {.n_ctx = 4608, .n_threads = n_threads});
  auto run = [&](const PipelineOptions& po, RagPrefillStats& st) {
    s.truncate(0);
    RagPrefillOptions o;
    o.pipeline = po;
    o.blend.selection = Selection::kHkvd;
    o.blend.schedule = single_check_schedule(Selection::kHkvd, 0.15f);
    const auto t0 = std::chrono::steady_clock::now();
    rag_prefill(s, p, &flash, o, &st);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  RagPrefillStats st;
  run(kSerial, st);  // precompute + write back
  store->flush();
  run(kSerial, st);  // warm
  // Uncapped serial run: compute time and bytes at r = 0.15.
  run(kSerial, st);
  const double compute_s = st.fusion.recompute_ms * 1e-3;
  const uint64_t bytes = st.fusion.bytes_read;
  const double decode_s = st.fusion.load_ms * 1e-3;  // uncapped: mostly decode + RoPE
  // Cap so that load (read at the cap + decode) ~ compute.
  const double read_s = std::max(compute_s - decode_s, 0.05 * compute_s);
  const uint64_t cap = static_cast<uint64_t>(static_cast<double>(bytes) / read_s);
  store->set_read_bytes_per_sec(cap);
  std::printf(
      "n_tokens %lld  bytes/request %.1f MB  uncapped: compute %.0f ms, load %.0f ms -> cap %.1f "
      "MB/s\n",
      static_cast<long long>(st.fusion.n_tokens), bytes / 1e6, compute_s * 1e3, decode_s * 1e3,
      cap / 1e6);
  for (int rep = 0; rep < 2; ++rep)
    for (bool on : {false, true}) {
      RagPrefillStats r;
      const double ms = run({.enabled = on}, r);
      std::printf(
          "%-10s fusion %7.0f ms (rag_prefill %7.0f)  load %7.0f (fetch %7.0f)  compute %7.0f  "
          "blocked %7.0f  max(load,compute) %7.0f  ratio fusion/max %.2f\n",
          on ? "pipelined" : "serial", r.fusion.compute_ms, ms, r.fusion.load_ms, r.fusion.fetch_ms,
          r.fusion.recompute_ms, r.fusion.blocked_ms,
          std::max(r.fusion.load_ms, r.fusion.recompute_ms),
          r.fusion.compute_ms / std::max(r.fusion.load_ms, r.fusion.recompute_ms));
    }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace cb
