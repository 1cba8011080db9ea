#include "ingest.h"

#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <set>

#include "chunker.h"
#include "corpus_db.h"
#include "json_writer.h"
#include "printable.h"
#include "progress.h"
#include "store_settings.h"
#include "text_extract.h"

namespace fs = std::filesystem;

namespace rag {
namespace {

void note(const std::string& msg) {
  std::fprintf(stderr, "rag_assistant: %s\n", cbs::printable(msg).c_str());
}

// The model's tokenizer behind the chunker's interface.
class ModelTokens final : public TokenCounter {
 public:
  explicit ModelTokens(const Model& model) : model_(model) {}
  size_t count(std::string_view text) const override { return tokenize(model_, text).size(); }

  std::vector<std::string> split(std::string_view text, size_t max_tokens) const override {
    const std::vector<int32_t> ids = tokenize(model_, text);
    std::vector<std::string> out;
    size_t a = 0;
    while (a < ids.size()) {
      size_t b = std::min(ids.size(), a + max_tokens);
      std::string piece = detokenize(ids, a, b);
      // A byte-level token may hold part of a UTF-8 character; move the cut
      // back (or, for one huge character, forward) to a character boundary.
      while (b > a + 1 && !complete_utf8(piece)) piece = detokenize(ids, a, --b);
      while (b < ids.size() && !complete_utf8(piece)) piece = detokenize(ids, a, ++b);
      out.push_back(std::move(piece));
      a = b;
    }
    return out;
  }

 private:
  std::string detokenize(const std::vector<int32_t>& ids, size_t a, size_t b) const {
    size_t len = 0;
    check(cb_detokenize(model_.h, ids.data() + a, b - a, 0, nullptr, 0, &len), "cannot detokenize");
    std::string s(len + 1, '\0');
    check(cb_detokenize(model_.h, ids.data() + a, b - a, 0, s.data(), s.size(), &len),
          "cannot detokenize");
    s.resize(len);
    return s;
  }
  // False when `s` ends inside a multi-byte UTF-8 sequence.
  static bool complete_utf8(const std::string& s) {
    size_t k = 0;  // continuation bytes at the end
    while (k < s.size() && k < 4 &&
           (static_cast<unsigned char>(s[s.size() - 1 - k]) & 0xC0) == 0x80)
      ++k;
    if (k == s.size()) return k == 0;
    const auto lead = static_cast<unsigned char>(s[s.size() - 1 - k]);
    const size_t need = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : lead >= 0xC0 ? 1 : 0;
    return need == k;
  }
  const Model& model_;
};

// Why a walked file of no supported extension is not text, judged by its
// first bytes so that a folder's images and executables are passed over
// cheaply; nullptr when it looks like text.
const char* head_not_text_reason(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return nullptr;  // reading it says why it cannot be used
  std::string head(kHeadBytes, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  return not_text_reason(head);
}

struct Candidate {
  fs::path path;        // canonical
  std::string display;  // relative to the argument it came from
};

// Files named on the command line are taken whatever their extension; in
// folders the files of a supported type and those that look like text,
// hidden entries and the store itself skipped.  `not_text`: walked files
// passed over as binary.
std::vector<Candidate> collect(const std::vector<std::string>& args, const std::string& store,
                               size_t& skipped, size_t& not_text) {
  std::vector<Candidate> out;
  std::error_code store_ec;
  const bool store_exists = fs::is_directory(store, store_ec);
  std::set<fs::path> seen;
  auto add = [&](const fs::path& p, const std::string& display) {
    std::error_code ec;
    const fs::path canon = fs::canonical(p, ec);
    if (ec) {
      warn("skipping " + p.string() + ": " + ec.message());
      ++skipped;
      return;
    }
    if (seen.insert(canon).second) out.push_back({canon, display});
  };
  for (const std::string& arg : args) {
    std::error_code ec;
    const fs::path root(arg);
    const fs::file_status st = fs::status(root, ec);
    if (ec || !fs::exists(st)) {
      warn("skipping " + arg + ": no such file or directory");
      ++skipped;
      continue;
    }
    if (fs::is_regular_file(st)) {
      add(root, root.filename().string());
      continue;
    }
    if (!fs::is_directory(st)) {
      warn("skipping " + arg + ": not a regular file or directory");
      ++skipped;
      continue;
    }
    // The folder's own name leads the display name ("corpus/a.md").
    const fs::path root_canon = fs::canonical(root, ec);
    const fs::path base = root_canon.filename();
    std::vector<fs::path> files;
    fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec);
    if (ec) {
      warn("skipping " + arg + ": " + ec.message());
      ++skipped;
      continue;
    }
    for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) break;
      const fs::path& p = it->path();
      if (p.filename().string().rfind('.', 0) == 0) {
        if (it->is_directory(ec)) it.disable_recursion_pending();
        continue;
      }
      if (it->is_directory(ec)) {
        // A store kept inside the folder it indexes holds only its own data.
        std::error_code same_ec;
        if (store_exists && fs::equivalent(p, store, same_ec)) it.disable_recursion_pending();
        continue;
      }
      if (!it->is_regular_file(ec)) continue;
      // A folder's symbolic links to files are followed only within the
      // folder (links to folders are never followed): a walk must not pick
      // up a file from elsewhere on the system.
      if (it->is_symlink(ec)) {
        std::error_code link_ec;
        const fs::path target = fs::canonical(p, link_ec);
        const fs::path rel = target.lexically_relative(root_canon);
        if (link_ec || rel.empty() || *rel.begin() == "..") {
          warn("skipping " + p.string() + ": a symbolic link to " + target.string() + ", outside " +
               arg);
          ++skipped;
          continue;
        }
      }
      const char* why = has_supported_extension(p.string()) ? nullptr : head_not_text_reason(p);
      if (why != nullptr) {
        warn("skipping " + (base / fs::relative(p, root, ec)).string() + ": " + why);
        ++not_text;
        continue;
      }
      files.push_back(p);
    }
    if (ec) warn("while walking " + arg + ": " + ec.message());
    std::sort(files.begin(), files.end());  // stable chunk ids across runs
    for (const fs::path& p : files) add(p, (base / fs::relative(p, root, ec)).string());
  }
  return out;
}

std::string megabytes(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

// Reads the file and extracts its text; empty optional (with a warning) when
// it is unusable.
std::optional<ExtractedText> read_text_file(const Candidate& c, uint64_t max_bytes) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(c.path, ec);
  if (!ec && size > max_bytes) {
    warn("skipping " + c.display + ": " + megabytes(size) + ", more than the " +
         megabytes(max_bytes) + " a file may have (--max-file-mb)");
    return std::nullopt;
  }
  std::ifstream in(c.path, std::ios::binary);
  if (!in) {
    warn("skipping " + c.display + ": cannot read it (" + std::strerror(errno) + ")");
    return std::nullopt;
  }
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) {
    warn("skipping " + c.display + ": read error");
    return std::nullopt;
  }
  ExtractedText text = extract_text(c.path.string(), data, max_bytes);
  if (!text.skipped.empty()) {
    warn("skipping " + c.display + ": " + text.skipped);
    return std::nullopt;
  }
  return text;
}

// The hash of what the store gets from a file: its extracted text (so an
// HTML or PDF file whose text changes is re-chunked, and one whose markup
// alone changes is not) and its title where the text does not imply it.
std::string content_hash(const ExtractedText& text, size_t chunk_tokens) {
  // The chunking target is part of the hash: re-ingesting with another
  // --chunk-tokens re-chunks every file.
  XXH64_hash_t h = XXH3_64bits_withSeed(text.text.data(), text.text.size(), chunk_tokens);
  if (!text.title_from_text) h = XXH3_64bits_withSeed(text.title.data(), text.title.size(), h);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// Ingest without paths: the files the store already holds, under their
// stored names (to compute their KV for another model or system prompt, or
// to pick up their changes).
std::vector<Candidate> stored_files(const std::string& store) {
  CorpusDb db(corpus_db_path(store), false);
  std::vector<Candidate> out;
  for (const FileRecord& f : db.files()) out.push_back({fs::path(f.path), f.display});
  if (out.empty())
    throw Error("the store " + store + " holds no files: name the files or folders to ingest");
  return out;
}

// What an ingest did to the store's files.
struct FileCounts {
  size_t skipped = 0, not_text = 0, unchanged = 0, added = 0, changed = 0, removed = 0;
  size_t usable = 0, chunked_tokens = 0;
};

// The chunk length and system prompt of this ingest, and the store's so far.
struct ChunkSettings {
  std::optional<size_t> stored;  // the store's chunk length; none on a new store
  size_t chunk_tokens = 0;
  std::string old_system, system;
  bool system_changed = false;
  bool rechunked() const { return stored && *stored != chunk_tokens; }
};

ChunkSettings chunk_settings(const CommonOptions& common, const IngestOptions& opts, CorpusDb& db,
                             bool db_existed) {
  ChunkSettings cs;
  // The chunk length: the one given, else the store's own, so that a
  // re-ingest does not re-chunk everything at the default.
  cs.stored = db.chunk_tokens();
  cs.chunk_tokens =
      opts.chunk_tokens > 0 ? opts.chunk_tokens : cs.stored.value_or(kDefaultChunkTokens);
  if (cs.rechunked())
    note("re-chunking every file at " + std::to_string(cs.chunk_tokens) +
         " tokens (the store was chunked at " + std::to_string(*cs.stored) + ")");
  // The system prompt: the one given becomes the store's; else the store's.
  cs.old_system = store_system_prompt(db);
  cs.system = common.system_prompt.value_or(cs.old_system);
  cs.system_changed = db_existed && cs.system != cs.old_system;
  if (cs.system_changed)
    note("the system prompt changed (it was \"" + cs.old_system +
         "\"): every chunk's KV is computed again");
  return cs;
}

// The chunks of changed and pruned files: their KV goes too, unless
// another file still has the same chunk.
void drop_chunks_of(CorpusDb& db, int64_t file_id, std::vector<std::string>& dropped) {
  for (std::string& t : db.chunk_texts(file_id)) dropped.push_back(std::move(t));
}

// Chunks every new or changed file into the store; unchanged files (by
// content hash) are left as they are.
void chunk_files(const std::vector<Candidate>& candidates, const IngestOptions& opts,
                 size_t chunk_tokens, const ModelTokens& tokens, CorpusDb& db, FileCounts& files,
                 std::vector<std::string>& dropped) {
  Progress progress("chunking", candidates.size(), "files");
  for (size_t i = 0; i < candidates.size(); ++i) {
    const Candidate& c = candidates[i];
    progress.update(i, files.chunked_tokens);
    const std::optional<ExtractedText> data = read_text_file(c, opts.max_file_bytes);
    if (!data) {
      ++files.skipped;
      continue;
    }
    ++files.usable;
    const std::string hash = content_hash(*data, chunk_tokens);
    const std::optional<FileRecord> old = db.find_file(c.path.string());
    if (old && old->hash == hash) {
      ++files.unchanged;
      continue;
    }
    if (old) drop_chunks_of(db, old->id, dropped);
    std::vector<std::pair<std::string, int>> rows;
    for (Chunk& ch : chunk_text(data->text, chunk_tokens, tokens)) {
      files.chunked_tokens += ch.n_tokens;
      rows.emplace_back(std::move(ch.text), static_cast<int>(ch.n_tokens));
    }
    db.replace_file({0, c.path.string(), c.display, hash}, data->title, rows);
    ++(old ? files.changed : files.added);
  }
  progress.finish(candidates.size(), files.chunked_tokens);
}

// Stored files that no longer exist: dropped with --prune, else still
// answered from, with a warning.
void handle_gone_files(const IngestOptions& opts, CorpusDb& db, FileCounts& files,
                       std::vector<std::string>& dropped) {
  std::vector<std::string> gone;
  for (const FileRecord& f : db.files()) {
    std::error_code ec;
    if (fs::is_regular_file(f.path, ec)) continue;
    if (opts.prune) {
      drop_chunks_of(db, f.id, dropped);
      db.remove_file(f.id);
      ++files.removed;
    } else {
      gone.push_back(f.display);
    }
  }
  if (!gone.empty())
    warn(std::to_string(gone.size()) + " stored file(s) no longer exist but are still answered " +
         "from (" + gone.front() + (gone.size() > 1 ? ", ..." : "") +
         "): run ingest with --prune to drop them");
}

// The corpus DB a first ingest created, and the store directory if it
// made it (and it is empty).
void remove_new_store(const std::string& store, bool store_existed) {
  std::error_code ec;
  for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(corpus_db_path(store) + suffix, ec);
  if (!store_existed) fs::remove(store, ec);  // only if now empty
}

// The store's KV settings: the flags, else what the store recorded.
KvStoreSettings kv_settings(const IngestOptions& opts, CorpusDb& db, bool db_existed) {
  KvStoreSettings kv = load_kv_settings(db);
  if (opts.codec) {
    if (db_existed && *opts.codec != kv.codec)
      note(std::string("storing chunk KV as ") + codec_name(*opts.codec) + " from now on (it was " +
           codec_name(kv.codec) + "): every chunk's KV is computed again");
    kv.codec = *opts.codec;
  }
  if (opts.capacity_bytes) kv.capacity_bytes = *opts.capacity_bytes;
  if (opts.neighbours) kv.neighbours = *opts.neighbours;
  return kv;
}

// Removes the chunk KV no stored chunk reaches any more: this model's
// under the old system prompt when it changed, and that of dropped chunks
// no other file has.  Returns the entries removed.
size_t remove_stale_kv(const Model& model, const ChunkCache& cache,
                       const std::vector<ChunkRecord>& chunks,
                       const std::vector<std::string>& dropped, const ChunkSettings& cs) {
  size_t kv_removed = 0;
  // The chunks' KV so far was computed under the old system prompt.
  const cb_rag_options old_ro = base_rag_options(cs.old_system);
  if (cs.system_changed) {
    // This model's KV under the old system prompt is unreachable now.
    std::set<std::string_view> done;
    for (const ChunkRecord& ch : chunks) {
      if (!done.insert(ch.text).second) continue;
      int32_t n = 0;
      check(cb_chunk_cache_remove(model.h, cache.h, ch.text.c_str(), &old_ro, &n),
            "cannot remove a chunk's KV from the store");
      kv_removed += static_cast<size_t>(n);
    }
  }
  std::set<std::string> live;
  for (const ChunkRecord& ch : chunks) live.insert(ch.text);
  std::set<std::string_view> done;
  for (const std::string& t : dropped) {
    if (live.count(t) || !done.insert(t).second) continue;
    int32_t removed = 0;
    check(cb_chunk_cache_remove(model.h, cache.h, t.c_str(), &old_ro, &removed),
          "cannot remove a dropped chunk's KV from the store");
    kv_removed += static_cast<size_t>(removed);
  }
  return kv_removed;
}

// What run_ingest reports.
struct IngestSummary {
  FileCounts files;
  int64_t n_chunks = 0;
  PrecomputeTotals computed;
  size_t kv_removed = 0;
  size_t kv_pending = 0;
  size_t kv_neighbour_pending = 0;  // chunks without KV after their neighbour
  uint64_t kv_bytes = 0;
  KvStoreSettings kv;
  long background_pid = 0;
};

void print_summary_json(const IngestSummary& s, const IngestOptions& opts,
                        const std::string& store) {
  cbs::JsonObject o;
  o.add("files_new", static_cast<int64_t>(s.files.added))
      .add("files_changed", static_cast<int64_t>(s.files.changed))
      .add("files_unchanged", static_cast<int64_t>(s.files.unchanged))
      .add("files_removed", static_cast<int64_t>(s.files.removed))
      .add("files_skipped", static_cast<int64_t>(s.files.skipped))
      .add("chunks", s.n_chunks)
      .add("kv_computed", static_cast<int64_t>(s.computed.chunks))
      .add("kv_removed", static_cast<int64_t>(s.kv_removed))
      .add("kv_tokens_computed", static_cast<int64_t>(s.computed.tokens))
      .add("kv_pending", static_cast<int64_t>(s.kv_pending))
      .add("kv_neighbours", s.kv.neighbours)
      .add("kv_neighbour_computed", static_cast<int64_t>(s.computed.neighbour_chunks))
      .add("kv_neighbour_pending", static_cast<int64_t>(s.kv_neighbour_pending))
      .add("kv_mode", opts.kv == KvWhen::kEager  ? "eager"
                      : opts.kv == KvWhen::kLazy ? "lazy"
                                                 : "background")
      .add("kv_codec", codec_name(s.kv.codec))
      .add("kv_bytes", static_cast<int64_t>(s.kv_bytes))
      .add("kv_capacity_bytes", static_cast<int64_t>(s.kv.capacity_bytes))
      .add("background_pid", static_cast<int64_t>(s.background_pid))
      .add("store", store);
  std::printf("%s\n", o.str().c_str());
}

void print_summary(const IngestSummary& s, const IngestOptions& opts, const std::string& store) {
  std::printf(
      "ingest: %zu new, %zu changed, %zu unchanged, %zu removed, %zu skipped file(s); "
      "%lld chunks in the store; chunk KV computed for %zu chunk(s), removed for %zu\n",
      s.files.added, s.files.changed, s.files.unchanged, s.files.removed, s.files.skipped,
      static_cast<long long>(s.n_chunks), s.computed.chunks, s.kv_removed);
  if (s.kv.neighbours)
    std::printf("chunk KV after a neighbour: computed for %zu chunk(s)\n",
                s.computed.neighbour_chunks);
  std::printf("chunk KV: %s in the store (%s, at most %s)\n",
              size_text(static_cast<double>(s.kv_bytes)).c_str(), codec_name(s.kv.codec),
              size_text(static_cast<double>(s.kv.capacity_bytes)).c_str());
  if (s.kv_pending > 0 && opts.kv == KvWhen::kLazy)
    std::printf(
        "%zu chunk(s) have no KV yet: each is computed when a question first retrieves it "
        "(or run 'rag_assistant --store %s precompute')\n",
        s.kv_pending, store.c_str());
  if (s.kv_neighbour_pending > 0 && opts.kv == KvWhen::kLazy)
    std::printf(
        "%zu chunk(s) have no KV after their neighbour yet: questions use their KV computed "
        "alone until 'rag_assistant --store %s precompute' computes it\n",
        s.kv_neighbour_pending, store.c_str());
  if (s.background_pid > 0) {
    const std::string after =
        s.kv.neighbours
            ? " (and of " + std::to_string(s.kv_neighbour_pending) + " after their neighbour)"
            : "";
    std::printf(
        "computing the KV of %zu chunk(s)%s in the background at idle priority (pid %ld, log "
        "%s); questions can be asked now\n",
        s.kv_pending, after.c_str(), s.background_pid, precompute_log_path(store).c_str());
  }
}

}  // namespace

int run_ingest(const CommonOptions& common, const IngestOptions& opts) {
  IngestSummary s;
  FileCounts& files = s.files;
  const std::vector<Candidate> candidates =
      opts.paths.empty() ? stored_files(common.store)
                         : collect(opts.paths, common.store, files.skipped, files.not_text);
  const auto nothing_to_ingest = [&] {
    return Error(
        candidates.empty() && files.skipped == 0
            ? std::string("empty corpus: found no file of a type ingest reads; it reads ") +
                  supported_types()
            : "nothing to ingest: none of the given paths is a readable file with text");
  };
  // Before the store is created: a failed first ingest leaves nothing behind.
  if (candidates.empty() && !opts.prune) throw nothing_to_ingest();

  Model model;
  load_model(common, model);
  const ModelTokens tokens(model);
  // A first ingest that finds nothing usable leaves no store behind.
  std::error_code exists_ec;
  const bool store_existed = fs::exists(common.store, exists_ec);
  const bool db_existed = fs::exists(corpus_db_path(common.store), exists_ec);
  auto db = std::make_unique<CorpusDb>(corpus_db_path(common.store), true);
  const ChunkSettings cs = chunk_settings(common, opts, *db, db_existed);
  const ModelRecord model_id = model_identity(common.model_path, model);

  std::vector<std::string> dropped;
  chunk_files(candidates, opts, cs.chunk_tokens, tokens, *db, files, dropped);
  handle_gone_files(opts, *db, files, dropped);
  if (files.usable == 0) {
    if (!db_existed) {
      db.reset();
      remove_new_store(common.store, store_existed);
    }
    throw nothing_to_ingest();
  }
  files.skipped += files.not_text;
  db->set_chunk_tokens(cs.chunk_tokens);
  db->set_system_prompt(cs.system);
  // Re-chunked or under another system prompt, the KV of other models no
  // longer matches any chunk: only this model's is recorded from now on.
  if (cs.system_changed || cs.rechunked()) db->record_kv_model(model_id, true);
  CommonOptions kv_common = common;
  kv_common.kv = kv_settings(opts, *db, db_existed);
  save_kv_settings(*db, kv_common.kv);

  // KV precompute for every chunk the chunk store lacks, whether its file
  // is new or an earlier ingest was interrupted or the store evicted it.
  ChunkCache cache;
  open_chunk_cache(kv_common, cache);
  const cb_rag_options ro = base_rag_options(cs.system);
  s.kv_removed = remove_stale_kv(model, cache, db->all_chunks(), dropped, cs);
  const MissingKv missing = missing_kv(model, *db, cache, ro, kv_common.kv.neighbours);
  if (opts.kv != KvWhen::kLazy) warn_if_over_capacity(model, kv_common.kv, missing);
  if (opts.kv == KvWhen::kEager) s.computed = precompute_missing(kv_common, model, *db, cache, ro);
  check(cb_chunk_cache_flush(cache.h), "cannot flush the chunk KV store");
  db->record_kv_model(model_id, false);
  record_store_model(*db, common.model_path);
  cb_chunk_cache_stats kv_stats;
  cb_chunk_cache_stats_init(&kv_stats);
  check(cb_chunk_cache_get_stats(cache.h, &kv_stats), "cannot read the store's statistics");
  s.kv_pending = opts.kv == KvWhen::kEager ? 0 : missing.chunks;
  s.kv_neighbour_pending = opts.kv == KvWhen::kEager ? 0 : missing.neighbour_chunks;
  if (opts.kv == KvWhen::kBackground && missing.chunks + missing.neighbour_chunks > 0) {
    cache.reset();
    model.reset();
    db.reset();
    s.background_pid = start_background_precompute(kv_common);
    db = std::make_unique<CorpusDb>(corpus_db_path(common.store), false);
  }

  s.n_chunks = db->n_chunks();
  s.kv_bytes = kv_stats.bytes;
  s.kv = kv_common.kv;
  if (opts.json)
    print_summary_json(s, opts, common.store);
  else
    print_summary(s, opts, common.store);
  return 0;
}

}  // namespace rag
