// The remote tier: chunk KV kept in a Redis (or Valkey) server, shared by
// every process and device that reaches it, read back one layer at a time.
//
// Key layout: one string value per chunk, named
//
//   <key_prefix> + serialize_key(key with its codec resolved)
//
// i.e. the prefix, then every field of the ChunkKey (model fingerprint,
// chunk head, namespace, codec, token ids), so two chunks never share a
// value and a namespace never sees another's entries.  The value is a
// header with the chunk's shape, codec and segment table, then the same
// blob a FlashStore writes (blob_format.h: per-layer codec segments):
//
//   0  "CBKVREDS"        8 bytes
//   8  u32 version (1)
//  12  u32 header bytes (64 + 24 x n_layers)
//  16  u8 codec, 3 bytes zero
//  20  i32 n_layers, i32 n_tokens, i32 n_head_kv, i32 head_dim
//  36  u32 zero
//  40  u64 key hash (hash_key)
//  48  u64 zero
//  56  u64 XXH3-64 of the header with these 8 bytes zero
//  64  per layer: u64 offset (from the value's start), u32 size, u32 zero,
//      u64 XXH3-64 of the segment
//
// lookup() reads the header with one GETRANGE; fetch_layer() reads exactly
// one segment with one GETRANGE and checks its checksum before decoding.
// One value per chunk (rather than one per layer) keeps a chunk whole: the
// server evicts, expires or overwrites it as a unit, and a put is a single
// SET.
//
// Failure behaviour: the store is a cache, and the server may be down, slow,
// out of memory, or have evicted anything.  A connection that cannot be
// made, a command that times out or fails (wrong password, OOM under
// `maxmemory`), a missing value or one failing any check is a miss (lookup:
// nullopt; fetch_layer: false) or a failed put, counted in stats() with the
// last error's message; never an exception, a crash or wrong data.  A
// header must also match its key (shape_matches_key).  Each command, from
// sending it to its whole reply, ends within command_timeout_ms in all (a
// server sending a byte at a time cannot stretch it), sooner when the
// thread's cancellation check (platform/cancel.h) says stop, and reads no
// more than the bytes it asked for plus framing.  A broken connection is
// dropped and made again by a later call (after a failed connect or a
// command that timed out, calls miss at once for reconnect_interval_ms).
// Writes to a closed socket raise no SIGPIPE in the process.
//
// Expiry and eviction are the server's (its maxmemory-policy; an optional
// TTL per value).  hiredis 0.14 has no TLS: use a trusted network (or a
// local tunnel).
//
// Thread safety: every member function may be called from any thread.
// Reads (lookup, fetch_layer) share one connection and writes (put, remove)
// another, each serialized by its own mutex, so a large put never
// delays a lookup.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cache/blob_format.h"
#include "cache/chunk_kv.h"
#include "cache/codec.h"

namespace cb::cache {

class Throttle;
class WriteBackQueue;

struct RedisOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string username;  // ACL user (AUTH username password); "": the default user
  std::string password;  // "": no AUTH
  int db = 0;            // SELECTed after connecting when not 0
  std::string key_prefix = "cb:";
  int connect_timeout_ms = 500;
  int command_timeout_ms = 1000;     // per command, from sending it to its whole reply
  int reconnect_interval_ms = 1000;  // after a failed connect
  uint64_t ttl_seconds = 0;          // per value; 0: none (the server's eviction policy)
  uint64_t read_bytes_per_sec = 0;   // fetch_layer read cap (a slow link); 0 = none
  Codec codec = Codec::kQ8;          // for keys that leave codec unset
  int zstd_level = 1;                // as StoreOptions::zstd_level
  size_t write_back_depth = 16;      // put_async jobs that may wait
};

// Parses "host:port", "redis://[[user]:password@]host[:port][/db]" or a bare
// host into `options` (fields not in the text keep their values).  Throws
// cb::Error(kInvalidArgument) naming what is wrong and the address as
// redacted_redis_address() shows it.
void parse_redis_address(const std::string& text, RedisOptions& options);
// The address without credentials: whatever precedes its last '@' (user
// and password), or a non-numeric port (a password typed without the '@'),
// replaced by "***".  How any message shows an address.
std::string redacted_redis_address(const std::string& text);

// A found chunk: its value's name and segment table.  Reads through it see
// the value as it is then: if it was evicted or replaced meanwhile, a read
// fails its checks and is a miss, never another chunk's data.
class RedisChunkHandle {
 public:
  const KvShape& shape() const { return shape_; }
  int n_layers() const { return shape_.n_layers; }
  Codec codec() const { return codec_; }
  uint64_t layer_bytes(int layer) const;
  uint64_t total_bytes() const;

 private:
  friend class RedisStore;
  std::string name_;
  KvShape shape_;
  Codec codec_ = Codec::kF16;
  std::vector<SegmentRef> segments_;
};

struct RedisStoreStats {
  uint64_t hits = 0;
  uint64_t misses = 0;        // lookups without a usable value (absent, unreachable, corrupt)
  uint64_t puts = 0;          // values stored
  uint64_t put_failures = 0;  // puts the server refused or did not answer
  uint64_t corrupt = 0;       // headers or segments that failed a check
  uint64_t errors = 0;        // connects and commands that failed
  uint64_t connects = 0;      // connections made (the first and every reconnect)
  uint64_t async_queued = 0;
  uint64_t async_dropped = 0;            // put_async refused: queue full
  uint64_t bytes_read = 0;               // by fetch_layer
  uint64_t read_ns = 0;                  // fetch_layer round trips, read-cap waits included
  std::array<CodecCounters, 4> codec{};  // indexed by static_cast<int>(Codec)
  std::string last_error;                // "" until something fails
};

class RedisStore {
 public:
  // Checks the options (kInvalidArgument: no host, a port or timeout out of
  // range) and tries to connect; a server that cannot be reached is not an
  // error here (see last_error in stats(), or ping()).
  static std::unique_ptr<RedisStore> open(const RedisOptions& options);
  // Finishes queued put_async jobs.
  ~RedisStore();
  RedisStore(const RedisStore&) = delete;
  RedisStore& operator=(const RedisStore&) = delete;

  // True when the server answers PING (connecting if needed).
  bool ping();
  // Whether the last lookup, layer read or ping answered (sent nothing):
  // false while the server is down, unreachable or refuses this client.
  bool reachable() const;

  std::optional<RedisChunkHandle> lookup(const ChunkKey& key);
  // Reads, verifies and decodes one layer into k_out and v_out (each
  // n_tokens x kv_dim floats).  false: unreachable, evicted, replaced or
  // corrupt; the outputs then hold no meaningful data.  Throws
  // kInvalidArgument only for caller bugs (a layer out of range, null
  // outputs).
  bool fetch_layer(const RedisChunkHandle& handle, int layer, float* k_out, float* v_out);

  // Encodes and stores synchronously (SET, replacing any value of the key).
  // false: the server refused or did not answer (counted; see stats()).
  // Throws kInvalidArgument for a bad shape or values the codec cannot hold.
  bool put(const ChunkKey& key, const ChunkKVView& kv);
  // True within reconnect_interval_ms of a put the server refused or did
  // not answer (a full server, a read-only replica, an ACL without SET).
  bool writes_refused() const;
  // Queues the put for the write-back worker.  false: the queue was full.
  bool put_async(ChunkKey key, ChunkKV kv);
  // Waits until every put_async queued before the call has finished.
  void flush();
  // DEL of the key's value.  false: there was none, or the server failed.
  // There is no clear: the server's values are shared by every process and
  // device that reaches it (other namespaces and models included), and
  // leave by its eviction policy or a TTL.
  bool remove(const ChunkKey& key);

  RedisStoreStats stats() const;
  Codec default_codec() const { return options_.codec; }
  const RedisOptions& options() const { return options_; }
  // The name of the key's value on the server.
  std::string value_name(const ChunkKey& key) const;

 private:
  explicit RedisStore(const RedisOptions& options);
  class Connection;
  Codec resolve(const ChunkKey& key) const;
  void note_error(const std::string& message);

  RedisOptions options_;
  std::unique_ptr<Throttle> throttle_;
  std::unique_ptr<Connection> reader_;
  std::unique_ptr<Connection> writer_;

  struct Counters;
  std::unique_ptr<Counters> counters_;
  std::atomic<uint64_t> writes_refused_until_ns_{0};  // now_ns() clock
  mutable std::mutex error_mu_;
  std::string last_error_;

  std::unique_ptr<WriteBackQueue> queue_;  // last: its worker uses everything above
};

}  // namespace cb::cache
