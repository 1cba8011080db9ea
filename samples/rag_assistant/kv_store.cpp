#include "kv_store.h"

#include <cacheblend/cacheblend_experimental.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "corpus_db.h"
#include "progress.h"
#include "retrieval.h"
#include "store_settings.h"

namespace rag {
namespace {

constexpr const char* kCodecKey = "kv_codec";
constexpr const char* kCapacityKey = "kv_capacity_bytes";
constexpr const char* kNeighboursKey = "kv_neighbours";

std::string lock_path(const std::string& store) {
  return store + "/precompute.lock";
}

// Holds DIR/precompute.lock (flock) for the process's lifetime: one
// precompute per store at a time.  The lock goes with the process, however
// it ends.
class PrecomputeLock {
 public:
  explicit PrecomputeLock(const std::string& store) {
    fd_ = ::open(lock_path(store).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error("cannot open " + lock_path(store) + ": " + std::strerror(errno));
    held_ = ::flock(fd_, LOCK_EX | LOCK_NB) == 0;
    if (held_) {
      const std::string pid = std::to_string(::getpid()) + "\n";
      if (::ftruncate(fd_, 0) == 0 && ::write(fd_, pid.data(), pid.size()) < 0) {
        // The pid is only informative; the flock is the lock.
      }
    }
  }
  ~PrecomputeLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  PrecomputeLock(const PrecomputeLock&) = delete;
  PrecomputeLock& operator=(const PrecomputeLock&) = delete;
  bool held() const { return held_; }

 private:
  int fd_ = -1;
  bool held_ = false;
};

}  // namespace

std::optional<KvWhen> parse_kv_when(std::string_view s) {
  if (s == "eager") return KvWhen::kEager;
  if (s == "lazy") return KvWhen::kLazy;
  if (s == "background") return KvWhen::kBackground;
  return std::nullopt;
}

std::optional<cb_codec> parse_codec(std::string_view s) {
  if (s == "f16") return CB_CODEC_F16;
  if (s == "q8") return CB_CODEC_Q8;
  if (s == "q4") return CB_CODEC_Q4;
  return std::nullopt;
}

const char* codec_name(cb_codec c) {
  switch (c) {
    case CB_CODEC_F16:
      return "f16";
    case CB_CODEC_Q8:
      return "q8";
    case CB_CODEC_Q4:
      return "q4";
  }
  return "?";
}

KvStoreSettings load_kv_settings(CorpusDb& db) {
  KvStoreSettings s;
  // A value this version does not understand (a newer tool's) is ignored:
  // the defaults are always safe, a wrong codec only costs recomputes.
  if (const auto v = db.setting(kCodecKey))
    if (const auto c = parse_codec(*v)) s.codec = *c;
  if (const auto v = db.setting(kCapacityKey)) {
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v->c_str(), &end, 10);
    if (!v->empty() && *end == '\0' && n > 0) s.capacity_bytes = n;
  }
  if (const auto v = db.setting(kNeighboursKey)) s.neighbours = *v == "on";
  return s;
}

void save_kv_settings(CorpusDb& db, const KvStoreSettings& s) {
  db.set_setting(kCodecKey, codec_name(s.codec));
  db.set_setting(kCapacityKey, std::to_string(s.capacity_bytes));
  db.set_setting(kNeighboursKey, s.neighbours ? "on" : "off");
}

double kv_bytes_per_token(const Model& model, cb_codec codec) {
  cb_model_info info;
  cb_model_info_init(&info);
  check(cb_model_get_info(model.h, &info), "cannot read the model's info");
  // K and V, every layer, every KV head, 2 bytes per value in f16.
  const double f16 = 2.0 * 2.0 * info.n_layer * info.n_head_kv * info.head_dim;
  switch (codec) {
    case CB_CODEC_F16:
      return f16;
    case CB_CODEC_Q8:
      return f16 * 0.463;
    case CB_CODEC_Q4:
      return f16 * 0.285;
  }
  return f16;
}

std::string size_text(double bytes) {
  char buf[32];
  // Binary units, as --kv-store-mb and --max-file-mb count.
  if (bytes >= double(1 << 30))
    std::snprintf(buf, sizeof buf, "%.2f GB", bytes / double(1 << 30));
  else
    std::snprintf(buf, sizeof buf, "%.1f MB", bytes / double(1 << 20));
  return buf;
}

MissingKv missing_kv(const Model& model, CorpusDb& db, ChunkCache& cache, const cb_rag_options& ro,
                     bool neighbours) {
  MissingKv m;
  for (const ChunkRecord& ch : db.all_chunks()) {
    m.all_tokens += static_cast<size_t>(ch.n_tokens);
    int32_t found = 0;
    check(cb_chunk_cache_contains(model.h, cache.h, ch.text.c_str(), &ro, &found),
          "cannot look up a chunk in the KV store");
    if (!found) {
      ++m.chunks;
      m.tokens += static_cast<size_t>(ch.n_tokens);
    }
    if (neighbours) {
      check(cb_chunk_cache_contains_after(model.h, cache.h, ch.text.c_str(), &ro, &found),
            "cannot look up a chunk's neighbour KV in the KV store");
      if (!found) ++m.neighbour_chunks;
    }
  }
  return m;
}

void warn_if_over_capacity(const Model& model, const KvStoreSettings& s, const MissingKv& m) {
  const double per_token = kv_bytes_per_token(model, s.codec);
  // With neighbours every chunk's KV is kept twice: computed alone and
  // after its neighbour.
  const double need = per_token * static_cast<double>(m.all_tokens) * (s.neighbours ? 2.0 : 1.0);
  if (need <= static_cast<double>(s.capacity_bytes)) return;
  char per[32];
  std::snprintf(per, sizeof per, "%.1f KB", per_token / 1024);
  warn("the corpus's chunk KV needs about " + size_text(need) + " (" +
       std::to_string(m.all_tokens) + " tokens x " + per + " per token in " + codec_name(s.codec) +
       "), more than the store's " + size_text(static_cast<double>(s.capacity_bytes)) +
       ": the least recently used chunks will be evicted and computed again when asked "
       "about.  Raise it with --kv-store-mb, store less per token with --kv-codec q4, or "
       "compute only what questions need with --kv lazy");
}

namespace {

// A chunk whose KV after its neighbour the store lacks, and the neighbour.
struct NeighbourTask {
  ChunkRecord chunk;
  ChunkRecord neighbour;
};

// The chunks without KV computed alone, and (with neighbours) those
// without KV computed after their nearest chunk.
struct PrecomputeTasks {
  std::vector<ChunkRecord> alone;
  std::vector<NeighbourTask> after;
  int max_tokens = 0;  // of one task, the neighbour included
};

PrecomputeTasks precompute_tasks(const Model& model, CorpusDb& db, ChunkCache& cache,
                                 const cb_rag_options& ro, bool neighbours) {
  PrecomputeTasks t;
  for (ChunkRecord& ch : db.all_chunks()) {
    int32_t found = 0;
    if (neighbours) {
      check(cb_chunk_cache_contains_after(model.h, cache.h, ch.text.c_str(), &ro, &found),
            "cannot look up a chunk's neighbour KV in the KV store");
      if (!found)
        if (std::optional<ChunkRecord> n = nearest_chunk(db, ch)) {
          t.max_tokens = std::max(t.max_tokens, ch.n_tokens + n->n_tokens);
          t.after.push_back({ch, std::move(*n)});
        }
    }
    check(cb_chunk_cache_contains(model.h, cache.h, ch.text.c_str(), &ro, &found),
          "cannot look up a chunk in the KV store");
    if (found) continue;
    t.max_tokens = std::max(t.max_tokens, ch.n_tokens);
    t.alone.push_back(std::move(ch));
  }
  return t;
}

std::string chunk_name(const ChunkRecord& ch) {
  return "chunk " + std::to_string(ch.index) + " of " + ch.display;
}

}  // namespace

PrecomputeTotals precompute_missing(const CommonOptions& common, const Model& model, CorpusDb& db,
                                    ChunkCache& cache, const cb_rag_options& ro) {
  const PrecomputeTasks todo = precompute_tasks(model, db, cache, ro, common.kv.neighbours);
  PrecomputeTotals t;
  if (todo.alone.empty() && todo.after.empty()) return t;
  // Room for the longest task, its chunk head (the system turn) and the
  // blank lines cb_rag_prefill adds after each chunk.
  const int n_ctx = std::min(model_n_ctx_train(model), todo.max_tokens + 256);
  Session session;
  create_session(model, common, n_ctx, session);
  if (!todo.alone.empty()) {
    Progress progress("precomputing chunk KV", todo.alone.size());
    for (const ChunkRecord& ch : todo.alone) {
      int32_t n = 0;
      const cb_status s = cb_chunk_cache_add(session.h, cache.h, ch.text.c_str(), &ro, nullptr, &n);
      if (s == CB_ERR_CONTEXT_OVERFLOW)
        throw Error(chunk_name(ch) +
                    " does not fit the model's context (use a smaller --chunk-tokens)");
      check(s, "cannot precompute the KV of " + chunk_name(ch));
      ++t.chunks;
      t.tokens += static_cast<size_t>(n);
      progress.update(t.chunks, t.tokens);
    }
    progress.finish(t.chunks, t.tokens);
  }
  if (todo.after.empty()) return t;
  Progress progress("precomputing chunk KV after neighbours", todo.after.size());
  size_t done = 0, tokens = 0;
  for (const NeighbourTask& task : todo.after) {
    int32_t n = 0;
    const cb_status s = cb_chunk_cache_add_after(session.h, cache.h, task.chunk.text.c_str(),
                                                 task.neighbour.text.c_str(), &ro, &n);
    // A pair longer than the model's context keeps the KV computed alone.
    if (s != CB_ERR_CONTEXT_OVERFLOW) {
      check(s, "cannot precompute the KV of " + chunk_name(task.chunk) + " after " +
                   chunk_name(task.neighbour));
      ++t.neighbour_chunks;
      tokens += static_cast<size_t>(task.neighbour.n_tokens + n);
    }
    progress.update(++done, tokens);
  }
  progress.finish(done, tokens);
  t.tokens += tokens;
  return t;
}

int run_precompute(const CommonOptions& common_in) {
  CommonOptions common = common_in;
  CorpusDb db(corpus_db_path(common.store), false);
  if (!db.read_only_note().empty()) warn(db.read_only_note());
  const PrecomputeLock lock(common.store);
  if (!lock.held()) {
    std::printf("precompute: another precompute is already running for %s (its pid is in %s)\n",
                common.store.c_str(), lock_path(common.store).c_str());
    return 0;
  }
  common.kv = load_kv_settings(db);
  Model model;
  load_model(common, model);
  ChunkCache cache;
  open_chunk_cache(common, cache);
  const std::string system = store_system_prompt(db);  // ro points into it
  const cb_rag_options ro = base_rag_options(system);
  warn_if_over_capacity(model, common.kv, missing_kv(model, db, cache, ro, common.kv.neighbours));
  const PrecomputeTotals t = precompute_missing(common, model, db, cache, ro);
  db.record_kv_model(model_identity(common.model_path, model), false);
  check(cb_chunk_cache_flush(cache.h), "cannot flush the chunk KV store");
  std::printf(
      "precompute: chunk KV computed for %zu chunk(s) alone and %zu after a neighbour, %zu "
      "tokens\n",
      t.chunks, t.neighbour_chunks, t.tokens);
  return 0;
}

std::string precompute_log_path(const std::string& store) {
  return store + "/precompute.log";
}

long start_background_precompute(const CommonOptions& common) {
  // The child gets the same store, model and tiers on its command line
  // (passwords through the environment, never the process list).
  std::vector<std::string> args = {"/proc/self/exe",
                                   "--store",
                                   common.store,
                                   "--model",
                                   common.model_path,
                                   "--threads",
                                   std::to_string(common.threads),
                                   "--kv-type",
                                   common.kv_type == CB_KV_F32 ? "f32" : "f16"};
  const TierOptions& t = common.tiers;
  if (t.ram_budget_bytes > 0)
    args.insert(args.end(), {"--ram-budget-mb", std::to_string(t.ram_budget_bytes >> 20)});
  if (!t.slow_dir.empty()) args.insert(args.end(), {"--slow-dir", t.slow_dir});
  if (t.slow_read_bytes_per_sec > 0)
    args.insert(args.end(), {"--slow-read-mbps",
                             std::to_string(static_cast<double>(t.slow_read_bytes_per_sec) / 1e6)});
  if (!t.redis_address.empty()) {
    args.insert(args.end(), {"--redis", t.redis_address});
    if (!t.redis_username.empty()) args.insert(args.end(), {"--redis-user", t.redis_username});
    if (t.redis_timeout_ms > 0)
      args.insert(args.end(), {"--redis-timeout-ms", std::to_string(t.redis_timeout_ms)});
  }
  if (t.placement_ratio >= 0.0f)
    args.insert(args.end(), {"--placement-ratio", std::to_string(t.placement_ratio)});
  args.push_back("precompute");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The environment is built before fork: between fork and exec only
  // async-signal-safe calls are allowed (the library's threads may hold the
  // allocator's lock).
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e)
    if (std::strncmp(*e, "CB_REDIS_PASSWORD=", 18) != 0) env_strings.emplace_back(*e);
  if (!t.redis_password.empty()) env_strings.push_back("CB_REDIS_PASSWORD=" + t.redis_password);
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  const std::string log = precompute_log_path(common.store);
  const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) throw Error("cannot create " + log + ": " + std::strerror(errno));
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    ::close(log_fd);
    throw Error(std::string("cannot start the background precompute: ") + std::strerror(e));
  }
  if (pid == 0) {
    // Only async-signal-safe calls from here to exec.  Its own session: the
    // terminal's Ctrl-C and hang-up are not for it.
    ::setsid();
    struct sched_param sp {};
    if (::sched_setscheduler(0, SCHED_IDLE, &sp) != 0) (void)::setpriority(PRIO_PROCESS, 0, 19);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    ::dup2(log_fd, STDOUT_FILENO);
    ::dup2(log_fd, STDERR_FILENO);
    ::execve(argv[0], argv.data(), envp.data());
    static const char kFailed[] = "rag_assistant: error: cannot run the precompute\n";
    (void)!::write(STDERR_FILENO, kFailed, sizeof kFailed - 1);
    ::_exit(127);
  }
  ::close(log_fd);
  return static_cast<long>(pid);
}

}  // namespace rag
