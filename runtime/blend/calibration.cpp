#include "runtime/blend/calibration.h"

#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <mutex>
#include <thread>

#include "platform/cpu_features.h"
#include "platform/error.h"
#include "platform/file_io.h"
#include "platform/sqlite.h"

namespace cb {

const CalibratedDecode* Calibration::find_decode(cache::Codec codec) const {
  for (const auto& d : decode)
    if (d.codec == codec) return &d;
  return nullptr;
}

const CalibratedTier* Calibration::find_tier(const std::string& name) const {
  for (const auto& t : tiers)
    if (t.tier.name == name) return &t;
  return nullptr;
}

void Calibration::set_decode(const CalibratedDecode& d) {
  for (auto& e : decode)
    if (e.codec == d.codec) {
      e = d;
      return;
    }
  decode.push_back(d);
}

void Calibration::set_tier(const CalibratedTier& t) {
  for (auto& e : tiers)
    if (e.tier.name == t.tier.name) {
      e = t;
      return;
    }
  tiers.push_back(t);
}

namespace {

void check_alpha(double alpha) {
  if (!(alpha > 0.0 && alpha <= 1.0))
    fail(ErrorCode::kInvalidArgument, "refresh weight alpha must be in (0, 1]");
}

double ema(double old, double observed, double alpha) {
  return (1.0 - alpha) * old + alpha * observed;
}

}  // namespace

void refresh_compute(Calibration& cal, std::span<const LayerTiming> layers, double alpha) {
  check_alpha(alpha);
  if (!cal.compute || cal.compute->pinned || !cal.compute->cost.valid()) return;
  double observed = 0.0, predicted = 0.0;
  for (const LayerTiming& t : layers) {
    observed += t.seconds;
    predicted += cal.compute->cost.layer_seconds(t.rows, t.keys_per_row);
  }
  if (observed <= 0.0 || predicted <= 0.0) return;
  const double scale = ema(1.0, observed / predicted, alpha);
  ComputeCost& c = cal.compute->cost;
  c.per_row_s *= scale;
  c.per_row_key_s *= scale;
  c.per_layer_s *= scale;
  ++cal.compute->observations;
}

void refresh_decode(Calibration& cal, cache::Codec codec, double bytes, double seconds,
                    double alpha) {
  check_alpha(alpha);
  if (bytes <= 0.0 || seconds < 0.0) return;
  const CalibratedDecode* d = cal.find_decode(codec);
  if (d && d->pinned) return;
  // A codec never measured before starts from this observation: the first
  // request that decodes it is its calibration probe.
  CalibratedDecode u = d ? *d : CalibratedDecode{codec, seconds / bytes, 0, false};
  u.s_per_byte = ema(u.s_per_byte, seconds / bytes, alpha);
  ++u.observations;
  cal.set_decode(u);
}

void refresh_read(Calibration& cal, const std::string& tier, double bytes, double seconds,
                  double alpha) {
  check_alpha(alpha);
  if (bytes <= 0.0 || seconds <= 0.0) return;
  const CalibratedTier* t = cal.find_tier(tier);
  if (t && t->pinned) return;
  // A tier never measured starts from this observation (cost rank 0 until
  // the caller ranks it): otherwise an uncalibrated store would count as
  // free to read forever and the controller would never raise r.
  CalibratedTier u = t ? *t : CalibratedTier{{tier, bytes / seconds, 0}, 0, false};
  // Averaged as time per byte, not bytes per second: T_load is linear in
  // the former, so a mix of fast and slow reads averages to the right time.
  const double old_spb = u.tier.read_bytes_per_s > 0.0 ? 1.0 / u.tier.read_bytes_per_s : 0.0;
  const double spb = ema(old_spb, seconds / bytes, alpha);
  u.tier.read_bytes_per_s = spb > 0.0 ? 1.0 / spb : 0.0;
  ++u.observations;
  cal.set_tier(u);
}

// ---------------------------------------------------------------------------

// Names the database in SQLite errors.
constexpr const char kDbLabel[] = "calibration db";

struct CalibrationDb::Impl {
  sqlite3* db = nullptr;
  mutable std::mutex mu;

  void exec(const char* sql) const { sqlite::exec(db, sql, kDbLabel); }
};

namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS compute_cost(
  device BLOB NOT NULL, model BLOB NOT NULL,
  per_row_s REAL NOT NULL, per_row_key_s REAL NOT NULL, per_layer_s REAL NOT NULL,
  observations INTEGER NOT NULL, pinned INTEGER NOT NULL, updated_unix INTEGER NOT NULL,
  PRIMARY KEY(device, model));
CREATE TABLE IF NOT EXISTS decode_cost(
  device BLOB NOT NULL, model BLOB NOT NULL, codec TEXT NOT NULL,
  s_per_byte REAL NOT NULL,
  observations INTEGER NOT NULL, pinned INTEGER NOT NULL, updated_unix INTEGER NOT NULL,
  PRIMARY KEY(device, model, codec));
CREATE TABLE IF NOT EXISTS storage_tier(
  device BLOB NOT NULL, name BLOB NOT NULL,
  read_bytes_per_s REAL NOT NULL, cost_rank INTEGER NOT NULL,
  observations INTEGER NOT NULL, pinned INTEGER NOT NULL, updated_unix INTEGER NOT NULL,
  PRIMARY KEY(device, name));
)sql";

int64_t now_unix() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::unique_ptr<CalibrationDb> CalibrationDb::open(const std::string& path) {
  try {
    return open_once(path);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kFormat) throw;
  }
  // Calibration is measured, not precious: a damaged database is moved
  // aside (for inspection) and the costs are measured anew.
  rename_file(path, path + ".corrupt");
  remove_file(path + "-wal");
  remove_file(path + "-shm");
  return open_once(path);
}

std::unique_ptr<CalibrationDb> CalibrationDb::open_once(const std::string& path) {
  sqlite3* db = nullptr;
  const int rc =
      sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    fail(ErrorCode::kIo, "cannot open calibration db " + path + ": " + msg);
  }
  std::unique_ptr<CalibrationDb> out(new CalibrationDb(path, db));
  sqlite3_busy_timeout(db, 5000);
  try {
    sqlite::check_readable(db, kDbLabel);
    out->impl_->exec("PRAGMA journal_mode=WAL;");
    out->impl_->exec(kSchema);
    sqlite::check_intact(db, kSchema, kDbLabel);
  } catch (const Error& e) {
    const int rc = sqlite3_errcode(db);
    const bool damaged =
        e.code() == ErrorCode::kFormat || rc == SQLITE_NOTADB || rc == SQLITE_CORRUPT;
    fail(damaged ? ErrorCode::kFormat : ErrorCode::kIo,
         "cannot open calibration db " + path + ": " + e.what());
  }
  return out;
}

CalibrationDb::CalibrationDb(std::string path, sqlite3* db)
    : path_(std::move(path)), impl_(std::make_unique<Impl>()) {
  impl_->db = db;
}

CalibrationDb::~CalibrationDb() {
  sqlite3_close(impl_->db);
}

Calibration CalibrationDb::load(const std::string& device, const std::string& model) const {
  std::lock_guard lock(impl_->mu);
  Calibration cal;
  {
    sqlite::Statement q(
        impl_->db,
        "SELECT per_row_s, per_row_key_s, per_layer_s, observations, pinned FROM compute_cost "
        "WHERE device = ?1 AND model = ?2",
        kDbLabel);
    q.bind_blob(1, device).bind_blob(2, model);
    if (q.step())
      cal.compute = CalibratedCompute{{q.real(0), q.real(1), q.real(2)}, q.i64(3), q.i64(4) != 0};
  }
  {
    sqlite::Statement q(impl_->db,
                        "SELECT codec, s_per_byte, observations, pinned FROM decode_cost "
                        "WHERE device = ?1 AND model = ?2 ORDER BY codec",
                        kDbLabel);
    q.bind_blob(1, device).bind_blob(2, model);
    while (q.step()) {
      // A codec this build does not know (written by a newer one) is skipped.
      std::optional<cache::Codec> c = cache::parse_codec(q.blob(0));
      if (c) cal.decode.push_back({*c, q.real(1), q.i64(2), q.i64(3) != 0});
    }
  }
  {
    sqlite::Statement q(
        impl_->db,
        "SELECT name, read_bytes_per_s, cost_rank, observations, pinned FROM storage_tier "
        "WHERE device = ?1 ORDER BY cost_rank, name",
        kDbLabel);
    q.bind_blob(1, device);
    while (q.step())
      cal.tiers.push_back(
          {{q.blob(0), q.real(1), static_cast<int>(q.i64(2))}, q.i64(3), q.i64(4) != 0});
  }
  return cal;
}

void CalibrationDb::save(const std::string& device, const std::string& model,
                         const Calibration& cal) {
  std::lock_guard lock(impl_->mu);
  const int64_t now = now_unix();
  impl_->exec("BEGIN IMMEDIATE;");
  try {
    if (cal.compute) {
      sqlite::Statement q(
          impl_->db, "INSERT OR REPLACE INTO compute_cost VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
          kDbLabel);
      q.bind_blob(1, device).bind_blob(2, model);
      q.bind_double(3, cal.compute->cost.per_row_s).bind_double(4, cal.compute->cost.per_row_key_s);
      q.bind_double(5, cal.compute->cost.per_layer_s).bind(6, cal.compute->observations);
      q.bind(7, cal.compute->pinned).bind(8, now);
      q.step();
    }
    for (const CalibratedDecode& d : cal.decode) {
      sqlite::Statement q(impl_->db,
                          "INSERT OR REPLACE INTO decode_cost VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                          kDbLabel);
      q.bind_blob(1, device).bind_blob(2, model).bind_blob(3, cache::codec_name(d.codec));
      q.bind_double(4, d.s_per_byte).bind(5, d.observations).bind(6, d.pinned).bind(7, now);
      q.step();
    }
    for (const CalibratedTier& t : cal.tiers) {
      sqlite::Statement q(impl_->db,
                          "INSERT OR REPLACE INTO storage_tier VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                          kDbLabel);
      q.bind_blob(1, device).bind_blob(2, t.tier.name).bind_double(3, t.tier.read_bytes_per_s);
      q.bind(4, t.tier.cost_rank).bind(5, t.observations).bind(6, t.pinned);
      q.bind(7, now);
      q.step();
    }
    impl_->exec("COMMIT;");
  } catch (...) {
    sqlite3_exec(impl_->db, "ROLLBACK;", nullptr, nullptr, nullptr);
    throw;
  }
}

std::string default_device_id(const char* backend_name, int n_threads) {
  std::string cpu;
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) cpu = line.substr(line.find_first_not_of(' ', colon + 1));
      break;
    }
  }
  std::string id = backend_name ? backend_name : "unknown";
  if (!cpu.empty()) id += "/" + cpu;
  id += "/hw" + std::to_string(cpu_hardware_threads());
  id += "/t" + std::to_string(n_threads > 0 ? n_threads : cpu_hardware_threads());
  return id;
}

}  // namespace cb
