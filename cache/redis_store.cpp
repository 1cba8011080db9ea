#include "cache/redis_store.h"

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <string_view>

#include "cache/codec.h"
#include "cache/throttle.h"
#include "cache/write_back_queue.h"
#include "platform/cancel.h"
#include "platform/error.h"

namespace cb::cache {
namespace {

constexpr char kMagic[8] = {'C', 'B', 'K', 'V', 'R', 'E', 'D', 'S'};
constexpr uint32_t kVersion = 1;
constexpr size_t kFixedHeaderBytes = 64;
constexpr size_t kSegmentEntryBytes = 24;
constexpr size_t kChecksumOffset = 56;
// lookup() reads this much with its first GETRANGE: the whole header of a
// chunk of up to (4096 - 64) / 24 = 168 layers.
constexpr size_t kHeaderPrefetch = 4096;
// More layers than any model has; a header claiming more is corrupt.
constexpr int32_t kMaxLayers = 4096;
// A reply may exceed the bytes a command asks for by its framing
// ("$<length>\r\n...\r\n"); a short reply (status, integer, error) fits
// in kSmallReply.  A server that sends more is dropped mid-reply.
constexpr size_t kReplyFraming = 32;
constexpr size_t kSmallReply = 4096;
// How often a wait on the server asks the thread's cancellation check.
constexpr int kCancelPollMs = 20;

struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyFree>;

timeval to_timeval(int ms) {
  return {static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
}

// hiredis writes with write(2): a server that closed the connection would
// raise SIGPIPE and kill the process.  The signal is blocked in this thread
// around each command, and one raised meanwhile is consumed; the write then
// fails with EPIPE, which is an ordinary I/O error.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  }
  ~SigpipeBlock() {
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec none{0, 0};
        sigtimedwait(&pipe_, nullptr, &none);
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
};

template <class T>
void put_le(std::vector<uint8_t>& out, size_t at, T v) {
  std::memcpy(out.data() + at, &v, sizeof v);
}

template <class T>
T get_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

uint64_t header_checksum(const uint8_t* header, size_t n) {
  std::vector<uint8_t> copy(header, header + n);
  std::memset(copy.data() + kChecksumOffset, 0, 8);
  return segment_checksum(copy.data(), copy.size());
}

// The value stored for a chunk: header + segment table + the flash blob.
std::vector<uint8_t> encode_value(Codec codec, const ChunkKVView& kv, uint64_t key_hash,
                                  int zstd_level) {
  EncodedBlob blob = encode_blob(codec, kv, key_hash, zstd_level);
  const size_t header_bytes = kFixedHeaderBytes + kSegmentEntryBytes * blob.segments.size();
  std::vector<uint8_t> out(header_bytes, 0);
  std::memcpy(out.data(), kMagic, 8);
  put_le<uint32_t>(out, 8, kVersion);
  put_le<uint32_t>(out, 12, static_cast<uint32_t>(header_bytes));
  out[16] = static_cast<uint8_t>(codec);
  put_le<int32_t>(out, 20, kv.shape.n_layers);
  put_le<int32_t>(out, 24, kv.shape.n_tokens);
  put_le<int32_t>(out, 28, kv.shape.n_head_kv);
  put_le<int32_t>(out, 32, kv.shape.head_dim);
  put_le<uint64_t>(out, 40, key_hash);
  for (size_t l = 0; l < blob.segments.size(); ++l) {
    const size_t at = kFixedHeaderBytes + kSegmentEntryBytes * l;
    put_le<uint64_t>(out, at, header_bytes + blob.segments[l].offset);
    put_le<uint32_t>(out, at + 8, blob.segments[l].size);
    put_le<uint64_t>(out, at + 16, blob.segments[l].checksum);
  }
  put_le<uint64_t>(out, kChecksumOffset, header_checksum(out.data(), out.size()));
  out.insert(out.end(), blob.bytes.begin(), blob.bytes.end());
  return out;
}

// Bytes of the header that starts with `prefix` (at least 16 bytes), or 0
// when it is not a header of this format.
size_t header_size(const uint8_t* prefix, size_t n) {
  if (n < 16 || std::memcmp(prefix, kMagic, 8) != 0 || get_le<uint32_t>(prefix + 8) != kVersion)
    return 0;
  const uint32_t bytes = get_le<uint32_t>(prefix + 12);
  if (bytes < kFixedHeaderBytes + kSegmentEntryBytes ||
      bytes > kFixedHeaderBytes + kSegmentEntryBytes * kMaxLayers ||
      (bytes - kFixedHeaderBytes) % kSegmentEntryBytes != 0)
    return 0;
  return bytes;
}

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

struct RedisStore::Counters {
  std::atomic<uint64_t> hits{0}, misses{0}, puts{0}, put_failures{0}, corrupt{0}, errors{0},
      connects{0}, async_queued{0}, async_dropped{0}, bytes_read{0}, read_ns{0};
  struct Codec {
    std::atomic<uint64_t> layers{0}, output_bytes{0}, decode_ns{0};
  };
  std::array<Codec, 4> codec;
};

// The one place that talks to hiredis: a synchronous connection, made on
// demand, dropped on any I/O error or timeout (its state is then unknown),
// and made again by a later command.
class RedisStore::Connection {
 public:
  Connection(const RedisOptions& options, RedisStore& owner) : options_(options), owner_(owner) {}
  ~Connection() {
    if (ctx_) redisFree(ctx_);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Sends one command and returns its reply (an error reply included), or
  // null when there is no connection or it failed; failures are noted in
  // the owner's stats.  `max_reply`: the most payload bytes the command
  // asks for; a longer reply is a failure, never buffered whole.
  ReplyPtr command(std::initializer_list<std::string_view> args, size_t max_reply = kSmallReply) {
    std::lock_guard lock(mu_);
    SigpipeBlock no_sigpipe;
    if (!ctx_ && !connect()) {
      up_.store(false, std::memory_order_relaxed);
      return nullptr;
    }
    ReplyPtr reply = run(args, max_reply);
    if (!reply) {
      const std::string why =
          "redis " + std::string(*args.begin()) + " on " + address() + " failed: " + io_error_;
      owner_.note_error(why);
      drop();
      if (timed_out_) {
        // A server too slow to answer in time is not asked again for the
        // reconnect interval: a request with many chunks waits one timeout,
        // not one per chunk.
        connect_error_ = why;
        retry_at_ = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(options_.reconnect_interval_ms);
      }
    }
    up_.store(reply != nullptr, std::memory_order_relaxed);
    return reply;
  }

  // Whether the last command found the server answering.
  bool up() const { return up_.load(std::memory_order_relaxed); }

 private:
  std::string address() const { return options_.host + ":" + std::to_string(options_.port); }

  // One command, start to reply, within command_timeout_ms in all (not per
  // read: a server that sends a byte at a time cannot stretch it), ended
  // early by the thread's cancellation check, and reading no more than
  // max_reply plus framing.  Null on failure, with io_error_ saying why.
  ReplyPtr run(std::initializer_list<std::string_view> args, size_t max_reply) {
    std::vector<const char*> argv;
    std::vector<size_t> argvlen;
    for (std::string_view a : args) {
      argv.push_back(a.data());
      argvlen.push_back(a.size());
    }
    io_error_ = "no reply";
    timed_out_ = false;
    if (redisAppendCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), argvlen.data()) !=
        REDIS_OK)
      return failed_io();
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.command_timeout_ms);
    for (int done = 0; !done;) {
      if (!wait_for(POLLOUT, deadline)) return nullptr;
      if (redisBufferWrite(ctx_, &done) != REDIS_OK) return failed_io();
    }
    const size_t limit = max_reply + kReplyFraming;
    for (;;) {
      void* reply = nullptr;
      if (redisGetReplyFromReader(ctx_, &reply) != REDIS_OK) return failed_io();
      if (reply) {
        ReplyPtr r(static_cast<redisReply*>(reply));
        if (r->type == REDIS_REPLY_STRING && r->len > max_reply) return too_long(limit);
        return r;
      }
      if (ctx_->reader->len - ctx_->reader->pos > limit) return too_long(limit);
      if (!wait_for(POLLIN, deadline)) return nullptr;
      if (redisBufferRead(ctx_) != REDIS_OK) return failed_io();
    }
  }

  ReplyPtr failed_io() {
    io_error_ = ctx_->errstr[0] ? ctx_->errstr : "no reply";
    return nullptr;
  }

  ReplyPtr too_long(size_t limit) {
    io_error_ = "the reply is longer than the " + std::to_string(limit) + " bytes asked for";
    return nullptr;
  }

  // Waits until the socket is ready for `events`; false (io_error_ set) at
  // the deadline or when the thread's work is cancelled.
  bool wait_for(short events, std::chrono::steady_clock::time_point deadline) {
    for (;;) {
      if (cancel_requested()) {
        io_error_ = "cancelled";
        return false;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) {
        io_error_ =
            "no complete reply within " + std::to_string(options_.command_timeout_ms) + " ms";
        timed_out_ = true;
        return false;
      }
      pollfd p{ctx_->fd, events, 0};
      const int n = poll(&p, 1, static_cast<int>(std::min<long long>(left, kCancelPollMs)));
      if (n > 0) return true;
      if (n < 0 && errno != EINTR) {
        io_error_ = std::string("poll: ") + std::strerror(errno);
        return false;
      }
    }
  }

  void drop() {
    redisFree(ctx_);
    ctx_ = nullptr;
  }

  // A command whose reply must be +OK; false (connection dropped, error
  // noted) otherwise.
  bool setup_command(std::initializer_list<std::string_view> args, const char* what) {
    ReplyPtr r = run(args, kSmallReply);
    if (r && r->type != REDIS_REPLY_ERROR) return true;
    connect_error_ = "redis " + std::string(what) + " on " + address() +
                     " failed: " + (r ? std::string(r->str, r->len) : io_error_);
    owner_.note_error(connect_error_);
    drop();
    retry_at_ = std::chrono::steady_clock::now() +
                std::chrono::milliseconds(options_.reconnect_interval_ms);
    return false;
  }

  bool connect() {
    const auto now = std::chrono::steady_clock::now();
    if (now < retry_at_) {
      owner_.note_error(
          connect_error_ + " (next try in " +
          std::to_string(
              std::chrono::duration_cast<std::chrono::milliseconds>(retry_at_ - now).count()) +
          " ms)");
      return false;
    }
    ctx_ = redisConnectWithTimeout(options_.host.c_str(), options_.port,
                                   to_timeval(options_.connect_timeout_ms));
    if (!ctx_ || ctx_->err) {
      connect_error_ = "cannot connect to redis at " + address() + ": " +
                       (ctx_ ? ctx_->errstr : "out of memory");
      owner_.note_error(connect_error_);
      if (ctx_) drop();
      retry_at_ = now + std::chrono::milliseconds(options_.reconnect_interval_ms);
      return false;
    }
    // Every read and write goes through run(), which polls first: the socket
    // never blocks, so no single write or read can outlast the deadline.
    const int fl = fcntl(ctx_->fd, F_GETFL);
    if (fl < 0 || fcntl(ctx_->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
      owner_.note_error(std::string("cannot make the redis socket non-blocking: ") +
                        std::strerror(errno));
      drop();
      return false;
    }
    ctx_->flags &= ~REDIS_BLOCK;
    redisEnableKeepAlive(ctx_);
    if (!options_.password.empty()) {
      const bool ok = options_.username.empty()
                          ? setup_command({"AUTH", options_.password}, "AUTH")
                          : setup_command({"AUTH", options_.username, options_.password}, "AUTH");
      if (!ok) return false;
    }
    if (options_.db != 0 && !setup_command({"SELECT", std::to_string(options_.db)}, "SELECT"))
      return false;
    owner_.counters_->connects.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  const RedisOptions& options_;
  RedisStore& owner_;
  std::mutex mu_;
  std::atomic<bool> up_{false};
  redisContext* ctx_ = nullptr;
  std::chrono::steady_clock::time_point retry_at_{};
  std::string connect_error_;  // why the last connect failed
  std::string io_error_;       // why the last run() failed
  bool timed_out_ = false;     // the last run() failed at its deadline
};

uint64_t RedisChunkHandle::layer_bytes(int layer) const {
  return layer >= 0 && layer < static_cast<int>(segments_.size()) ? segments_[layer].size : 0;
}

uint64_t RedisChunkHandle::total_bytes() const {
  uint64_t n = 0;
  for (const SegmentRef& s : segments_) n += s.size;
  return n;
}

std::unique_ptr<RedisStore> RedisStore::open(const RedisOptions& options) {
  if (options.host.empty()) fail(ErrorCode::kInvalidArgument, "redis store: no host");
  if (options.port <= 0 || options.port > 65535)
    fail(ErrorCode::kInvalidArgument,
         "redis store: port " + std::to_string(options.port) + " out of range");
  if (options.connect_timeout_ms <= 0 || options.command_timeout_ms <= 0 ||
      options.reconnect_interval_ms < 0)
    fail(ErrorCode::kInvalidArgument,
         "redis store: connect and command timeouts must be positive, the reconnect interval "
         "not negative");
  if (options.db < 0) fail(ErrorCode::kInvalidArgument, "redis store: negative database number");
  if (!options.username.empty() && options.password.empty())
    fail(ErrorCode::kInvalidArgument, "redis store: a username needs a password");
  if (options.write_back_depth == 0)
    fail(ErrorCode::kInvalidArgument, "redis store: write_back_depth must be positive");
  std::unique_ptr<RedisStore> store(new RedisStore(options));
  store->ping();  // connects now when it can; a failure is only noted
  return store;
}

RedisStore::RedisStore(const RedisOptions& options)
    : options_(options),
      throttle_(std::make_unique<Throttle>(options.read_bytes_per_sec)),
      reader_(std::make_unique<Connection>(options_, *this)),
      writer_(std::make_unique<Connection>(options_, *this)),
      counters_(std::make_unique<Counters>()),
      queue_(std::make_unique<WriteBackQueue>(options.write_back_depth)) {}

RedisStore::~RedisStore() {
  queue_.reset();  // runs the queued puts while the connections exist
}

void RedisStore::note_error(const std::string& message) {
  counters_->errors.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(error_mu_);
  last_error_ = message;
}

Codec RedisStore::resolve(const ChunkKey& key) const {
  return key.codec.value_or(options_.codec);
}

std::string RedisStore::value_name(const ChunkKey& key) const {
  ChunkKey resolved = key;
  resolved.codec = resolve(key);
  return options_.key_prefix + serialize_key(resolved);
}

bool RedisStore::reachable() const {
  return reader_->up();
}

bool RedisStore::ping() {
  ReplyPtr r = reader_->command({"PING"});
  return r && r->type == REDIS_REPLY_STATUS;
}

std::optional<RedisChunkHandle> RedisStore::lookup(const ChunkKey& key) {
  const Codec codec = resolve(key);
  RedisChunkHandle h;
  h.name_ = value_name(key);
  h.codec_ = codec;
  const auto miss = [&] {
    counters_->misses.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  };
  const auto corrupt = [&](const char* why) {
    counters_->corrupt.fetch_add(1, std::memory_order_relaxed);
    note_error("redis value of a chunk is corrupt (" + std::string(why) + ")");
    return miss();
  };
  ReplyPtr r = reader_->command({"GETRANGE", h.name_, "0", std::to_string(kHeaderPrefetch - 1)},
                                kHeaderPrefetch);
  if (!r) return miss();
  if (r->type == REDIS_REPLY_ERROR) {
    note_error("redis GETRANGE failed: " + std::string(r->str, r->len));
    return miss();
  }
  if (r->type != REDIS_REPLY_STRING || r->len == 0) return miss();  // absent (evicted, expired)
  std::vector<uint8_t> header(r->str, r->str + r->len);
  const size_t n = header_size(header.data(), header.size());
  if (n == 0) return corrupt("not a chunk header");
  if (header.size() < n) {
    ReplyPtr rest = reader_->command(
        {"GETRANGE", h.name_, std::to_string(header.size()), std::to_string(n - 1)},
        n - header.size());
    if (!rest || rest->type != REDIS_REPLY_STRING) return miss();
    header.insert(header.end(), rest->str, rest->str + rest->len);
  }
  if (header.size() < n) return corrupt("truncated header");
  header.resize(n);
  if (get_le<uint64_t>(header.data() + kChecksumOffset) != header_checksum(header.data(), n))
    return corrupt("header checksum");
  h.shape_ = {get_le<int32_t>(&header[20]), get_le<int32_t>(&header[24]),
              get_le<int32_t>(&header[28]), get_le<int32_t>(&header[32])};
  if (header[16] != static_cast<uint8_t>(codec) || !shape_matches_key(h.shape_, key) ||
      static_cast<size_t>(h.shape_.n_layers) != (n - kFixedHeaderBytes) / kSegmentEntryBytes ||
      get_le<uint64_t>(&header[40]) != hash_key(key, codec))
    return corrupt("header does not match the key");
  for (int l = 0; l < h.shape_.n_layers; ++l) {
    const uint8_t* e = &header[kFixedHeaderBytes + kSegmentEntryBytes * l];
    h.segments_.push_back({get_le<uint64_t>(e), get_le<uint32_t>(e + 8), get_le<uint64_t>(e + 16)});
  }
  counters_->hits.fetch_add(1, std::memory_order_relaxed);
  return h;
}

bool RedisStore::fetch_layer(const RedisChunkHandle& handle, int layer, float* k_out,
                             float* v_out) {
  if (layer < 0 || layer >= handle.n_layers())
    fail(ErrorCode::kInvalidArgument, "redis store: layer " + std::to_string(layer) +
                                          " out of range for a chunk of " +
                                          std::to_string(handle.n_layers()) + " layers");
  if (!k_out || !v_out) fail(ErrorCode::kInvalidArgument, "redis store: null layer output");
  const SegmentRef& seg = handle.segments_[layer];
  if (seg.size == 0) return false;
  const uint64_t t0 = now_ns();
  throttle_->acquire(seg.size);
  ReplyPtr r = reader_->command({"GETRANGE", handle.name_, std::to_string(seg.offset),
                                 std::to_string(seg.offset + seg.size - 1)},
                                seg.size);
  counters_->read_ns.fetch_add(now_ns() - t0, std::memory_order_relaxed);
  if (!r || r->type != REDIS_REPLY_STRING) return false;
  counters_->bytes_read.fetch_add(r->len, std::memory_order_relaxed);
  const auto* bytes = reinterpret_cast<const uint8_t*>(r->str);
  if (r->len != seg.size || segment_checksum(bytes, r->len) != seg.checksum) {
    counters_->corrupt.fetch_add(1, std::memory_order_relaxed);
    note_error(r->len == 0 ? "redis value of a chunk vanished (evicted or expired)"
                           : "redis segment of a chunk failed its checksum");
    return false;
  }
  const uint64_t d0 = now_ns();
  try {
    decode_layer(handle.codec_, handle.shape_, bytes, r->len, k_out, v_out);
  } catch (const Error& e) {
    counters_->corrupt.fetch_add(1, std::memory_order_relaxed);
    note_error(std::string("redis segment of a chunk does not decode: ") + e.what());
    return false;
  }
  auto& c = counters_->codec[static_cast<int>(handle.codec_)];
  c.layers.fetch_add(1, std::memory_order_relaxed);
  c.output_bytes.fetch_add(static_cast<uint64_t>(2 * 2 * handle.shape_.layer_floats()),
                           std::memory_order_relaxed);
  c.decode_ns.fetch_add(now_ns() - d0, std::memory_order_relaxed);
  return true;
}

bool RedisStore::put(const ChunkKey& key, const ChunkKVView& kv) {
  if (!shape_matches_key(kv.shape, key))
    fail(ErrorCode::kInvalidArgument,
         "redis store: the chunk's KV does not match its key's tokens");
  const Codec codec = resolve(key);
  const std::vector<uint8_t> value =
      encode_value(codec, kv, hash_key(key, codec), options_.zstd_level);
  const std::string_view bytes(reinterpret_cast<const char*>(value.data()), value.size());
  const std::string name = value_name(key);
  ReplyPtr r =
      options_.ttl_seconds > 0
          ? writer_->command({"SET", name, bytes, "EX", std::to_string(options_.ttl_seconds)})
          : writer_->command({"SET", name, bytes});
  if (!r || r->type == REDIS_REPLY_ERROR) {
    if (r) note_error("redis SET refused: " + std::string(r->str, r->len));
    counters_->put_failures.fetch_add(1, std::memory_order_relaxed);
    writes_refused_until_ns_.store(
        now_ns() + static_cast<uint64_t>(options_.reconnect_interval_ms) * 1000000u,
        std::memory_order_relaxed);
    return false;
  }
  counters_->puts.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool RedisStore::writes_refused() const {
  return now_ns() < writes_refused_until_ns_.load(std::memory_order_relaxed);
}

bool RedisStore::put_async(ChunkKey key, ChunkKV kv) {
  const bool queued = queue_->push([this, key = std::move(key), kv = std::move(kv)] {
    try {
      put(key, kv.view());
    } catch (const std::exception& e) {
      counters_->put_failures.fetch_add(1, std::memory_order_relaxed);
      note_error(std::string("redis put failed: ") + e.what());
    }
  });
  (queued ? counters_->async_queued : counters_->async_dropped)
      .fetch_add(1, std::memory_order_relaxed);
  return queued;
}

void RedisStore::flush() {
  queue_->flush();
}

bool RedisStore::remove(const ChunkKey& key) {
  ReplyPtr r = writer_->command({"DEL", value_name(key)});
  if (r && r->type == REDIS_REPLY_ERROR)
    note_error("redis DEL failed: " + std::string(r->str, r->len));
  return r && r->type == REDIS_REPLY_INTEGER && r->integer > 0;
}

RedisStoreStats RedisStore::stats() const {
  RedisStoreStats st;
  const Counters& c = *counters_;
  st.hits = c.hits.load();
  st.misses = c.misses.load();
  st.puts = c.puts.load();
  st.put_failures = c.put_failures.load();
  st.corrupt = c.corrupt.load();
  st.errors = c.errors.load();
  st.connects = c.connects.load();
  st.async_queued = c.async_queued.load();
  st.async_dropped = c.async_dropped.load();
  st.bytes_read = c.bytes_read.load();
  st.read_ns = c.read_ns.load();
  for (size_t i = 0; i < st.codec.size(); ++i) {
    st.codec[i].layers = c.codec[i].layers.load();
    st.codec[i].output_bytes = c.codec[i].output_bytes.load();
    st.codec[i].decode_ns = c.codec[i].decode_ns.load();
  }
  std::lock_guard lock(error_mu_);
  st.last_error = last_error_;
  return st;
}

}  // namespace cb::cache
