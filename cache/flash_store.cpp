#include "cache/flash_store.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <unordered_set>

#include "cache/blob_format.h"
#include "cache/codec.h"
#include "cache/index.h"
#include "cache/throttle.h"
#include "cache/write_back_queue.h"
#include "platform/error.h"
#include "platform/file_io.h"

namespace cb::cache {

// An entry's blob, opened by lookup.  Shared by copies of a handle; an open
// descriptor keeps the data readable after an unlink by eviction.
struct OpenBlob {
  File file;
  std::string name;
  std::vector<SegmentRef> segments;
};

struct FlashStore::Counters {
  std::atomic<uint64_t> hits{0}, misses{0}, puts{0}, put_duplicates{0}, put_no_room{0};
  std::atomic<uint64_t> evictions{0}, corrupt_drops{0}, quarantined{0};
  std::atomic<uint64_t> async_queued{0}, async_dropped{0}, async_failed{0};
  std::atomic<uint64_t> bytes_read{0}, read_ns{0};
  std::array<std::atomic<uint64_t>, 4> codec_layers{}, codec_bytes{}, codec_ns{};
};

namespace {

using Clock = std::chrono::steady_clock;

// Up to this many orphaned blobs (and no more than the live entries) are
// deleted at open; beyond, they are quarantined (see reconcile()).
constexpr size_t kMaxOrphansSwept = 8;

uint64_t ns_since(Clock::time_point t0) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
}

// Cleanup on an error path must not replace the error being reported.
void remove_quietly(const std::string& path) {
  try {
    remove_file(path);
  } catch (const Error&) {
  }
}

}  // namespace

uint64_t ChunkHandle::layer_bytes(int layer) const {
  if (!blob_ || layer < 0 || layer >= shape_.n_layers) {
    fail(ErrorCode::kInvalidArgument,
         "chunk handle: layer " + std::to_string(layer) + " out of range");
  }
  return blob_->segments[layer].size;
}

uint64_t ChunkHandle::total_bytes() const {
  uint64_t n = 0;
  if (blob_) {
    for (const SegmentRef& s : blob_->segments) n += s.size;
  }
  return n;
}

std::unique_ptr<FlashStore> FlashStore::open(const std::string& dir, const StoreOptions& options) {
  if (dir.empty()) fail(ErrorCode::kInvalidArgument, "chunk store: empty directory path");
  if (options.busy_timeout_ms < 0) {
    fail(ErrorCode::kInvalidArgument, "chunk store: busy_timeout_ms must be >= 0");
  }
  return std::unique_ptr<FlashStore>(new FlashStore(dir, options));
}

FlashStore::FlashStore(const std::string& dir, const StoreOptions& options)
    : dir_(dir),
      blob_dir_(dir + "/blobs"),
      lock_path_(dir + "/store.lock"),
      options_(options),
      throttle_(std::make_unique<Throttle>(options.read_bytes_per_sec)),
      counters_(std::make_unique<Counters>()) {
  make_dirs(dir_);
  try {
    check_writable_dir(dir_);
    make_dirs(blob_dir_);
    open_index();
    reconcile();
  } catch (const Error& e) {
    // Answering needs no writes: an index that exists is read as it is.
    const std::string index_path = dir_ + "/index.sqlite";
    if (e.code() != ErrorCode::kIo || !path_exists(index_path)) throw;
    index_.reset();
    try {
      index_ = std::make_unique<Index>(index_path, options_.busy_timeout_ms, true);
    } catch (const Error&) {
      throw e;  // why it cannot be written says more than why it cannot be read
    }
    read_only_reason_ = e.what();
  }
  queue_ = std::make_unique<WriteBackQueue>(options_.write_back_depth);
}

FlashStore::~FlashStore() {
  queue_.reset();  // drains pending puts while the rest of the store exists
}

void FlashStore::open_index() {
  const std::string path = dir_ + "/index.sqlite";
  try {
    index_ = std::make_unique<Index>(path, options_.busy_timeout_ms);
    return;
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kFormat || !options_.rebuild_corrupt_index) throw;
    rebuilt_index_reason_ = e.what();
  }
  // Move the damaged index aside, but only while no other process is writing
  // to this store; the orphaned blobs go in reconcile().
  FileLock lock =
      FileLock::try_acquire(lock_path_, FileLock::Mode::kExclusive, options_.busy_timeout_ms);
  if (!lock.held()) {
    fail(ErrorCode::kFormat, path + " is corrupt and another process holds the store");
  }
  rename_file(path, path + ".corrupt");
  remove_file(path + "-wal");
  remove_file(path + "-shm");
  sync_dir(dir_);
  index_ = std::make_unique<Index>(path, options_.busy_timeout_ms);
}

void FlashStore::reconcile() {
  // Exclusive against every writer's blob-to-row window; if writers keep the
  // store busy, skip: a later open repairs what is left.
  FileLock lock =
      FileLock::try_acquire(lock_path_, FileLock::Mode::kExclusive, options_.busy_timeout_ms);
  if (!lock.held()) return;
  std::lock_guard<std::mutex> guard(index_mu_);
  std::unordered_set<std::string> live;
  for (const BlobRow& row : index_->all_blobs()) {
    const int64_t size = file_size_or_missing(blob_path(row.blob));
    if (size < 0 || static_cast<uint64_t>(size) != row.bytes) {
      index_->remove(row.id, row.blob);  // missing or truncated: the row cannot be served
      counters_->corrupt_drops++;
    } else {
      live.insert(row.blob);
    }
  }
  // Only this store's own names are swept (orphaned blobs, dead writers'
  // temp files), and never through a symlinked blobs/: whatever else lies
  // there belongs to someone else.
  if (!is_symlink(blob_dir_)) {
    std::vector<std::string> orphans;
    for (const std::string& name : list_dir(blob_dir_)) {
      if (live.count(name)) continue;
      if (is_temp_name(name)) remove_quietly(blob_path(name));
      if (is_blob_name(name)) orphans.push_back(name);
    }
    // A few orphans are a writer that died between its blob and its row.
    // More orphans than live entries mean the index is not this blob
    // folder's (another store's index or -wal copied in, a rebuilt index):
    // the blobs are moved aside, not deleted.
    if (orphans.size() > std::max<size_t>(kMaxOrphansSwept, live.size())) {
      quarantine(orphans);
    } else {
      unlink_blobs(orphans);
    }
  }
  const std::vector<std::string> trimmed = index_->trim_to(options_.capacity_bytes);
  counters_->evictions += trimmed.size();
  for (const std::string& name : trimmed) remove_quietly(blob_path(name));
}

Codec FlashStore::resolve(const ChunkKey& key) const {
  return key.codec.value_or(options_.codec);
}

std::string FlashStore::blob_path(const std::string& name) const {
  return blob_dir_ + "/" + name;
}

void FlashStore::drop_entry(int64_t id, const std::string& blob) {
  bool removed = false;
  try {
    std::lock_guard<std::mutex> guard(index_mu_);
    removed = index_->remove(id, blob);
  } catch (const Error&) {
    // Index busy or failing: the entry stays and fails its check again next
    // time; the caller already treats it as a miss.
  }
  if (removed) counters_->corrupt_drops++;
  // The name is unique to this entry, so unlinking it can never hurt another.
  remove_quietly(blob_path(blob));
}

void FlashStore::unlink_blobs(const std::vector<std::string>& names) {
  for (const std::string& name : names) remove_quietly(blob_path(name));
}

void FlashStore::quarantine(const std::vector<std::string>& names) {
  const std::string dest =
      dir_ + "/quarantine/" + std::to_string(std::time(nullptr)) + "-" + std::to_string(::getpid());
  try {
    make_dirs(dest);
    for (const std::string& name : names) rename_file(blob_path(name), dest + "/" + name);
    counters_->quarantined += names.size();
    quarantine_dir_ = dest;
  } catch (const Error&) {
    // Left where they are: the next open tries again; nothing is lost.
  }
}

std::optional<ChunkHandle> FlashStore::lookup(const ChunkKey& key) {
  const Codec codec = resolve(key);
  const uint64_t hash = hash_key(key, codec);
  std::optional<EntryRecord> rec;
  {
    std::lock_guard<std::mutex> guard(index_mu_);
    rec = index_->find(key, codec, hash);
  }
  if (!rec) {
    counters_->misses++;
    return std::nullopt;
  }
  auto blob = std::make_shared<OpenBlob>();
  blob->name = rec->blob;
  // An index row is read back like any stored value: its shape must be one
  // the key can have, with one segment per layer.
  bool ok = shape_matches_key(rec->shape, key) &&
            rec->segments.size() == static_cast<size_t>(rec->shape.n_layers);
  if (ok) {
    try {
      blob->file = File::open_read(blob_path(rec->blob));
      ok = blob->file.size() == rec->bytes;
    } catch (const Error&) {
      ok = false;  // missing or unreadable blob
    }
  }
  for (const SegmentRef& s : rec->segments) {
    ok = ok && s.offset >= kBlobHeaderBytes && s.size <= rec->bytes &&
         s.offset <= rec->bytes - s.size;  // not offset + size: a damaged offset may wrap it
  }
  if (!ok) {
    drop_entry(rec->id, rec->blob);
    counters_->misses++;
    return std::nullopt;
  }
  try {
    std::lock_guard<std::mutex> guard(index_mu_);
    index_->touch(rec->id);
  } catch (const Error&) {
    // LRU order is bookkeeping; a busy index must not turn a hit into a miss.
  }
  counters_->hits++;
  blob->segments = std::move(rec->segments);
  ChunkHandle h;
  h.entry_id_ = rec->id;
  h.shape_ = rec->shape;
  h.codec_ = rec->codec;
  h.blob_ = std::move(blob);
  return h;
}

bool FlashStore::fetch_layer(const ChunkHandle& handle, int layer, float* k_out, float* v_out) {
  if (!handle.blob_) fail(ErrorCode::kInvalidArgument, "fetch_layer: empty chunk handle");
  if (layer < 0 || layer >= handle.shape_.n_layers) {
    fail(ErrorCode::kInvalidArgument, "fetch_layer: layer " + std::to_string(layer) +
                                          " out of range for " +
                                          std::to_string(handle.shape_.n_layers) + " layers");
  }
  if (!k_out || !v_out) fail(ErrorCode::kInvalidArgument, "fetch_layer: null output");
  const OpenBlob& blob = *handle.blob_;
  const SegmentRef& seg = blob.segments[layer];
  thread_local std::vector<uint8_t> buf;
  buf.resize(seg.size);

  const auto t0 = Clock::now();
  throttle_->acquire(seg.size);
  bool ok;
  try {
    ok = blob.file.pread_some(buf.data(), seg.size, seg.offset) == seg.size &&
         segment_checksum(buf.data(), seg.size) == seg.checksum;
  } catch (const Error&) {
    ok = false;  // EIO on a bad sector is as good as corrupt
  }
  counters_->read_ns += ns_since(t0);
  counters_->bytes_read += seg.size;
  if (ok) {
    const auto t1 = Clock::now();
    try {
      decode_layer(handle.codec_, handle.shape_, buf.data(), seg.size, k_out, v_out);
    } catch (const Error&) {
      ok = false;  // checksum matched bytes the index row does not describe
    }
    const int c = static_cast<int>(handle.codec_);
    counters_->codec_ns[c] += ns_since(t1);
    counters_->codec_layers[c]++;
    counters_->codec_bytes[c] += 2 * 2 * static_cast<uint64_t>(handle.shape_.layer_floats());
  }
  if (!ok) drop_entry(handle.entry_id_, blob.name);
  return ok;
}

PutResult FlashStore::put(const ChunkKey& key, const ChunkKVView& kv) {
  if (!read_only_reason_.empty())
    fail(ErrorCode::kIo, dir_ + ": the chunk store is open read-only (" + read_only_reason_ + ")");
  const Codec codec = resolve(key);
  const uint64_t hash = hash_key(key, codec);
  {
    std::lock_guard<std::mutex> guard(index_mu_);
    if (index_->find(key, codec, hash)) {  // skip the encode when already stored
      counters_->put_duplicates++;
      return PutResult::kAlreadyPresent;
    }
  }
  if (!shape_matches_key(kv.shape, key))
    fail(ErrorCode::kInvalidArgument,
         "flash store: the chunk's KV does not match its key's tokens");
  const EncodedBlob blob = encode_blob(codec, kv, hash, options_.zstd_level);
  const uint64_t bytes = blob.bytes.size();
  if (bytes > options_.capacity_bytes) {
    counters_->put_no_room++;
    return PutResult::kNoRoom;
  }

  // Shared lock from before the temp file exists until the row commits, so
  // no other process's open() takes our blob for an orphan.
  const FileLock lock =
      FileLock::acquire(lock_path_, FileLock::Mode::kShared, options_.busy_timeout_ms);
  const std::string name = new_blob_name(hash);
  const std::string final_path = blob_path(name);
  const std::string temp_path = blob_path(temp_name_for(name));
  try {
    File f = File::create_new(temp_path);
    f.pwrite_all(blob.bytes.data(), blob.bytes.size(), 0);
    f.sync();
    f.close();
    rename_file(temp_path, final_path);
    sync_dir(blob_dir_);
  } catch (...) {
    remove_quietly(temp_path);
    remove_quietly(final_path);
    throw;
  }

  Index::InsertOutcome out;
  try {
    std::lock_guard<std::mutex> guard(index_mu_);
    out = index_->insert(key, codec, hash, kv.shape, name, bytes, blob.segments,
                         options_.capacity_bytes);
  } catch (...) {
    remove_quietly(final_path);
    throw;
  }
  unlink_blobs(out.evicted_blobs);
  counters_->evictions += out.evicted_blobs.size();
  switch (out.status) {
    case Index::InsertStatus::kInserted:
      counters_->puts++;
      return PutResult::kStored;
    case Index::InsertStatus::kDuplicate:
      remove_quietly(final_path);
      counters_->put_duplicates++;
      return PutResult::kAlreadyPresent;
    case Index::InsertStatus::kNoRoom:
      break;
  }
  remove_quietly(final_path);
  counters_->put_no_room++;
  return PutResult::kNoRoom;
}

bool FlashStore::put_async(ChunkKey key, ChunkKV kv) {
  auto job = [this, key = std::move(key), kv = std::move(kv)] {
    try {
      put(key, kv.view());
    } catch (const std::exception& e) {
      counters_->async_failed++;
      std::lock_guard<std::mutex> guard(error_mu_);
      last_async_error_ = e.what();
    }
  };
  if (!queue_->push(std::move(job))) {
    counters_->async_dropped++;
    return false;
  }
  counters_->async_queued++;
  return true;
}

void FlashStore::flush() {
  queue_->flush();
}

bool FlashStore::pin(const ChunkKey& key) {
  const Codec codec = resolve(key);
  std::lock_guard<std::mutex> guard(index_mu_);
  const auto rec = index_->find(key, codec, hash_key(key, codec));
  return rec && index_->set_pinned(rec->id, true);
}

bool FlashStore::unpin(const ChunkKey& key) {
  const Codec codec = resolve(key);
  std::lock_guard<std::mutex> guard(index_mu_);
  const auto rec = index_->find(key, codec, hash_key(key, codec));
  return rec && index_->set_pinned(rec->id, false);
}

bool FlashStore::remove(const ChunkKey& key) {
  const Codec codec = resolve(key);
  std::optional<EntryRecord> rec;
  bool removed = false;
  {
    std::lock_guard<std::mutex> guard(index_mu_);
    rec = index_->find(key, codec, hash_key(key, codec));
    removed = rec && index_->remove(rec->id, rec->blob);
  }
  if (removed) remove_quietly(blob_path(rec->blob));
  return removed;
}

void FlashStore::clear() {
  std::vector<std::string> names;
  {
    std::lock_guard<std::mutex> guard(index_mu_);
    names = index_->remove_all();
  }
  unlink_blobs(names);
}

StoreStats FlashStore::stats() const {
  StoreStats s;
  {
    std::lock_guard<std::mutex> guard(index_mu_);
    s.entries = index_->entry_count();
    s.bytes = index_->total_bytes();
  }
  const Counters& c = *counters_;
  s.capacity_bytes = options_.capacity_bytes;
  s.hits = c.hits;
  s.misses = c.misses;
  s.puts = c.puts;
  s.put_duplicates = c.put_duplicates;
  s.put_no_room = c.put_no_room;
  s.evictions = c.evictions;
  s.corrupt_drops = c.corrupt_drops;
  s.quarantined = c.quarantined;
  s.read_only = !read_only_reason_.empty();
  s.async_queued = c.async_queued;
  s.async_dropped = c.async_dropped;
  s.async_failed = c.async_failed;
  s.bytes_read = c.bytes_read;
  s.read_ns = c.read_ns;
  for (size_t i = 0; i < s.codec.size(); ++i) {
    s.codec[i] = {c.codec_layers[i], c.codec_bytes[i], c.codec_ns[i]};
  }
  {
    std::lock_guard<std::mutex> guard(error_mu_);
    s.last_async_error = last_async_error_;
  }
  return s;
}

std::string FlashStore::open_report() const {
  std::string report;
  if (!read_only_reason_.empty())
    report += "the chunk store " + dir_ + " cannot be written (" + read_only_reason_ +
              "): opened read-only; its chunks are read, new ones are not stored\n";
  if (!rebuilt_index_reason_.empty())
    report += "the chunk store's index could not be used (" + rebuilt_index_reason_ +
              "): it was moved to index.sqlite.corrupt and a new, empty index made, so the "
              "chunks of " +
              dir_ + " are computed again as they are needed\n";
  if (counters_->quarantined > 0)
    report += std::to_string(counters_->quarantined.load()) + " chunk(s) of " + dir_ +
              " were moved to " + quarantine_dir_ +
              ": the index (index.sqlite and its -wal) does not list them, as when another "
              "store's index or -wal was copied in, so they are computed again as they are "
              "needed; to get them back, put the index they belong to back in place, move the "
              "files back into " +
              blob_dir_ + " and open the store again\n";
  return report;
}

void FlashStore::set_read_bytes_per_sec(uint64_t bytes_per_sec) {
  throttle_->set_rate(bytes_per_sec);
}

}  // namespace cb::cache
