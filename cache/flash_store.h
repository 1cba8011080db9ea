// The persistent chunk-KV store: precomputed KV of text chunks on flash, found
// by ChunkKey, read back one layer at a time.
//
//   DIR/index.sqlite   entries and per-layer segments (WAL, busy timeout)
//   DIR/store.lock     flock: writers shared, open-time repair exclusive
//   DIR/blobs/*.kv     one file per entry, layer-major segments (blob_format.h)
//
// Typical use by the fusor:
//   if (auto h = store.lookup(key))          // one index query, opens the blob
//     for each layer l:
//       if (!store.fetch_layer(*h, l, k, v)) // one pread + checksum + decode
//         recompute the chunk (the store already dropped the bad entry)
//   else compute the chunk, then store.put_async(key, std::move(kv));
//
// Integrity: every segment is checked against its checksum before decoding;
// a corrupt, truncated or missing blob is a miss that removes the entry, never
// a crash or wrong data.  Crash safety: a blob is written to a temp file,
// fsynced, renamed and its directory fsynced before its index row commits;
// open() removes blobs without rows and rows without blobs.
//
// Thread safety: every member function may be called from any thread at any
// time, including fetch_layer on one handle from several threads.  Index
// access is serialized by a mutex; reads (pread + decode) and the encoding
// and writing of puts run in parallel.  Several processes (or several
// FlashStore objects) may share one directory: SQLite locking with the busy
// timeout orders index writes, and the lock file keeps open()'s orphan
// cleanup away from other writers' in-flight blobs.  Counters in stats() other
// than entries/bytes are per FlashStore object.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cache/chunk_kv.h"
#include "cache/codec.h"

namespace cb::cache {

class Index;
class Throttle;
class WriteBackQueue;
struct OpenBlob;

struct StoreOptions {
  uint64_t capacity_bytes = uint64_t{4} << 30;  // blob bytes; LRU eviction beyond
  Codec codec = Codec::kQ8;                     // for keys that leave codec unset
  uint64_t read_bytes_per_sec = 0;              // fetch_layer read cap; 0 = none
  int busy_timeout_ms = 5000;                   // SQLite and lock-file waits
  size_t write_back_depth = 16;                 // put_async jobs that may wait
  int zstd_level = 1;                           // chosen by measurement (docs/CACHE_STORE.md)
  // A corrupt index.sqlite is moved aside (index.sqlite.corrupt) and a fresh,
  // empty store is created: it is a cache.  false: open() throws kFormat.
  bool rebuild_corrupt_index = true;
};

// A found entry.  Holds the blob open, so a handle stays readable even if
// the entry is evicted meanwhile; it never sees another entry's data.
class ChunkHandle {
 public:
  int64_t entry_id() const { return entry_id_; }
  const KvShape& shape() const { return shape_; }
  int n_layers() const { return shape_.n_layers; }
  int n_tokens() const { return shape_.n_tokens; }
  int64_t kv_dim() const { return shape_.kv_dim(); }
  Codec codec() const { return codec_; }
  // Bytes fetch_layer(l) reads, from the index (no I/O); the loading
  // controller's T_load input.
  uint64_t layer_bytes(int layer) const;
  uint64_t total_bytes() const;  // sum over layers

 private:
  friend class FlashStore;
  int64_t entry_id_ = 0;
  KvShape shape_;
  Codec codec_ = Codec::kF16;
  std::shared_ptr<const OpenBlob> blob_;
};

enum class PutResult {
  kStored,
  kAlreadyPresent,  // the same key was stored before (perhaps by another process)
  kNoRoom,          // larger than capacity, or everything else is pinned
};

struct StoreStats {
  uint64_t entries = 0;  // in the index (all processes)
  uint64_t bytes = 0;    // blob bytes in the index (all processes)
  uint64_t capacity_bytes = 0;
  uint64_t hits = 0;  // lookups that returned a handle
  uint64_t misses = 0;
  uint64_t puts = 0;  // entries stored by this object
  uint64_t put_duplicates = 0;
  uint64_t put_no_room = 0;
  uint64_t evictions = 0;      // entries evicted by this object's puts
  uint64_t corrupt_drops = 0;  // entries dropped for a bad or missing blob
  // Orphaned blobs moved to DIR/quarantine/ at open (see FlashStore::open).
  uint64_t quarantined = 0;
  bool read_only = false;  // opened read-only: the store could not be written
  uint64_t async_queued = 0;
  uint64_t async_dropped = 0;  // put_async refused: queue full
  uint64_t async_failed = 0;   // put_async jobs that failed (see last_async_error)
  std::string last_async_error;
  uint64_t bytes_read = 0;               // by fetch_layer
  uint64_t read_ns = 0;                  // pread time, throttle waits included
  std::array<CodecCounters, 4> codec{};  // indexed by static_cast<int>(Codec)
  ReadCounters read_counters() const { return {bytes_read, read_ns, codec}; }
};

class FlashStore {
 public:
  // Creates dir if needed, opens the index, removes orphans both ways (blobs
  // without rows, rows without a complete blob, temp files of dead writers)
  // and trims to capacity.  When orphaned blobs outnumber the index's live
  // entries (and are more than a few), the index is not this folder's: they
  // are moved to DIR/quarantine/<time>-<pid>/ instead of deleted.
  //
  // When the store cannot be written (a full disk, a read-only file system,
  // no permission) but its index exists, it is opened read-only: no repair,
  // lookups and reads work, put() throws kIo, and open_report() says why.
  // Otherwise throws cb::Error(kIo) naming the path and reason (a path that
  // is a file, no permission, read-only file system...), or kFormat for an
  // index it cannot use and may not rebuild.
  static std::unique_ptr<FlashStore> open(const std::string& dir, const StoreOptions& options = {});
  // Flushes the write-back queue.
  ~FlashStore();
  FlashStore(const FlashStore&) = delete;
  FlashStore& operator=(const FlashStore&) = delete;

  // A hit marks the entry most recently used and opens its blob.  A missing
  // or truncated blob is a miss (entry dropped).  Throws kIo only if the
  // index itself cannot be read (locked past the busy timeout, disk error).
  std::optional<ChunkHandle> lookup(const ChunkKey& key);
  // Reads, verifies and decodes one layer into k_out and v_out (each
  // n_tokens x kv_dim floats).  false: the segment was unreadable or corrupt;
  // the entry has been dropped and the outputs hold no meaningful data.
  // Throws kInvalidArgument only for caller bugs: a layer out of range, an
  // empty handle, null outputs.
  bool fetch_layer(const ChunkHandle& handle, int layer, float* k_out, float* v_out);

  // Stores synchronously (encode, write, fsync, index).  Throws
  // cb::Error(kInvalidArgument) for a bad shape or values the codec cannot
  // hold (NaN, inf, beyond f16 range), kIo if the write fails (disk full...);
  // the store stays usable either way.
  PutResult put(const ChunkKey& key, const ChunkKVView& kv);
  // Queues the put for the write-back worker and returns at once.  false: the
  // queue was full and the chunk was not queued.  Failures are counted in
  // stats(), never thrown.
  bool put_async(ChunkKey key, ChunkKV kv);
  // Waits until every put_async queued before the call has finished.
  void flush();

  // Pinned entries are never evicted for capacity.  false: no such entry.
  bool pin(const ChunkKey& key);
  bool unpin(const ChunkKey& key);
  // Removes the entry, pinned or not, at the caller's request (not counted
  // in `evictions`, which are for capacity).  false: no such entry.
  bool remove(const ChunkKey& key);
  void clear();  // every entry, pinned or not, every namespace

  StoreStats stats() const;
  // What open() did that a user should hear about, one line each ('\n'
  // after each): the store was opened read-only (and why), a damaged index
  // was rebuilt (and why), chunks were quarantined (how many, where, how to
  // get them back).  Empty: nothing.
  std::string open_report() const;
  // The codec a key with no codec set resolves to.
  Codec default_codec() const { return options_.codec; }
  // Changes the fetch_layer read cap at run time (0 = none).
  void set_read_bytes_per_sec(uint64_t bytes_per_sec);
  const std::string& dir() const { return dir_; }

 private:
  FlashStore(const std::string& dir, const StoreOptions& options);
  void reconcile();
  Codec resolve(const ChunkKey& key) const;
  std::string blob_path(const std::string& name) const;
  void drop_entry(int64_t id, const std::string& blob);
  void unlink_blobs(const std::vector<std::string>& names);
  // Moves blobs to DIR/quarantine/<time>-<pid>/.
  void quarantine(const std::vector<std::string>& names);
  void open_index();

  std::string dir_;
  std::string blob_dir_;
  std::string lock_path_;
  StoreOptions options_;
  std::string read_only_reason_;      // why the store could not be written; "": writable
  std::string quarantine_dir_;        // where open() moved orphaned blobs, if it did
  std::string rebuilt_index_reason_;  // why open() rebuilt the index; "": it did not
  mutable std::mutex index_mu_;       // guards index_
  std::unique_ptr<Index> index_;
  std::unique_ptr<Throttle> throttle_;

  struct Counters;
  std::unique_ptr<Counters> counters_;
  mutable std::mutex error_mu_;
  std::string last_async_error_;

  std::unique_ptr<WriteBackQueue> queue_;  // last: its worker uses everything above
};

}  // namespace cb::cache
