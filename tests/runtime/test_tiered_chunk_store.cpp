// The tiered chunk store: placement by the loading controller's inverse rule
// (pure), lookups served by the fastest tier holding a chunk, promotion of
// chunks read in full from a slower tier, RAM budget overflow demoting to the
// next tier, and fallthrough past a tier that fails -- over real stores
// (RAM, flash directories, a real redis-server).
#include "cache/tiered_chunk_store.h"

#include <gtest/gtest.h>

#include <cstring>

#include "../cache/cache_test_util.h"
#if CB_WITH_REDIS
#include "../cache/redis_test_util.h"
#endif
#include "cache/flash_store.h"
#if CB_WITH_REDIS
#include "cache/redis_store.h"
#endif
#include "cache/flash_chunk_store.h"
#include "platform/error.h"
#include "runtime/blend/chunk_cache.h"
#include "runtime/blend/tier_placement.h"
#if CB_WITH_REDIS
#include "cache/redis_chunk_store.h"
#endif

namespace cb {
namespace {

using cache::Codec;
using cache::testing::make_key;
using cache::testing::make_kv;
using cache::testing::make_tokens;
using cache::testing::TempDir;

// 10 layers x 100 tokens x 64: 25600 f16 bytes per layer, 512000 f32 bytes.
const cache::KvShape kShape{10, 100, 1, 64};
constexpr uint64_t kChunkBytes = 2 * 10 * 100 * 64 * 4;

// One tier (built field by field: GCC 12 warns falsely about the strings
// of nested braced aggregates).
cache::ChunkTier tier(const char* name, double read_bytes_per_s, int rank,
                      std::shared_ptr<cache::ChunkStore> store,
                      std::optional<Codec> codec = std::nullopt, uint64_t capacity_bytes = 0) {
  cache::ChunkTier t;
  t.cost.name = name;
  t.cost.read_bytes_per_s = read_bytes_per_s;
  t.cost.cost_rank = rank;
  t.store = std::move(store);
  t.codec = codec;
  t.capacity_bytes = capacity_bytes;
  return t;
}

TierChoice choice(const char* name, int rank, double load, bool hidden) {
  TierChoice c;
  c.tier.name = name;
  c.tier.cost_rank = rank;
  c.load_s = load;
  c.compute_s = 1.0;
  c.hidden = hidden;
  return c;
}

TEST(PickCheapestHidden, CheapestHiddenElseFastest) {
  EXPECT_FALSE(pick_cheapest_hidden({}).has_value());
  std::vector<TierChoice> o = {choice("ram", 2, 0.0, true), choice("flash", 1, 0.1, true),
                               choice("sd", 0, 0.9, false)};
  EXPECT_EQ(pick_cheapest_hidden(o), 1u);
  o[2].hidden = true;
  EXPECT_EQ(pick_cheapest_hidden(o), 2u);
  // Same rank: the faster one.
  o.push_back(choice("sd2", 0, 0.5, true));
  EXPECT_EQ(pick_cheapest_hidden(o), 3u);
  // Nothing hidden: the fastest, whatever its cost.
  for (TierChoice& c : o) c.hidden = false;
  EXPECT_EQ(pick_cheapest_hidden(o), 0u);
}

std::vector<int32_t> tokens(int seed) {
  return make_tokens(kShape.n_tokens, seed);
}

bool same_bits(const cache::ChunkKV& a, const cache::ChunkKV& b) {
  return a.shape == b.shape &&
         std::memcmp(a.k.data(), b.k.data(), a.k.size() * sizeof(float)) == 0 &&
         std::memcmp(a.v.data(), b.v.data(), a.v.size() * sizeof(float)) == 0;
}

// Every layer through `src`, or nullopt.
std::optional<cache::ChunkKV> read_all(cache::ChunkLayerSource& src) {
  if (!src.shape()) return std::nullopt;
  cache::ChunkKV kv(*src.shape());
  for (int l = 0; l < kv.shape.n_layers; ++l)
    if (!src.fetch_layer(l, kv.k_layer(l), kv.v_layer(l))) return std::nullopt;
  return kv;
}

// RAM (budget `ram_bytes`), flash (f16), and a 5 MB/s directory (f16).
struct ThreeTiers {
  explicit ThreeTiers(uint64_t ram_bytes, cache::TieredChunkStoreOptions opts = {}) {
    cache::StoreOptions so;
    so.codec = Codec::kF16;
    flash = cache::FlashStore::open(dir.sub("flash"), so);
    so.read_bytes_per_sec = 5'000'000;
    sd = cache::FlashStore::open(dir.sub("sd"), so);
    ram = std::make_shared<cache::RamChunkStore>();
    std::vector<cache::ChunkTier> tiers;
    tiers.push_back(tier("ram", 0.0, 2, ram, std::nullopt, ram_bytes));
    tiers.push_back(
        tier("flash", 1e8, 1, std::make_shared<cache::FlashChunkStore>(flash), Codec::kF16));
    tiers.push_back(tier("sd", 5e6, 0, std::make_shared<cache::FlashChunkStore>(sd), Codec::kF16));
    store = std::make_unique<cache::TieredChunkStore>(std::move(tiers), opts);
  }
  void flush() {
    flash->flush();
    sd->flush();
  }
  TempDir dir;
  std::shared_ptr<cache::FlashStore> flash, sd;
  std::shared_ptr<cache::RamChunkStore> ram;
  std::unique_ptr<cache::TieredChunkStore> store;
};

TierPlacementOptions calibration_at(double ratio) {
  TierPlacementOptions o;
  o.ratio = ratio;
  o.calibration.compute = CalibratedCompute{{1e-4, 0.0, 0.0}};  // 0.1 ms per row and layer
  return o;
}

cache::TieredChunkStoreOptions placed_by(TierPlacementOptions p) {
  cache::TieredChunkStoreOptions o;
  o.placement = std::make_shared<TierPlacement>(std::move(p));
  return o;
}

cache::TieredChunkStoreOptions calibrated(double ratio) {
  return placed_by(calibration_at(ratio));
}

// Compute at r: 0.01 s (layer 0, every token) + 9 x 100 r x 1e-4 s.  Loads:
// flash 10 x 25600 B / 1e8 = 2.6 ms, hidden from r = 0; the 5 MB/s
// directory 51 ms, hidden (x 0.8) only from r ~ 0.35.
TEST(TieredChunkStore, PlacesOnTheCheapestTierThatStaysHidden) {
  ThreeTiers at_015(0, calibrated(0.15));
  EXPECT_EQ(at_015.store->placement(kShape), 1u);  // flash
  ThreeTiers at_05(0, calibrated(0.5));
  EXPECT_EQ(at_05.store->placement(kShape), 2u);  // the slow directory
  ThreeTiers uncalibrated(0);
  EXPECT_EQ(uncalibrated.store->placement(kShape), 0u);  // nothing hides: RAM

  // put() follows placement.
  const cache::ChunkKey key = make_key(tokens(1));
  at_05.store->put(key, make_kv(kShape, 1));
  at_05.flush();
  EXPECT_FALSE(at_05.ram->find(key, kShape));
  EXPECT_FALSE(at_05.flash->lookup(key));
  EXPECT_TRUE(at_05.sd->lookup(key));
  EXPECT_EQ(at_05.store->stats().tiers[2].placed, 1u);
}

TEST(TieredChunkStore, TheFastestTierHoldingTheChunkServesIt) {
  ThreeTiers t(0);
  const cache::ChunkKey key = make_key(tokens(2));
  const cache::ChunkKV kv = make_kv(kShape, 2);
  t.store->tier_store(2).put(key, kv);
  t.store->tier_store(0).put(key, kv);
  t.flush();
  auto src = t.store->find(key, kShape);
  ASSERT_TRUE(src);
  auto got = read_all(*src);
  ASSERT_TRUE(got);
  EXPECT_TRUE(same_bits(*got, kv));  // RAM: exact f32, not the directory's f16
  const cache::TieredStats st = t.store->stats();
  EXPECT_EQ(st.tiers[0].hits, 1u);
  EXPECT_EQ(st.tiers[2].hits, 0u);
  EXPECT_FALSE(t.store->find(make_key(tokens(99)), kShape));
  EXPECT_EQ(t.store->stats().misses, 1u);
}

TEST(TieredChunkStore, AChunkReadInFullFromASlowerTierMovesUp) {
  cache::TieredChunkStoreOptions opts;
  opts.promote_after_hits = 2;
  ThreeTiers t(0, opts);
  const cache::ChunkKey key = make_key(tokens(3));
  const cache::ChunkKV kv = make_kv(kShape, 3);
  t.store->tier_store(2).put(key, kv);
  t.flush();
  // A partial read promotes nothing.
  {
    auto src = t.store->find(key, kShape);
    ASSERT_TRUE(src);
    cache::ChunkKV tmp(kShape);
    ASSERT_TRUE(src->fetch_layer(0, tmp.k_layer(0), tmp.v_layer(0)));
  }
  // One full read: still below promote_after_hits.
  auto first = t.store->find(key, kShape);
  ASSERT_TRUE(first && read_all(*first));
  t.flush();
  EXPECT_FALSE(t.flash->lookup(key));
  // The second full read copies it one tier up (flash), keeping the slow copy.
  auto second = t.store->find(key, kShape);
  ASSERT_TRUE(second);
  auto from_sd = read_all(*second);
  ASSERT_TRUE(from_sd);
  t.flush();
  EXPECT_TRUE(t.flash->lookup(key));
  EXPECT_TRUE(t.sd->lookup(key));
  EXPECT_EQ(t.store->stats().tiers[1].promoted_in, 1u);
  // Now flash serves it, bit for bit what the slow tier served (both f16).
  auto third = t.store->find(key, kShape);
  ASSERT_TRUE(third);
  auto from_flash = read_all(*third);
  ASSERT_TRUE(from_flash);
  EXPECT_TRUE(same_bits(*from_flash, *from_sd));
  EXPECT_TRUE(cache::testing::equals_f16_of(*from_flash, kv));
  const cache::TieredStats st = t.store->stats();
  EXPECT_EQ(st.tiers[1].hits, 1u);
  EXPECT_EQ(st.tiers[2].hits, 3u);
}

TEST(TieredChunkStore, RamBudgetOverflowDemotesTheLeastRecentlyUsed) {
  ThreeTiers t(2 * kChunkBytes);  // uncalibrated: new chunks go to RAM
  std::vector<cache::ChunkKey> keys;
  for (int i = 0; i < 3; ++i) keys.push_back(make_key(tokens(10 + i)));
  t.store->put(keys[0], make_kv(kShape, 10));
  t.store->put(keys[1], make_kv(kShape, 11));
  ASSERT_TRUE(t.store->find(keys[0], kShape));  // keys[1] is now the least recently used
  t.store->put(keys[2], make_kv(kShape, 12));
  t.flush();
  EXPECT_TRUE(t.ram->find(keys[0], kShape));
  EXPECT_FALSE(t.ram->find(keys[1], kShape));
  EXPECT_TRUE(t.ram->find(keys[2], kShape));
  EXPECT_EQ(t.ram->bytes(), 2 * kChunkBytes);
  auto h = t.flash->lookup(keys[1]);
  ASSERT_TRUE(h);
  auto demoted = cache::testing::fetch_all(*t.flash, *h);
  ASSERT_TRUE(demoted);
  EXPECT_TRUE(cache::testing::equals_f16_of(*demoted, make_kv(kShape, 11)));
  cache::TieredStats st = t.store->stats();
  EXPECT_EQ(st.tiers[0].budget_bytes, 2 * kChunkBytes);
  EXPECT_EQ(st.tiers[1].demoted_in, 1u);
  // Still found, now from flash.
  EXPECT_TRUE(t.store->find(keys[1], kShape));
  EXPECT_EQ(t.store->stats().tiers[1].hits, 1u);
  // Larger than the whole budget: straight to the next tier.
  const cache::KvShape big{10, 300, 1, 64};
  const cache::ChunkKey big_key = make_key(make_tokens(300, 5));
  t.store->put(big_key, make_kv(big, 5));
  t.flush();
  EXPECT_FALSE(t.ram->find(big_key, big));
  EXPECT_TRUE(t.flash->lookup(big_key));
  // remove() takes it from every tier.
  EXPECT_TRUE(t.store->remove(keys[1]));
  EXPECT_FALSE(t.store->find(keys[1], kShape));
}

// A tier whose storage fails: every call throws, as a FlashStore does when
// its index cannot be read.
class FailingStore final : public cache::ChunkStore {
 public:
  std::unique_ptr<cache::ChunkLayerSource> find(const cache::ChunkKey&,
                                                const cache::KvShape&) override {
    fail(ErrorCode::kIo, "index unreadable (test)");
  }
  void put(const cache::ChunkKey&, cache::ChunkKV) override {
    fail(ErrorCode::kIo, "disk full (test)");
  }
  bool remove(const cache::ChunkKey&) override { fail(ErrorCode::kIo, "gone (test)"); }
};

TEST(TieredChunkStore, AFailingTierIsSkipped) {
  auto ram = std::make_shared<cache::RamChunkStore>();
  std::vector<cache::ChunkTier> tiers;
  tiers.push_back(tier("broken", 0.0, 0, std::make_shared<FailingStore>()));
  tiers.push_back(tier("ram", 0.0, 1, ram));
  cache::TieredChunkStore store(std::move(tiers));
  const cache::ChunkKey key = make_key(tokens(4));
  const cache::ChunkKV kv = make_kv(kShape, 4);
  EXPECT_EQ(store.placement(kShape), 0u);  // the broken tier would be chosen...
  store.put(key, kv);                      // ...and the chunk falls through to RAM
  EXPECT_TRUE(ram->find(key, kShape));
  auto src = store.find(key, kShape);
  ASSERT_TRUE(src);
  auto got = read_all(*src);
  ASSERT_TRUE(got);
  EXPECT_TRUE(same_bits(*got, kv));
  EXPECT_TRUE(store.remove(key));
  const cache::TieredStats st = store.stats();
  // find, put, the promotion after the full read, remove.
  EXPECT_EQ(st.tiers[0].failures, 4u);
  EXPECT_EQ(st.tiers[0].last_error, "gone (test)");
  EXPECT_EQ(st.tiers[1].placed, 1u);
  EXPECT_EQ(st.tiers[1].hits, 1u);
}

TEST(TieredChunkStore, BadConfigurationIsAClearError) {
  EXPECT_THROW(cache::TieredChunkStore({}), Error);
  EXPECT_THROW(cache::TieredChunkStore({tier("ram", 0.0, 0, nullptr)}), Error);
  EXPECT_THROW(TierPlacement(calibration_at(1.5)), Error);
  cache::TieredChunkStoreOptions o;
  o.promote_after_hits = 0;
  EXPECT_THROW(
      cache::TieredChunkStore({tier("ram", 0.0, 0, std::make_shared<cache::RamChunkStore>())}, o),
      Error);
}

// TierPlacement::set_calibration gives one model's chunks a compute model: they are placed
// by it, other models' chunks still by the options' (none here: fastest).
TEST(TieredChunkStore, PlacementUsesTheChunksModelsCalibration) {
  ThreeTiers t(0, calibrated(0.5));
  auto placement = std::make_shared<TierPlacement>();  // uncalibrated, ratio 0.15 ...
  cache::TieredChunkStoreOptions uo;
  uo.placement = placement;
  ThreeTiers u(0, uo);
  EXPECT_EQ(u.store->placement(kShape, "model-A"), 0u);
  EXPECT_FALSE(placement->has_calibration("model-A"));
  Calibration cal;
  cal.compute = CalibratedCompute{{1e-4, 0.0, 0.0}};
  placement->set_calibration("model-A", cal);  // ... now knows model-A's compute
  EXPECT_TRUE(placement->has_calibration("model-A"));
  EXPECT_EQ(u.store->placement(kShape, "model-A"), 1u);  // as at_015 above: flash
  EXPECT_EQ(u.store->placement(kShape, "model-B"), 0u);
  const cache::ChunkKey a = make_key(tokens(30));  // model-A
  EXPECT_EQ(u.store->put_placed(a, make_kv(kShape, 30)), 1u);
  u.flush();
  EXPECT_TRUE(u.flash->lookup(a));
  EXPECT_EQ(t.store->placement(kShape, "model-A"), 2u);  // the options' calibration
}

// A model's fixed per-layer cost is paid once per request, whatever its
// chunks: it hides no chunk's load, so it does not move placement.
TEST(TieredChunkStore, FixedPerLayerCostHidesNoLoad) {
  TierPlacementOptions o = calibration_at(0.15);
  o.calibration.compute = CalibratedCompute{{1e-4, 0.0, 1.0}};  // + 1 s per layer
  ThreeTiers t(0, placed_by(o));
  EXPECT_EQ(t.store->placement(kShape), 1u);  // flash, as without it; not the 5 MB/s dir
}

// Promotion goes to the nearest tier above that reads at least as fast: a
// chunk read from a fast remote tier skips a slow directory listed above it.
TEST(TieredChunkStore, PromotionSkipsASlowerTierAbove) {
  TempDir dir;
  cache::StoreOptions so;
  so.codec = Codec::kF16;
  auto sd = std::shared_ptr<cache::FlashStore>(cache::FlashStore::open(dir.sub("sd"), so));
  auto fast = std::shared_ptr<cache::FlashStore>(cache::FlashStore::open(dir.sub("fast"), so));
  auto ram = std::make_shared<cache::RamChunkStore>();
  std::vector<cache::ChunkTier> tiers;
  tiers.push_back(tier("ram", 0.0, 2, ram, std::nullopt, 4 * kChunkBytes));
  tiers.push_back(tier("sd", 5e6, 1, std::make_shared<cache::FlashChunkStore>(sd), Codec::kF16));
  tiers.push_back(
      tier("remote", 1e8, 0, std::make_shared<cache::FlashChunkStore>(fast), Codec::kF16));
  cache::TieredChunkStore store(std::move(tiers));
  const cache::ChunkKey key = make_key(tokens(33));
  store.tier_store(2).put(key, make_kv(kShape, 33));
  fast->flush();
  auto src = store.find(key, kShape);
  ASSERT_TRUE(src);
  ASSERT_TRUE(read_all(*src));
  sd->flush();
  EXPECT_TRUE(ram->find(key, kShape));  // promoted past the slower directory ...
  EXPECT_FALSE(sd->lookup(key));        // ... which got nothing
  EXPECT_EQ(store.stats().tiers[0].promoted_in, 1u);
  EXPECT_EQ(store.stats().tiers[1].promoted_in, 0u);
}

// A full RAM tier takes a promoted chunk only if it was read more often (by
// more than one read) than the chunk it would push out was hit: a working
// set larger than the budget, read in a cycle, does not churn it.
TEST(TieredChunkStore, AFullTierAdmitsOnlyAChunkReadMoreOften) {
  ThreeTiers t(kChunkBytes);  // RAM holds one chunk
  const cache::ChunkKey a = make_key(tokens(34)), b = make_key(tokens(35));
  t.store->put(a, make_kv(kShape, 34));  // uncalibrated: RAM
  t.store->tier_store(1).put(b, make_kv(kShape, 35));
  t.flush();
  const auto read = [&](const cache::ChunkKey& key) {
    auto src = t.store->find(key, kShape);
    return src && read_all(*src).has_value();
  };
  ASSERT_TRUE(read(a));  // a: 1 hit in RAM
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(read(b));  // b: 1, then 2 full reads from flash: not more than 1 + 1
    EXPECT_TRUE(t.ram->find(a, kShape));
    EXPECT_FALSE(t.ram->find(b, kShape));
    EXPECT_EQ(t.store->stats().tiers[0].promoted_in, 0u);
  }
  ASSERT_TRUE(read(b));  // b: 3 > 2: in, and a goes down to flash
  t.flush();
  EXPECT_TRUE(t.ram->find(b, kShape));
  EXPECT_FALSE(t.ram->find(a, kShape));
  EXPECT_TRUE(t.flash->lookup(a));
  const cache::TieredStats st = t.store->stats();
  EXPECT_EQ(st.tiers[0].promoted_in, 1u);
  EXPECT_EQ(st.tiers[1].demoted_in, 1u);
}

// Per-tier counters: lookups that reach a tier and miss there, hits, and
// the stored bytes read through each tier's sources.
TEST(TieredChunkStore, CountsMissesHitsAndBytesPerTier) {
  ThreeTiers t(0);
  const cache::ChunkKey key = make_key(tokens(31));
  t.store->tier_store(2).put(key, make_kv(kShape, 31));
  t.flush();
  auto src = t.store->find(key, kShape);
  ASSERT_TRUE(src);
  uint64_t stored = 0;
  for (int l = 0; l < kShape.n_layers; ++l) stored += src->layer_bytes(l);
  EXPECT_GT(stored, 0u);
  ASSERT_TRUE(read_all(*src));
  EXPECT_FALSE(t.store->find(make_key(tokens(32)), kShape));
  const cache::TieredStats st = t.store->stats();
  EXPECT_EQ(st.tiers[0].misses, 2u);
  EXPECT_EQ(st.tiers[1].misses, 2u);
  EXPECT_EQ(st.tiers[2].misses, 1u);
  EXPECT_EQ(st.tiers[2].hits, 1u);
  EXPECT_EQ(st.tiers[2].bytes_read, stored);
  EXPECT_EQ(st.tiers[0].bytes_read + st.tiers[1].bytes_read, 0u);
  EXPECT_EQ(st.tiers[2].read_failures, 0u);
  EXPECT_EQ(st.misses, 1u);
}

TEST(TieredChunkStore, SourcesOutliveTheStore) {
  ThreeTiers t(0);
  const cache::ChunkKey key = make_key(tokens(6));
  t.store->tier_store(1).put(key, make_kv(kShape, 6));
  t.flush();
  auto src = t.store->find(key, kShape);
  ASSERT_TRUE(src);
  t.store.reset();
  auto got = read_all(*src);  // completes a promotion into the orphaned RAM tier
  ASSERT_TRUE(got);
  EXPECT_TRUE(cache::testing::equals_f16_of(*got, make_kv(kShape, 6)));
}

#if CB_WITH_REDIS
// RAM over a real Redis tier: overflow demotes into Redis, a full read from
// Redis promotes back; and a Redis tier that is down is passed over.
TEST(TieredChunkStoreRedis, DemotesToAndPromotesFromRedis) {
  cache::testing::RedisServer server;
  ASSERT_EQ(server.start(), "");
  cache::RedisOptions ro;
  ro.port = server.port();
  ro.codec = Codec::kF16;
  auto redis = std::shared_ptr<cache::RedisStore>(cache::RedisStore::open(ro));
  auto ram = std::make_shared<cache::RamChunkStore>();
  std::vector<cache::ChunkTier> tiers;
  tiers.push_back(tier("ram", 0.0, 1, ram, std::nullopt, kChunkBytes));
  tiers.push_back(
      tier("redis", 1e8, 0, std::make_shared<cache::RedisChunkStore>(redis), Codec::kF16));
  cache::TieredChunkStore store(std::move(tiers));
  const cache::ChunkKey a = make_key(tokens(20)), b = make_key(tokens(21));
  store.put(a, make_kv(kShape, 20));
  store.put(b, make_kv(kShape, 21));  // a goes down to Redis
  redis->flush();
  EXPECT_FALSE(ram->find(a, kShape));
  ASSERT_TRUE(redis->lookup(a));
  auto src = store.find(a, kShape);
  ASSERT_TRUE(src);
  auto got = read_all(*src);  // promoted to RAM; b goes down
  ASSERT_TRUE(got);
  EXPECT_TRUE(cache::testing::equals_f16_of(*got, make_kv(kShape, 20)));
  redis->flush();
  EXPECT_TRUE(ram->find(a, kShape));
  EXPECT_FALSE(ram->find(b, kShape));
  EXPECT_TRUE(redis->lookup(b));
  const cache::TieredStats st = store.stats();
  EXPECT_EQ(st.tiers[0].promoted_in, 1u);
  EXPECT_EQ(st.tiers[1].demoted_in, 2u);
  EXPECT_EQ(st.tiers[1].hits, 1u);
}

// A shared tier gets a copy of every chunk placed above it: a second store
// (another device: its own RAM) over the same server is served from it.
TEST(TieredChunkStoreRedis, ASharedTierGetsEveryPlacedChunk) {
  cache::testing::RedisServer server;
  ASSERT_EQ(server.start(), "");
  cache::RedisOptions ro;
  ro.port = server.port();
  ro.codec = Codec::kF16;
  const auto device = [&](std::shared_ptr<cache::RamChunkStore> ram,
                          std::shared_ptr<cache::RedisStore> redis) {
    std::vector<cache::ChunkTier> tiers;
    tiers.push_back(tier("ram", 0.0, 1, std::move(ram), std::nullopt, 4 * kChunkBytes));
    tiers.push_back(
        tier("redis", 1e8, 0, std::make_shared<cache::RedisChunkStore>(redis), Codec::kF16));
    tiers.back().shared = true;
    return std::make_unique<cache::TieredChunkStore>(std::move(tiers));
  };
  auto redis1 = std::shared_ptr<cache::RedisStore>(cache::RedisStore::open(ro));
  auto redis2 = std::shared_ptr<cache::RedisStore>(cache::RedisStore::open(ro));
  auto ram1 = std::make_shared<cache::RamChunkStore>(),
       ram2 = std::make_shared<cache::RamChunkStore>();
  auto one = device(ram1, redis1), two = device(ram2, redis2);
  const cache::ChunkKey key = make_key(tokens(40));
  EXPECT_EQ(one->put_placed(key, make_kv(kShape, 40)), 0u);  // uncalibrated: RAM
  redis1->flush();
  EXPECT_TRUE(ram1->find(key, kShape));
  EXPECT_EQ(one->stats().tiers[1].placed, 1u);  // and written through
  auto src = two->find(key, kShape);
  ASSERT_TRUE(src);
  auto got = read_all(*src);
  ASSERT_TRUE(got);
  EXPECT_TRUE(cache::testing::equals_f16_of(*got, make_kv(kShape, 40)));
  const cache::TieredStats st = two->stats();
  EXPECT_EQ(st.tiers[0].misses, 1u);
  EXPECT_EQ(st.tiers[1].hits, 1u);
  EXPECT_GT(st.tiers[1].bytes_read, 0u);
  EXPECT_EQ(st.tiers[0].promoted_in, 1u);  // read in full: now in device two's RAM
  EXPECT_TRUE(ram2->find(key, kShape));
}

// The server killed: a source already handed out fails its reads (counted),
// lookups count the tier as failing, and a chunk placed on the server goes
// to the nearest tier above instead.
TEST(TieredChunkStoreRedis, AKilledServerFailsOverToTheTiersAbove) {
  cache::testing::RedisServer server;
  ASSERT_EQ(server.start(), "");
  TempDir dir;
  cache::StoreOptions so;
  so.codec = Codec::kF16;
  auto flash = std::shared_ptr<cache::FlashStore>(cache::FlashStore::open(dir.path(), so));
  cache::RedisOptions ro;
  ro.port = server.port();
  ro.codec = Codec::kF16;
  auto redis = std::shared_ptr<cache::RedisStore>(cache::RedisStore::open(ro));
  std::vector<cache::ChunkTier> tiers;
  tiers.push_back(
      tier("flash", 1e8, 1, std::make_shared<cache::FlashChunkStore>(flash), Codec::kF16));
  tiers.push_back(
      tier("redis", 1e8, 0, std::make_shared<cache::RedisChunkStore>(redis), Codec::kF16));
  tiers.back().shared = true;
  cache::TieredChunkStore store(std::move(tiers), calibrated(0.15));  // Redis hides: placed there
  const cache::ChunkKey a = make_key(tokens(41)), b = make_key(tokens(42));
  EXPECT_EQ(store.put_placed(a, make_kv(kShape, 41)), 1u);
  redis->flush();
  EXPECT_FALSE(flash->lookup(a));
  auto src = store.find(a, kShape);
  ASSERT_TRUE(src);
  server.stop();
  EXPECT_FALSE(read_all(*src));
  EXPECT_FALSE(store.find(a, kShape));
  EXPECT_EQ(store.put_placed(b, make_kv(kShape, 42)), 0u);  // flash, the tier above
  flash->flush();
  EXPECT_TRUE(flash->lookup(b));
  const cache::TieredStats st = store.stats();
  EXPECT_GE(st.tiers[1].read_failures, 1u);
  EXPECT_GE(st.tiers[1].failures, 2u);  // the lookup and the put
  EXPECT_NE(st.tiers[1].last_error.find("unreachable"), std::string::npos);
  EXPECT_EQ(st.tiers[0].placed, 1u);
}

TEST(TieredChunkStoreRedis, AServerThatIsDownIsPassedOver) {
  TempDir dir;
  auto flash = std::shared_ptr<cache::FlashStore>(cache::FlashStore::open(dir.path()));
  cache::RedisOptions ro;
  ro.port = cache::testing::free_loopback_port();
  auto redis = std::shared_ptr<cache::RedisStore>(cache::RedisStore::open(ro));
  std::vector<cache::ChunkTier> tiers;
  tiers.push_back(
      tier("redis", 1e8, 1, std::make_shared<cache::RedisChunkStore>(redis), Codec::kQ8));
  tiers.push_back(
      tier("flash", 1e8, 0, std::make_shared<cache::FlashChunkStore>(flash), Codec::kQ8));
  cache::TieredChunkStore store(std::move(tiers));
  const cache::ChunkKey key = make_key(tokens(7), Codec::kQ8);
  ASSERT_EQ(flash->put(key, make_kv(kShape, 7).view()), cache::PutResult::kStored);
  auto src = store.find(key, kShape);
  ASSERT_TRUE(src);
  EXPECT_TRUE(read_all(*src));  // the promotion to Redis is dropped, counted there
  redis->flush();
  EXPECT_EQ(store.stats().tiers[1].hits, 1u);
  EXPECT_GE(redis->stats().errors, 1u);
  EXPECT_NE(redis->stats().last_error.find("cannot connect"), std::string::npos);
}

// Flash (f16) over a real redis-server (f16, shared), placed on the server
// at ratio 0.15 as in AKilledServerFailsOverToTheTiersAbove.
struct FlashOverRedis {
  explicit FlashOverRedis(std::vector<std::string> server_args = {})
      : server(std::move(server_args)) {
    started = server.start();
    cache::StoreOptions so;
    so.codec = Codec::kF16;
    flash = std::shared_ptr<cache::FlashStore>(cache::FlashStore::open(dir.path(), so));
    cache::RedisOptions ro;
    ro.port = server.port();
    ro.codec = Codec::kF16;
    ro.reconnect_interval_ms = 60000;
    redis = std::shared_ptr<cache::RedisStore>(cache::RedisStore::open(ro));
    std::vector<cache::ChunkTier> tiers;
    tiers.push_back(
        tier("flash", 1e8, 1, std::make_shared<cache::FlashChunkStore>(flash), Codec::kF16));
    tiers.push_back(
        tier("redis", 1e8, 0, std::make_shared<cache::RedisChunkStore>(redis), Codec::kF16));
    tiers.back().shared = true;
    store = std::make_unique<cache::TieredChunkStore>(std::move(tiers), calibrated(0.15));
  }
  cache::testing::RedisServer server;
  std::string started;
  TempDir dir;
  std::shared_ptr<cache::FlashStore> flash;
  std::shared_ptr<cache::RedisStore> redis;
  std::unique_ptr<cache::TieredChunkStore> store;
};

// A value on the server whose header claims another shape (checksums
// right) is a miss for a request of this model, and is neither read into
// the request's rows nor promoted into flash.
TEST(TieredChunkStoreRedis, AForgedShapeOnTheServerIsAMissAndNotPromoted) {
  FlashOverRedis t;
  ASSERT_EQ(t.started, "");
  const cache::ChunkKey key = make_key(tokens(51));
  ASSERT_TRUE(t.redis->put(key, make_kv(kShape, 51).view()));
  ASSERT_TRUE(t.store->find(key, kShape));
  redisContext* c = t.server.connect();
  const std::string name = t.redis->value_name(key);
  auto* r = static_cast<redisReply*>(redisCommand(c, "GET %b", name.data(), name.size()));
  ASSERT_TRUE(r && r->type == REDIS_REPLY_STRING);
  const std::string value(r->str, r->len);
  freeReplyObject(r);
  cache::KvShape wider = kShape;
  wider.head_dim *= 4;  // the key's tokens, another model's geometry
  cache::KvShape longer = kShape;
  longer.n_tokens *= 4;
  for (const cache::KvShape& forged : {wider, longer}) {
    const std::string bad = cache::testing::forge_redis_shape(value, forged);
    r = static_cast<redisReply*>(
        redisCommand(c, "SET %b %b", name.data(), name.size(), bad.data(), bad.size()));
    freeReplyObject(r);
    EXPECT_FALSE(t.store->find(key, kShape));
  }
  t.flash->flush();
  EXPECT_FALSE(t.flash->lookup(key));
  redisFree(c);
}

// A server that is up but refuses writes (a read-only replica): an ingest's
// put goes to flash instead, and the server's tier counts a failure, not a
// placement; later puts pass it over while it keeps refusing.
TEST(TieredChunkStoreRedis, AServerThatRefusesWritesLosesNoChunk) {
  FlashOverRedis t(
      {"--replicaof", "127.0.0.1", std::to_string(cache::testing::free_loopback_port())});
  ASSERT_EQ(t.started, "");
  const cache::ChunkKey a = make_key(tokens(61)), b = make_key(tokens(62));
  EXPECT_EQ(t.store->put_placed(a, make_kv(kShape, 61), /*wait=*/true), 0u);
  EXPECT_TRUE(t.flash->lookup(a));
  EXPECT_EQ(t.store->put_placed(b, make_kv(kShape, 62)), 0u);  // a request's miss
  t.flash->flush();
  EXPECT_TRUE(t.flash->lookup(b));
  const cache::TieredStats st = t.store->stats();
  EXPECT_EQ(st.tiers[1].placed, 0u);
  EXPECT_EQ(st.tiers[1].failures, 2u);
  EXPECT_NE(st.tiers[1].last_error.find("READONLY"), std::string::npos) << st.tiers[1].last_error;
  EXPECT_EQ(st.tiers[0].placed, 2u);
}

// The same through a chunk cache's add (an ingest step): the chunk is
// written through to the server, which refuses it; the tier's counters say
// so.
TEST(ChunkCacheRedis, AddCountsAWriteTheServerRefuses) {
  cache::testing::RedisServer server(
      {"--replicaof", "127.0.0.1", std::to_string(cache::testing::free_loopback_port())});
  ASSERT_EQ(server.start(), "");
  TempDir dir;
  ChunkCacheTiers tiers;
  cache::RedisOptions ro;
  ro.port = server.port();
  tiers.redis = ro;
  cache::StoreOptions so;
  ChunkCache cc(dir.path(), so, 0.0, tiers);
  cc.add(make_key(tokens(71), Codec::kQ8), make_kv(kShape, 71));
  const cache::TieredStats st = cc.tier_stats();
  ASSERT_EQ(st.tiers.size(), 2u);
  EXPECT_EQ(st.tiers[0].placed, 1u);  // flash
  EXPECT_EQ(st.tiers[1].placed, 0u);
  EXPECT_EQ(st.tiers[1].failures, 1u);
}

// Clearing a cache leaves the shared server alone: its values are other
// processes' and devices' too (other namespaces and models included).
TEST(ChunkCacheRedis, ClearLeavesTheSharedServerAlone) {
  cache::testing::RedisServer server;
  ASSERT_EQ(server.start(), "");
  TempDir dir;
  ChunkCacheTiers tiers;
  cache::RedisOptions ro;
  ro.port = server.port();
  tiers.redis = ro;
  ChunkCache cc(dir.path(), cache::StoreOptions{}, 0.0, tiers);
  const cache::ChunkKey mine = make_key(tokens(81), Codec::kQ8);
  cc.add(mine, make_kv(kShape, 81));
  auto other = cache::RedisStore::open(ro);
  const cache::ChunkKey theirs = make_key(tokens(82), Codec::kQ8, "another-app");
  ASSERT_TRUE(other->put(theirs, make_kv(kShape, 82).view()));
  cc.clear();
  EXPECT_EQ(cc.stats().entries, 0u);
  EXPECT_TRUE(other->lookup(theirs));
  EXPECT_TRUE(other->lookup(mine));
}

#else
TEST(TieredChunkStoreRedis, NeedsTheRedisTier) {
  GTEST_SKIP() << "this build has no Redis tier (CB_REDIS=OFF or hiredis not found)";
}
#endif

}  // namespace
}  // namespace cb
