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

struct CalibrationDb::Impl {
  sqlite3* db = nullptr;
  mutable std::mutex mu;

  [[noreturn]] void fail_sql(const std::string& what) const {
    fail(ErrorCode::kIo, "calibration db: " + what + ": " + sqlite3_errmsg(db));
  }
  void exec(const char* sql) const {
    char* err = nullptr;
    if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
      std::string msg = err ? err : "unknown error";
      sqlite3_free(err);
      fail(ErrorCode::kIo, std::string("calibration db: ") + msg);
    }
  }
};

namespace {

// A prepared statement that finalizes itself.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    if (sqlite3_prepare_v2(db, sql, -1, &s_, nullptr) != SQLITE_OK)
      fail(ErrorCode::kIo, std::string("calibration db: ") + sqlite3_errmsg(db));
  }
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  Stmt& text(int i, const std::string& t) {
    // Model fingerprints are raw bytes: bound as blobs so no byte is lost.
    return check(sqlite3_bind_blob64(s_, i, t.data(), t.size(), SQLITE_TRANSIENT));
  }
  Stmt& real(int i, double v) { return check(sqlite3_bind_double(s_, i, v)); }
  Stmt& integer(int i, int64_t v) { return check(sqlite3_bind_int64(s_, i, v)); }
  bool step() {
    const int rc = sqlite3_step(s_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    fail(ErrorCode::kIo, std::string("calibration db: ") + sqlite3_errmsg(db_));
  }
  double real(int col) const { return sqlite3_column_double(s_, col); }
  int64_t integer(int col) const { return sqlite3_column_int64(s_, col); }
  std::string str(int col) const {
    const void* p = sqlite3_column_blob(s_, col);
    const int n = sqlite3_column_bytes(s_, col);
    return p ? std::string(static_cast<const char*>(p), static_cast<size_t>(n)) : std::string();
  }

 private:
  Stmt& check(int rc) {
    if (rc != SQLITE_OK)
      fail(ErrorCode::kIo, std::string("calibration db: ") + sqlite3_errmsg(db_));
    return *this;
  }
  sqlite3* db_;
  sqlite3_stmt* s_ = nullptr;
};

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
    out->impl_->exec("PRAGMA journal_mode=WAL;");
    out->impl_->exec(kSchema);
    Stmt check(db, "PRAGMA quick_check;");
    if (!check.step() || check.str(0) != "ok") fail(ErrorCode::kFormat, "damaged: " + check.str(0));
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
    Stmt q(impl_->db,
           "SELECT per_row_s, per_row_key_s, per_layer_s, observations, pinned FROM compute_cost "
           "WHERE device = ?1 AND model = ?2");
    q.text(1, device).text(2, model);
    if (q.step())
      cal.compute =
          CalibratedCompute{{q.real(0), q.real(1), q.real(2)}, q.integer(3), q.integer(4) != 0};
  }
  {
    Stmt q(impl_->db,
           "SELECT codec, s_per_byte, observations, pinned FROM decode_cost "
           "WHERE device = ?1 AND model = ?2 ORDER BY codec");
    q.text(1, device).text(2, model);
    while (q.step()) {
      // A codec this build does not know (written by a newer one) is skipped.
      std::optional<cache::Codec> c = cache::parse_codec(q.str(0));
      if (c) cal.decode.push_back({*c, q.real(1), q.integer(2), q.integer(3) != 0});
    }
  }
  {
    Stmt q(impl_->db,
           "SELECT name, read_bytes_per_s, cost_rank, observations, pinned FROM storage_tier "
           "WHERE device = ?1 ORDER BY cost_rank, name");
    q.text(1, device);
    while (q.step())
      cal.tiers.push_back(
          {{q.str(0), q.real(1), static_cast<int>(q.integer(2))}, q.integer(3), q.integer(4) != 0});
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
      Stmt q(impl_->db,
             "INSERT OR REPLACE INTO compute_cost VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)");
      q.text(1, device).text(2, model);
      q.real(3, cal.compute->cost.per_row_s).real(4, cal.compute->cost.per_row_key_s);
      q.real(5, cal.compute->cost.per_layer_s).integer(6, cal.compute->observations);
      q.integer(7, cal.compute->pinned).integer(8, now);
      q.step();
    }
    for (const CalibratedDecode& d : cal.decode) {
      Stmt q(impl_->db, "INSERT OR REPLACE INTO decode_cost VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)");
      q.text(1, device).text(2, model).text(3, cache::codec_name(d.codec));
      q.real(4, d.s_per_byte).integer(5, d.observations).integer(6, d.pinned).integer(7, now);
      q.step();
    }
    for (const CalibratedTier& t : cal.tiers) {
      Stmt q(impl_->db, "INSERT OR REPLACE INTO storage_tier VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)");
      q.text(1, device).text(2, t.tier.name).real(3, t.tier.read_bytes_per_s);
      q.integer(4, t.tier.cost_rank).integer(5, t.observations).integer(6, t.pinned);
      q.integer(7, now);
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
