// The loading controller's arithmetic on synthetic cost models, the cost-model
// fit, and the calibration's persistence and refresh.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <string>

#include <unistd.h>

#include "kernels/forwarding_backend.h"
#include "platform/error.h"
#include "runtime/blend/loading_controller.h"
#include "runtime/model.h"
#include "runtime/session.h"
#include "tests/runtime/model_path.h"

namespace cb {
namespace {

namespace fs = std::filesystem;

// 1000 tokens, 900 reused, 10 layers, check at layer 1; a layer costs
// 0.1 ms per row and nothing else, so
//   T_recompute(r) = T(1000) + 9 * T(100 + 900 r) = 0.19 + 0.81 r  seconds.
Calibration synthetic() {
  Calibration cal;
  cal.compute = CalibratedCompute{{1e-4, 0.0, 0.0}};
  cal.tiers = {{{"sd", 1e6, 0}}, {{"flash", 1e8, 1}}, {{"ram", 0.0, 2}}};
  return cal;
}

RequestShape shape_with(double bytes_per_layer, const std::string& tier,
                        std::optional<cache::Codec> codec = std::nullopt) {
  RequestShape s;
  s.n_tokens = 1000;
  s.n_reused = 900;
  s.n_layers = 10;
  s.first_check_layer = 1;
  s.loads = {{tier, codec, bytes_per_layer}};
  return s;
}

TEST(LoadingController, RecomputeModelSumsFullAndSelectedLayers) {
  LoadingController c(synthetic());
  auto s = shape_with(0, "sd");
  EXPECT_NEAR(c.predict_compute_s(s, 0.0), 0.19, 1e-12);
  EXPECT_NEAR(c.predict_compute_s(s, 1.0), 1.0, 1e-12);
  // 59500 bytes per layer at 1 MB/s over 10 layers.
  EXPECT_NEAR(c.predict_load_s(shape_with(59500, "sd")), 0.595, 1e-12);
}

TEST(LoadingController, FastStorageUsesTheQualityFloor) {
  LoadingController c(synthetic());
  for (const char* tier : {"ram", "flash"}) {
    RatioChoice r = c.choose_ratio(shape_with(1000, tier));
    EXPECT_TRUE(r.calibrated);
    EXPECT_LT(r.r_star, 0.15) << tier;
    EXPECT_DOUBLE_EQ(r.ratio, 0.15) << tier;
  }
  LoadingController other_floor(synthetic(), {.r_min = 0.05});
  EXPECT_DOUBLE_EQ(other_floor.choose_ratio(shape_with(1000, "flash")).ratio, 0.05);
  // A request may set its own floor.
  EXPECT_DOUBLE_EQ(c.choose_ratio(shape_with(1000, "flash"), 0.3).ratio, 0.3);
  EXPECT_THROW(c.choose_ratio(shape_with(1000, "flash"), 1.5), Error);
}

TEST(LoadingController, SlowStorageRaisesTheRatioToHideTheLoad) {
  LoadingController c(synthetic(), {.hide_margin = 0.0});
  // Load 0.595 s = T_recompute(0.5).
  RatioChoice r = c.choose_ratio(shape_with(59500, "sd"));
  EXPECT_NEAR(r.ratio, 0.5, 1e-9);
  EXPECT_NEAR(r.compute_s, r.load_s, 1e-9);
  // Slower storage (more bytes on the same tier): r grows monotonically.
  double last = r.ratio;
  for (double bytes : {70000.0, 80000.0, 90000.0}) {
    double next = c.choose_ratio(shape_with(bytes, "sd")).ratio;
    EXPECT_GT(next, last);
    last = next;
  }
}

TEST(LoadingController, MarginLeavesSlackForTheTail) {
  LoadingController c(synthetic(), {.hide_margin = 0.2});
  // Load 0.595 s: recompute aims at 0.8 x 0.595 = 0.476 s = T_recompute(0.353).
  RatioChoice r = c.choose_ratio(shape_with(59500, "sd"));
  EXPECT_NEAR(r.ratio, (0.476 - 0.19) / 0.81, 1e-9);
  EXPECT_NEAR(r.compute_s, 0.8 * r.load_s, 1e-9);
  EXPECT_FALSE(r.skip_loads);
  EXPECT_THROW(LoadingController(synthetic(), {.hide_margin = 1.0}), Error);
}

TEST(LoadingController, RatioClampsAtOneAndSlowerLoadsAreSkipped) {
  LoadingController c(synthetic());
  // 0.95 s of loads: hidden below r = 1 (T_recompute(1) = 1 s), aiming at
  // 0.8 x 0.95 s with the default margin...
  RatioChoice r = c.choose_ratio(shape_with(95000, "sd"));
  EXPECT_NEAR(r.ratio, (0.76 - 0.19) / 0.81, 1e-9);
  EXPECT_FALSE(r.skip_loads);
  // ... 10 s of loads: recomputing everything (1 s) beats reading at all.
  r = c.choose_ratio(shape_with(1e6, "sd"));
  EXPECT_GT(r.r_star, 1.0);
  EXPECT_DOUBLE_EQ(r.ratio, 1.0);
  EXPECT_TRUE(r.skip_loads);
  EXPECT_NEAR(r.compute_s, 1.0, 1e-12);
}

// Loads that end before the recompute starts (the lookahead policy) are
// hidden by no ratio: the floor, and the cache is skipped once reading plus
// recomputing at the floor costs more than recomputing everything.
TEST(LoadingController, LoadsBeforeTheRecomputeKeepTheFloor) {
  LoadingController c(synthetic(), {.hide_margin = 0.0});
  RequestShape s = shape_with(59500, "sd");  // 0.595 s: r = 0.5 would hide it
  s.loads_overlap_recompute = false;
  RatioChoice r = c.choose_ratio(s);
  EXPECT_DOUBLE_EQ(r.ratio, 0.15);
  EXPECT_FALSE(r.skip_loads);
  // 0.7 s of loads + T_recompute(0.15) = 0.3115 s > T_recompute(1) = 1 s.
  s = shape_with(70000, "sd");
  s.loads_overlap_recompute = false;
  r = c.choose_ratio(s);
  EXPECT_TRUE(r.skip_loads);
  EXPECT_DOUBLE_EQ(r.ratio, 1.0);
  s.loads_overlap_recompute = true;  // overlapped, the same loads hide at r < 1
  EXPECT_FALSE(c.choose_ratio(s).skip_loads);
}

TEST(LoadingController, DecodeCostCountsAsLoad) {
  Calibration cal = synthetic();
  cal.decode = {{cache::Codec::kQ8, 0.5e-6}};  // 0.5 us per stored byte
  LoadingController c(cal);
  // 29750 bytes: 0.02975 s read + 0.014875 s decode per layer... on "sd".
  auto s = shape_with(29750, "sd", cache::Codec::kQ8);
  EXPECT_NEAR(c.predict_load_s(s), 10 * (0.02975 + 0.014875), 1e-12);
  // A codec without a decode entry costs only its read.
  EXPECT_NEAR(c.predict_load_s(shape_with(29750, "sd", cache::Codec::kQ4)), 0.2975, 1e-12);
}

TEST(LoadingController, UncalibratedComputeFallsBackToTheFloor) {
  Calibration cal = synthetic();
  cal.compute.reset();
  LoadingController c(cal);
  RatioChoice r = c.choose_ratio(shape_with(1e6, "sd"));
  EXPECT_FALSE(r.calibrated);
  EXPECT_DOUBLE_EQ(r.ratio, 0.15);
  EXPECT_FALSE(c.cheapest_hidden_tier(shape_with(1, "sd"), 0.15).has_value());
}

TEST(LoadingController, NothingReusedNeedsNoRatio) {
  LoadingController c(synthetic());
  auto s = shape_with(59500, "sd");
  s.n_reused = 0;
  EXPECT_DOUBLE_EQ(c.choose_ratio(s).ratio, 0.15);
  s.n_reused = 2000;  // more than the request
  EXPECT_THROW(c.choose_ratio(s), Error);
}

TEST(LoadingController, CheapestTierWhoseLoadStaysHidden) {
  LoadingController c(synthetic());
  auto s = shape_with(59500, "");  // tier ignored: each candidate is tried
  // r = 0.15: compute 0.3115 s; the SD card needs 0.595 s, flash 0.006 s.
  auto t = c.cheapest_hidden_tier(s, 0.15);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->tier.name, "flash");
  EXPECT_TRUE(t->hidden);
  // r = 0.6: compute 0.676 s hides even the SD card, the cheapest.
  t = c.cheapest_hidden_tier(s, 0.6);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->tier.name, "sd");
  EXPECT_NEAR(t->load_s, 0.595, 1e-12);
  // Without RAM and with loads nothing hides: the fastest tier, not hidden.
  Calibration cal = synthetic();
  cal.tiers.pop_back();
  LoadingController no_ram(cal);
  t = no_ram.cheapest_hidden_tier(shape_with(1e9, ""), 0.15);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->tier.name, "flash");
  EXPECT_FALSE(t->hidden);
}

TEST(LoadingController, ScheduleWithRatioKeepsGradualFiltering) {
  std::vector<CheckLayer> paper = {{1, 0.30f}, {3, 0.15f}};
  auto a = schedule_with_ratio(paper, 0.2);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_FLOAT_EQ(a[0].ratio, 0.30f);
  EXPECT_FLOAT_EQ(a[1].ratio, 0.2f);
  auto b = schedule_with_ratio(paper, 0.5);
  EXPECT_FLOAT_EQ(b[0].ratio, 0.5f);
  EXPECT_FLOAT_EQ(b[1].ratio, 0.5f);
  validate_blend_options({BlendMode::kBlend, b}, 30);
  auto c = schedule_with_ratio({}, 0.4);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].layer, 1);
}

TEST(CostModel, FitRecoversCoefficientsAndStaysNonnegative) {
  const ComputeCost truth{2e-5, 3e-9, 4e-4};
  std::vector<LayerTiming> samples;
  for (double rows : {8.0, 64.0, 256.0})
    for (double keys : {4.0, 300.0, 1000.0})
      samples.push_back({rows, keys, truth.layer_seconds(rows, keys)});
  ComputeCost fit = fit_compute_cost(samples);
  EXPECT_NEAR(fit.per_row_s, truth.per_row_s, 1e-12);
  EXPECT_NEAR(fit.per_row_key_s, truth.per_row_key_s, 1e-15);
  EXPECT_NEAR(fit.per_layer_s, truth.per_layer_s, 1e-10);
  // Data an unconstrained fit would explain with a negative overhead.
  std::vector<LayerTiming> odd = {{10, 0, 0.0009}, {20, 0, 0.0021}, {40, 0, 0.0041}};
  ComputeCost c = fit_compute_cost(odd);
  EXPECT_GE(c.per_layer_s, 0.0);
  EXPECT_GE(c.per_row_key_s, 0.0);
  EXPECT_GT(c.per_row_s, 0.0);
  EXPECT_THROW(fit_compute_cost({}), Error);
}

class CalibrationDbTest : public testing::Test {
 protected:
  void SetUp() override {
    dir = fs::path(testing::TempDir()) / ("calib_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    path = (dir / "calibration.sqlite").string();
  }
  void TearDown() override { fs::remove_all(dir); }
  fs::path dir;
  std::string path;
  // Fingerprints are raw bytes, NULs included.
  const std::string model{"fp\0\x01\xff", 5};
};

TEST_F(CalibrationDbTest, RoundTripSurvivesReopen) {
  Calibration cal = synthetic();
  cal.decode = {{cache::Codec::kQ8, 3e-9, 4, false}, {cache::Codec::kF16, 1e-9, 0, true}};
  cal.compute->observations = 7;
  {
    auto db = CalibrationDb::open(path);
    db->save("dev-a", model, cal);
    Calibration other = synthetic();
    other.compute->cost.per_row_s = 9.0;
    db->save("dev-b", model, other);
  }
  auto db = CalibrationDb::open(path);
  Calibration got = db->load("dev-a", model);
  // Loaded in (cost_rank, name) and codec-name order.
  std::sort(cal.decode.begin(), cal.decode.end(), [](auto& a, auto& b) {
    return std::string(cache::codec_name(a.codec)) < cache::codec_name(b.codec);
  });
  EXPECT_EQ(got, cal);
  EXPECT_DOUBLE_EQ(db->load("dev-b", model).compute->cost.per_row_s, 9.0);
  // Another model on the same device shares the tiers, not the costs.
  Calibration none = db->load("dev-a", "another model");
  EXPECT_FALSE(none.compute);
  EXPECT_TRUE(none.decode.empty());
  EXPECT_EQ(none.tiers.size(), 3u);
  EXPECT_THROW(CalibrationDb::open((dir / "no" / "such" / "dir.sqlite").string()), Error);
}

// A damaged database is moved aside and replaced: auto ratio keeps working
// (re-measuring) instead of failing on every request.
TEST_F(CalibrationDbTest, DamagedDatabaseIsMovedAsideAndReplaced) {
  {
    auto db = CalibrationDb::open(path);
    db->save("dev", model, synthetic());
  }
  fs::remove(path + "-wal");
  fs::remove(path + "-shm");
  std::string pages;  // a sound header over garbage pages
  {
    std::ifstream in(path, std::ios::binary);
    pages.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_GT(pages.size(), 1024u);
  std::fill(pages.begin() + 100, pages.end(), '\xab');
  for (const std::string& damage : {std::string(8192, 'x'), pages}) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << damage;
    auto db = CalibrationDb::open(path);
    EXPECT_FALSE(db->load("dev", model).compute);
    db->save("dev", model, synthetic());
    EXPECT_TRUE(db->load("dev", model).compute);
    EXPECT_TRUE(fs::exists(path + ".corrupt"));
  }
}

// Damage SQLite reads without complaint until a query meets it: a column
// renamed in the stored schema, a header this SQLite cannot use.
TEST_F(CalibrationDbTest, SchemaOrHeaderDamageIsMovedAsideAndReplaced) {
  const auto rename_column = [](const std::string& file) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(file.c_str(), &db), SQLITE_OK);
    EXPECT_EQ(sqlite3_exec(db,
                           "PRAGMA writable_schema=ON; UPDATE sqlite_master SET "
                           "sql=replace(sql, 'per_row_s', 'per_rox_s') WHERE name='compute_cost'",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  };
  const auto bad_format_number = [](const std::string& file) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(47);  // the low byte of the schema format number (1 to 4)
    f.put(static_cast<char>(63));
  };
  for (const auto& damage : {std::function<void(const std::string&)>(rename_column),
                             std::function<void(const std::string&)>(bad_format_number)}) {
    fs::remove(path + ".corrupt");
    {
      auto db = CalibrationDb::open(path);
      db->save("dev", model, synthetic());
    }
    damage(path);
    auto db = CalibrationDb::open(path);
    EXPECT_TRUE(fs::exists(path + ".corrupt"));
    EXPECT_FALSE(db->load("dev", model).compute);
    db->save("dev", model, synthetic());
    EXPECT_TRUE(db->load("dev", model).compute);
  }
}

TEST_F(CalibrationDbTest, RefreshMovesTheEstimateAndOverridesWin) {
  Calibration cal = synthetic();
  cal.decode = {{cache::Codec::kQ8, 2e-9}};
  // Observed twice the predicted time; alpha 0.5 moves halfway: x1.5.
  std::vector<LayerTiming> obs = {{100, 50, 2 * 1e-2}};
  refresh_compute(cal, obs, 0.5);
  EXPECT_NEAR(cal.compute->cost.per_row_s, 1.5e-4, 1e-15);
  EXPECT_EQ(cal.compute->observations, 1);
  refresh_decode(cal, cache::Codec::kQ8, 1000, 4e-6, 0.5);  // 4 ns/byte observed
  EXPECT_NEAR(cal.find_decode(cache::Codec::kQ8)->s_per_byte, 3e-9, 1e-18);
  // Read time per byte is averaged: 1 us/byte (1 MB/s) and 3 us/byte -> 2.
  refresh_read(cal, "sd", 1000, 3e-3, 0.5);
  EXPECT_NEAR(cal.find_tier("sd")->tier.read_bytes_per_s, 5e5, 1e-6);
  auto db = CalibrationDb::open(path);
  db->save("dev", model, cal);

  // The caller pins explicit coefficients: refreshes leave them alone.
  Calibration pinned = db->load("dev", model);
  pinned.compute = CalibratedCompute{{5e-5, 1e-9, 0.0}, 0, true};
  pinned.set_tier({{"sd", 2e6, 0}, 0, true});
  db->save("dev", model, pinned);
  Calibration again = db->load("dev", model);
  refresh_compute(again, obs, 0.5);
  refresh_read(again, "sd", 1000, 1.0, 0.5);
  EXPECT_EQ(again.compute->cost, (ComputeCost{5e-5, 1e-9, 0.0}));
  EXPECT_DOUBLE_EQ(again.find_tier("sd")->tier.read_bytes_per_s, 2e6);
  EXPECT_THROW(refresh_compute(again, obs, 0.0), Error);
}

TEST(LoadingController, ObserveStoreRefreshesReadAndDecode) {
  Calibration cal = synthetic();
  cal.decode = {{cache::Codec::kQ8, 2e-9}};
  LoadingController c(cal, {.refresh_alpha = 1.0});
  cache::ReadCounters before, after;
  after.bytes_read = 1'000'000;
  after.read_ns = 250'000'000;  // 4 MB/s
  const int q8 = static_cast<int>(cache::Codec::kQ8);
  after.codec[q8].layers = 10;
  after.codec[q8].decode_ns = 5'000'000;  // 5 ns per stored byte
  c.observe_store("sd", before, after);
  Calibration got = c.calibration();
  EXPECT_NEAR(got.find_tier("sd")->tier.read_bytes_per_s, 4e6, 1e-3);
  EXPECT_NEAR(got.find_decode(cache::Codec::kQ8)->s_per_byte, 5e-9, 1e-18);
  EXPECT_EQ(got.find_tier("flash")->tier.read_bytes_per_s, 1e8);
}

TEST(ComputeProbe, MeasuresTheModelAndIsStoredOnce) {
  static std::unique_ptr<Model> m = Model::load(test::model_path());
  Session s(*m, {.n_ctx = 256, .n_threads = 2});
  const ComputeProbe probe{{8, 32}, {0, 128}, 1, 3, {}};
  std::vector<LayerTiming> samples;
  ComputeCost c = probe_compute_cost(s, probe, &samples);
  // 8 rows cost a CPU not much less than 32 do (both read every weight):
  // the probe may run again at 32 and 128.
  EXPECT_TRUE(samples.size() == 4u || samples.size() == 8u) << samples.size();
  EXPECT_TRUE(c.valid());
  EXPECT_EQ(s.n_past(), 0);
  // More rows never predict less time (all coefficients are >= 0).
  EXPECT_GE(c.layer_seconds(64, 100), c.layer_seconds(8, 100));

  const fs::path dir = fs::path(testing::TempDir()) / ("probe_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto db = CalibrationDb::open((dir / "calibration.sqlite").string());
  const std::string dev = default_device_id(s.backend().name(), 2);
  EXPECT_NE(dev.find(s.backend().name()), std::string::npos);
  Calibration first = load_or_probe_compute(*db, dev, s, probe);
  ASSERT_TRUE(first.compute);
  // The second call finds the stored measurement instead of probing again.
  Calibration second = load_or_probe_compute(*db, dev, s, probe);
  EXPECT_EQ(second.compute, first.compute);
  fs::remove_all(dir);
}

// A device whose op takes max(launch, per_row * rows) of a simulated clock
// (a GPU: a small op costs its launch, whatever its rows); the products
// are the only ops whose time grows with the rows.  The ops still run on
// the CPU, so the session computes what it would anyway.  A weight's first
// use costs a millisecond more (mapping it in, preparing it).  Powers of
// two keep the clock's sums exact.
class LaunchBoundDevice final : public ForwardingBackend {
 public:
  LaunchBoundDevice(double launch_s, double per_row_s)
      : ForwardingBackend(make_cpu_backend(2)), launch_s_(launch_s), per_row_s_(per_row_s) {}
  double now_s = 0.0;

  void matmul(const WeightView& w, const float* x, int64_t n_rows, float* y) override {
    rows(n_rows);
    ForwardingBackend::matmul(w, x, n_rows, y);
  }
  void matmul_q8(const WeightView& w, const float* x, int64_t n_rows, float* y) override {
    rows(n_rows);
    ForwardingBackend::matmul_q8(w, x, n_rows, y);
  }
  void matmul_bias(const WeightView& w, const float* x, int64_t n_rows, const float* bias, float* y,
                   bool q8) override {
    rows(n_rows);
    ForwardingBackend::matmul_bias(w, x, n_rows, bias, y, q8);
  }
  void product(const ProductArgs& a) override {
    rows(a.n_rows);
    ForwardingBackend::product(a);
  }

 private:
  void on_op_begin(BackendOp, std::initializer_list<const void*>) override { now_s += launch_s_; }
  void on_op_weights(BackendOp, std::initializer_list<const void*> weights) override {
    for (const void* w : weights)
      if (w != nullptr && used_.insert(w).second) now_s += 0x1p-10;
  }
  void rows(int64_t n) { now_s += std::max(0.0, per_row_s_ * static_cast<double>(n) - launch_s_); }
  double launch_s_, per_row_s_;
  std::set<const void*> used_;
};

struct ProbeOnDevice {
  ComputeCost cost;
  std::vector<LayerTiming> samples;
};

ProbeOnDevice probe_on(double launch_s, double per_row_s, int64_t n_ctx) {
  static std::unique_ptr<Model> m = Model::load(test::model_path());
  auto owned = std::make_unique<LaunchBoundDevice>(launch_s, per_row_s);
  LaunchBoundDevice& dev = *owned;
  Session s(*m, {.n_ctx = n_ctx, .n_threads = 2, .n_batch = n_ctx}, std::move(owned));
  ComputeProbe probe;
  probe.contexts = {0, 256};
  probe.clock = [&dev] { return dev.now_s; };
  ProbeOnDevice out;
  out.cost = probe_compute_cost(s, probe, &out.samples);
  EXPECT_EQ(s.n_past(), 0);
  return out;
}

constexpr double kLaunchS = 0x1p-17;  // 7.6 us
constexpr double kRowS = 0x1p-24;     // 0.06 us

// A product's rows show from 128 rows on, so the default probe's 16 and 96
// rows take the same time and fit no per-row cost (a controller would keep
// its floor ratio for good); the probe runs again at 64 and 384 rows,
// where they show, and fits those.
TEST(ComputeProbe, GrowsItsRowsUntilTheirCostShows) {
  const ProbeOnDevice p = probe_on(kLaunchS, kRowS, 1024);
  ASSERT_EQ(p.samples.size(), 8u);
  const std::span<const LayerTiming> first(p.samples.data(), 4), last(p.samples.data() + 4, 4);
  EXPECT_EQ(first[0].rows, 16);
  EXPECT_EQ(first[1].rows, 96);
  EXPECT_EQ(first[0].seconds, first[1].seconds);
  EXPECT_FALSE(fit_compute_cost(first).valid());
  EXPECT_EQ(last[0].rows, 64);
  EXPECT_EQ(last[1].rows, 384);
  EXPECT_EQ(last[3].keys_per_row, 256 + 385 / 2.0);  // the context still fits
  ASSERT_TRUE(p.cost.valid());
  EXPECT_GT(p.cost.per_row_s, 0.0);
  for (const LayerTiming& t : last)
    EXPECT_NEAR(p.cost.layer_seconds(t.rows, t.keys_per_row), t.seconds, 1e-6 * t.seconds);
}

// A device whose time never grows with the rows within the context: the
// probe keeps the upper bound (all of the time per row), and a controller
// told that reads take forever recomputes everything instead of keeping
// its floor ratio.
TEST(ComputeProbe, KeepsAnUpperBoundWhenTheRowsNeverShow) {
  const ProbeOnDevice p = probe_on(kLaunchS, 0.0, 512);
  // 16 / 96 rows, then 64 / 384 with the context cut to 128; 1536 would not fit.
  ASSERT_EQ(p.samples.size(), 8u);
  EXPECT_EQ(p.samples[7].rows, 384);
  EXPECT_EQ(p.samples[7].keys_per_row, 128 + 385 / 2.0);
  EXPECT_EQ(p.cost.per_row_key_s, 0.0);
  EXPECT_EQ(p.cost.per_layer_s, 0.0);
  EXPECT_DOUBLE_EQ(p.cost.per_row_s, p.samples[7].seconds / 384);
  ASSERT_TRUE(p.cost.valid());

  Calibration cal;
  cal.compute = CalibratedCompute{p.cost, 0, false};
  cal.tiers = {{{"flash", 1.0, 0}}};
  LoadingController slow(cal);
  RequestShape shape;
  shape.n_tokens = 400;
  shape.n_reused = 380;
  shape.n_layers = 30;
  shape.loads = {{"flash", cache::Codec::kF16, 1e5}};
  const RatioChoice skip = slow.choose_ratio(shape, 0.15);
  EXPECT_TRUE(skip.calibrated);
  EXPECT_TRUE(skip.skip_loads);
  EXPECT_EQ(skip.ratio, 1.0);
  cal.tiers = {{{"flash", 1e12, 0}}};
  const RatioChoice fast = LoadingController(cal).choose_ratio(shape, 0.15);
  EXPECT_FALSE(fast.skip_loads);
  EXPECT_FLOAT_EQ(fast.ratio, 0.15);
}

// A stored compute model that predicts nothing is measured again; a
// pinned one is the caller's and stays.
TEST(ComputeProbe, AStoredModelThatPredictsNothingIsMeasuredAgain) {
  static std::unique_ptr<Model> m = Model::load(test::model_path());
  Session s(*m, {.n_ctx = 256, .n_threads = 2});
  const ComputeProbe probe{{8, 32}, {0, 128}, 1, 3, {}};
  const fs::path dir = fs::path(testing::TempDir()) / ("reprobe_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto db = CalibrationDb::open((dir / "calibration.sqlite").string());
  Calibration nothing;
  nothing.compute = CalibratedCompute{{0.0, 0.0, 1e-3}, 0, false};
  db->save("dev", m->fingerprint(), nothing);
  EXPECT_TRUE(load_or_probe_compute(*db, "dev", s, probe).compute->cost.valid());
  EXPECT_TRUE(db->load("dev", m->fingerprint()).compute->cost.valid());
  nothing.compute->pinned = true;
  db->save("dev", m->fingerprint(), nothing);
  EXPECT_EQ(load_or_probe_compute(*db, "dev", s, probe).compute, nothing.compute);
  fs::remove_all(dir);
}

TEST(LoadingController, FirstObservationCalibratesAnUnknownTier) {
  // Only the compute model is known (the C API's state after the first-use
  // probe): the first request measures the store, and the next one, now
  // seeing slow reads, recomputes more than r_min to hide them.
  Calibration cal;
  cal.compute = CalibratedCompute{{1e-4, 1e-8, 1e-3}, 0, false};
  LoadingController c(cal, {.hide_margin = 0.0});
  RequestShape shape;
  shape.n_tokens = 4000;
  shape.n_reused = 3900;
  shape.n_layers = 30;
  shape.loads = {{"flash", cache::Codec::kQ8, 0.5e6}};
  EXPECT_DOUBLE_EQ(c.choose_ratio(shape).ratio, 0.15);  // reads look free
  cache::ReadCounters before, after;
  after.bytes_read = 45'000'000;
  after.read_ns = 22'500'000'000;  // 2 MB/s
  const int q8 = static_cast<int>(cache::Codec::kQ8);
  after.codec[q8].layers = 240;
  after.codec[q8].decode_ns = 90'000'000;  // 2 ns per stored byte
  c.observe_store("flash", before, after);
  Calibration got = c.calibration();
  ASSERT_NE(got.find_tier("flash"), nullptr);
  EXPECT_NEAR(got.find_tier("flash")->tier.read_bytes_per_s, 2e6, 1e-3);
  EXPECT_EQ(got.find_tier("flash")->observations, 1);
  ASSERT_NE(got.find_decode(cache::Codec::kQ8), nullptr);
  EXPECT_NEAR(got.find_decode(cache::Codec::kQ8)->s_per_byte, 2e-9, 1e-18);
  const RatioChoice r = c.choose_ratio(shape);
  EXPECT_NEAR(r.load_s, 30 * 0.5e6 * (1 / 2e6 + 2e-9), 1e-6);
  // 7.5 s of loads against ~0.9 s of compute at r = 0 and ~13.6 s more at r = 1.
  EXPECT_GT(r.ratio, 0.3);
  EXPECT_LT(r.ratio, 1.0);
  EXPECT_NEAR(r.compute_s, r.load_s, 1e-6 * r.load_s);
}

}  // namespace
}  // namespace cb
