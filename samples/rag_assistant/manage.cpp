#include "manage.h"

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <set>
#include <string_view>

#include "json_writer.h"
#include "kv_store.h"
#include "printable.h"
#include "store_settings.h"

namespace fs = std::filesystem;

namespace rag {
namespace {

std::string megabytes(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

std::string utc_time(int64_t unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

// The store, the model and the chunk KV store, opened as list, status and
// remove need them, with the warnings ask gives: a read-only store, a
// model whose KV the store lacks.
struct OpenStore {
  explicit OpenStore(const CommonOptions& common) : db(corpus_db_path(common.store), false) {
    load_model(common, model);
    model_id = model_identity(common.model_path, model);
    kv_models = db.kv_models();
    system = store_system_prompt(db);
    CommonOptions with_kv = common;
    with_kv.kv = kv = load_kv_settings(db);
    open_chunk_cache(with_kv, cache);
  }

  // Warns on stderr about what makes answers slow or the store unwritable.
  void warn_like_ask(const CommonOptions& common) {
    if (!db.read_only_note().empty()) warn(db.read_only_note());
    if (const auto w = other_model_warning(common.store, kv_models, model_id, common.model_path))
      warn(*w);
  }

  // Whether each chunk's KV is in the store for this model and the store's
  // system prompt, by chunk id.  Each check is a lookup in the store (the
  // library counts it, and a found entry becomes the most recently used).
  std::map<int64_t, bool> cached_chunks(const std::vector<ChunkRecord>& chunks) {
    const cb_rag_options ro = base_rag_options(system);
    std::map<std::string_view, bool> by_text;
    std::map<int64_t, bool> out;
    for (const ChunkRecord& ch : chunks) {
      auto it = by_text.find(ch.text);
      if (it == by_text.end()) {
        int32_t found = 0;
        check(cb_chunk_cache_contains(model.h, cache.h, ch.text.c_str(), &ro, &found),
              "cannot look up a chunk in the KV store");
        it = by_text.emplace(ch.text, found != 0).first;
      }
      out[ch.id] = it->second;
    }
    return out;
  }

  cb_chunk_cache_stats kv_stats() {
    cb_chunk_cache_stats st;
    cb_chunk_cache_stats_init(&st);
    check(cb_chunk_cache_get_stats(cache.h, &st), "cannot read the store's statistics");
    return st;
  }

  CorpusDb db;
  Model model;
  ModelRecord model_id;
  std::vector<ModelRecord> kv_models;
  std::string system;
  KvStoreSettings kv;  // the store's codec and size
  ChunkCache cache;
};

cbs::JsonObject model_json(const ModelRecord& m, bool with_time) {
  cbs::JsonObject o;
  o.add("file", m.file_name)
      .add("size", static_cast<int64_t>(m.file_size))
      .add("description", m.description)
      .add("fingerprint", m.fingerprint);
  if (with_time) o.add("ingested_at", m.ingested_at);
  return o;
}

std::vector<cbs::JsonObject> models_json(const std::vector<ModelRecord>& models) {
  std::vector<cbs::JsonObject> out;
  for (const ModelRecord& m : models) out.push_back(model_json(m, true));
  return out;
}

std::string kv_models_line(const std::vector<ModelRecord>& models) {
  if (models.empty()) return "none recorded";
  std::string out;
  for (const ModelRecord& m : models)
    out += (out.empty() ? "" : "; ") + m.file_name + " (" + m.description + ", ingested " +
           utc_time(m.ingested_at) + ")";
  return out;
}

}  // namespace

std::vector<FileRecord> resolve_stored_files(const std::vector<FileRecord>& stored,
                                             const std::vector<std::string>& args) {
  std::vector<FileRecord> out;
  std::set<int64_t> taken;
  std::vector<std::string> unknown;
  auto take = [&](const FileRecord& f) {
    if (taken.insert(f.id).second) out.push_back(f);
  };
  for (const std::string& arg : args) {
    // As ingest stores it: absolute, symbolic links resolved (as far as the
    // path still exists: a file deleted since can still be named).
    std::error_code ec;
    fs::path p = arg.empty() ? fs::path() : fs::weakly_canonical(fs::absolute(arg, ec), ec);
    if (ec) p = fs::absolute(arg, ec).lexically_normal();
    const std::string path = p.string();
    bool found = false;
    if (!path.empty()) {
      for (const FileRecord& f : stored)
        if (f.path == path) {
          take(f);
          found = true;
        }
      if (!found) {
        // A folder: every stored file under it.
        const std::string prefix = path.back() == '/' ? path : path + "/";
        for (const FileRecord& f : stored)
          if (f.path.compare(0, prefix.size(), prefix) == 0) {
            take(f);
            found = true;
          }
      }
    }
    if (!found) {
      std::vector<const FileRecord*> named;
      for (const FileRecord& f : stored)
        if (f.display == arg) named.push_back(&f);
      if (named.size() > 1)
        throw Error("'" + arg + "' is the name of " + std::to_string(named.size()) +
                    " stored files: give the path of the one to remove (nothing was removed)");
      if (named.size() == 1) {
        take(*named.front());
        found = true;
      }
    }
    if (!found) unknown.push_back(arg);
  }
  if (!unknown.empty()) {
    std::string names;
    for (const std::string& u : unknown) names += (names.empty() ? "" : ", ") + u;
    throw Error("not in the store: " + names +
                " (nothing was removed; the list command shows the stored files)");
  }
  return out;
}

int run_list(const CommonOptions& common, bool json) {
  OpenStore s(common);
  s.warn_like_ask(common);
  const std::vector<FileSummary> files = s.db.file_summaries();
  const std::vector<ChunkRecord> chunks = s.db.all_chunks();
  const std::map<int64_t, bool> cached = s.cached_chunks(chunks);
  std::map<int64_t, int64_t> cached_by_file;
  int64_t n_cached = 0, n_chunks = 0, n_tokens = 0;
  for (const ChunkRecord& ch : chunks)
    if (cached.at(ch.id)) {
      ++cached_by_file[ch.file_id];
      ++n_cached;
    }
  for (const FileSummary& f : files) {
    n_chunks += f.n_chunks;
    n_tokens += f.n_tokens;
  }
  const cb_chunk_cache_stats st = s.kv_stats();
  if (json) {
    std::vector<cbs::JsonObject> rows;
    for (const FileSummary& f : files) {
      const int64_t c = cached_by_file.count(f.file.id) ? cached_by_file.at(f.file.id) : 0;
      cbs::JsonObject o;
      o.add("file", f.file.display)
          .add("path", f.file.path)
          .add("title", f.title)
          .add("chunks", f.n_chunks)
          .add("tokens", f.n_tokens)
          .add("kv_cached_chunks", c)
          .add("kv_cached", c == f.n_chunks);
      rows.push_back(std::move(o));
    }
    cbs::JsonObject o;
    o.add("store", common.store)
        .add("files", rows)
        .add("total_files", static_cast<int64_t>(files.size()))
        .add("total_chunks", n_chunks)
        .add("total_tokens", n_tokens)
        .add("kv_cached_chunks", n_cached)
        .add("kv_bytes", static_cast<int64_t>(st.bytes))
        .add("model", model_json(s.model_id, false))
        .add("model_has_kv", has_kv_for(s.kv_models, s.model_id))
        .add("kv_models", models_json(s.kv_models));
    std::printf("%s\n", o.str().c_str());
    return 0;
  }
  size_t name_width = 4;
  for (const FileSummary& f : files)
    name_width = std::max(name_width, cbs::printable(f.file.display).size());
  std::printf("%-*s  %6s  %7s  %9s  %s\n", static_cast<int>(name_width), "file", "chunks", "tokens",
              "KV cached", "path");
  for (const FileSummary& f : files) {
    const int64_t c = cached_by_file.count(f.file.id) ? cached_by_file.at(f.file.id) : 0;
    const std::string kv = std::to_string(c) + "/" + std::to_string(f.n_chunks);
    std::printf("%-*s  %6lld  %7lld  %9s  %s\n", static_cast<int>(name_width),
                cbs::printable(f.file.display).c_str(), static_cast<long long>(f.n_chunks),
                static_cast<long long>(f.n_tokens), kv.c_str(),
                cbs::printable(f.file.path).c_str());
  }
  std::printf(
      "total: %zu file(s), %lld chunk(s), %lld tokens; KV of %lld of them cached for %s; "
      "%s of chunk KV on disk (every model's)\n",
      files.size(), static_cast<long long>(n_chunks), static_cast<long long>(n_tokens),
      static_cast<long long>(n_cached), cbs::printable(s.model_id.file_name).c_str(),
      megabytes(st.bytes).c_str());
  std::printf("KV computed by ingest with: %s\n",
              cbs::printable(kv_models_line(s.kv_models)).c_str());
  return 0;
}

int run_remove(const CommonOptions& common, const std::vector<std::string>& args, bool json) {
  OpenStore s(common);
  if (!s.db.read_only_note().empty())
    throw Error("cannot remove files: " + s.db.read_only_note() + " (nothing was removed)");
  if (s.kv_stats().read_only != 0)
    throw Error("cannot remove files: the chunk KV store " + kv_dir(common.store) +
                " cannot be written (nothing was removed)");
  const std::vector<FileRecord> files = resolve_stored_files(s.db.files(), args);
  // The chunks of the files to remove; their KV goes unless a file that
  // stays has the same chunk.
  std::set<int64_t> removing;
  for (const FileRecord& f : files) removing.insert(f.id);
  std::map<int64_t, int64_t> chunks_of;
  std::set<std::string> dropped, kept;
  for (ChunkRecord& ch : s.db.all_chunks()) {
    if (removing.count(ch.file_id)) {
      ++chunks_of[ch.file_id];
      dropped.insert(std::move(ch.text));
    } else {
      kept.insert(std::move(ch.text));
    }
  }
  std::vector<int64_t> ids(removing.begin(), removing.end());
  s.db.remove_files(ids);
  const cb_rag_options ro = base_rag_options(s.system);
  int64_t kv_removed = 0;
  for (const std::string& t : dropped) {
    if (kept.count(t)) continue;
    int32_t n = 0;
    check(cb_chunk_cache_remove(s.model.h, s.cache.h, t.c_str(), &ro, &n),
          "cannot remove a chunk's KV from the store");
    kv_removed += n;
  }
  check(cb_chunk_cache_flush(s.cache.h), "cannot flush the chunk KV store");
  // Other models' KV of these chunks cannot be found without those models:
  // it stays until the store evicts it.
  std::vector<ModelRecord> others;
  for (const ModelRecord& m : s.kv_models)
    if (m.fingerprint != s.model_id.fingerprint) others.push_back(m);
  const size_t files_left = s.db.files().size();
  int64_t n_chunks = 0;
  for (const FileRecord& f : files) n_chunks += chunks_of[f.id];
  if (json) {
    std::vector<cbs::JsonObject> rows;
    for (const FileRecord& f : files) {
      cbs::JsonObject o;
      o.add("file", f.display).add("path", f.path).add("chunks", chunks_of[f.id]);
      rows.push_back(std::move(o));
    }
    cbs::JsonObject o;
    o.add("removed", rows)
        .add("chunks_removed", n_chunks)
        .add("kv_removed", kv_removed)
        .add("files_left", static_cast<int64_t>(files_left))
        .add("store", common.store);
    std::printf("%s\n", o.str().c_str());
  } else {
    for (const FileRecord& f : files)
      std::printf("removed %s (%lld chunk(s))\n", cbs::printable(f.display).c_str(),
                  static_cast<long long>(chunks_of[f.id]));
    std::printf(
        "remove: %zu file(s) and %lld chunk(s) removed; chunk KV removed for %lld chunk(s); "
        "%zu file(s) left\n",
        files.size(), static_cast<long long>(n_chunks), static_cast<long long>(kv_removed),
        files_left);
  }
  if (!others.empty())
    warn("the KV that " + model_names(others) +
         " computed for the removed chunks stays in the store until it is evicted (removing it "
         "needs that model: run remove with --model)");
  return 0;
}

int run_status(const CommonOptions& common, bool json) {
  OpenStore s(common);
  s.warn_like_ask(common);
  const std::vector<FileSummary> files = s.db.file_summaries();
  int64_t n_chunks = 0, n_tokens = 0;
  for (const FileSummary& f : files) {
    n_chunks += f.n_chunks;
    n_tokens += f.n_tokens;
  }
  const std::map<int64_t, bool> cached = s.cached_chunks(s.db.all_chunks());
  int64_t n_cached = 0;
  for (const auto& [id, c] : cached) n_cached += c ? 1 : 0;
  const cb_chunk_cache_stats st = s.kv_stats();
  const std::vector<cb_tier_stats> tiers = tier_stats(s.cache);
  const std::optional<size_t> chunk_tokens = s.db.chunk_tokens();
  const bool default_system = s.system == default_system_prompt();
  const bool model_has_kv = has_kv_for(s.kv_models, s.model_id);
  const bool db_read_only = !s.db.read_only_note().empty();
  std::string tier_names;
  for (const cb_tier_stats& t : tiers)
    tier_names += (tier_names.empty() ? "" : ", ") + std::string(t.name);
  if (json) {
    std::vector<cbs::JsonObject> tier_rows;
    for (const cb_tier_stats& t : tiers) {
      cbs::JsonObject o;
      o.add("name", t.name);
      tier_rows.push_back(std::move(o));
    }
    cbs::JsonObject o;
    o.add("store", common.store)
        .add("files", static_cast<int64_t>(files.size()))
        .add("chunks", n_chunks)
        .add("tokens", n_tokens)
        .add("kv_entries", static_cast<int64_t>(st.n_entries))
        .add("kv_bytes", static_cast<int64_t>(st.bytes))
        .add("kv_capacity_bytes", static_cast<int64_t>(s.kv.capacity_bytes))
        .add("kv_codec", codec_name(s.kv.codec))
        .add("kv_neighbours", s.kv.neighbours)
        .add("kv_cached_chunks", n_cached)
        .add("model", model_json(s.model_id, false))
        .add("model_path", common.model_path)
        .add("model_has_kv", model_has_kv)
        .add("kv_models", models_json(s.kv_models))
        .add("tiers", tier_rows)
        .add("corpus_read_only", db_read_only)
        .add("kv_read_only", st.read_only != 0)
        .add("chunk_tokens", static_cast<int64_t>(chunk_tokens.value_or(0)))
        .add("system_prompt", s.system)
        .add("system_prompt_is_default", default_system)
        .add("schema_version", static_cast<int64_t>(s.db.schema_version()));
    std::printf("%s\n", o.str().c_str());
    return 0;
  }
  const auto p = [](const char* label, const std::string& value) {
    std::printf("%-15s %s\n", label, cbs::printable(value).c_str());
  };
  p("store:", common.store);
  p("documents:", std::to_string(files.size()) + " file(s), " + std::to_string(n_chunks) +
                      " chunk(s), " + std::to_string(n_tokens) + " tokens");
  p("chunk KV store:", std::to_string(st.n_entries) + " entries, " + megabytes(st.bytes) + " of " +
                           megabytes(s.kv.capacity_bytes) + " (every model's; codec " +
                           codec_name(s.kv.codec) + (s.kv.neighbours ? ", with neighbour KV" : "") +
                           ")");
  p("model:", s.model_id.file_name + " (" + s.model_id.description + ")");
  p("", "KV cached for " + std::to_string(n_cached) + " of " + std::to_string(n_chunks) +
            " chunk(s); " +
            (s.kv_models.empty() ? "the store records no model"
             : model_has_kv      ? "the store's model"
                                 : "not the store's model"));
  p("KV computed by:", kv_models_line(s.kv_models));
  p("tiers:", tier_names.empty() ? "none" : tier_names);
  p("read-only:", db_read_only || st.read_only ? std::string("yes (nothing new can be stored)")
                                               : std::string("no"));
  p("chunk tokens:", chunk_tokens ? std::to_string(*chunk_tokens) : std::string("not recorded"));
  p("system prompt:", "\"" + s.system + "\"" + (default_system ? " (the default)" : ""));
  return 0;
}

int run_version() {
  std::printf("rag_assistant %s\nlibcacheblend %s\n", CB_VERSION_STRING, cb_version());
  return 0;
}

}  // namespace rag
