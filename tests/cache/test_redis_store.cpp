// The remote tier against a real redis-server: bit-exact round trips, shared
// chunks, and every failure the brief of the store names (server killed,
// paused, wrong password, out of memory, corrupt values) being a miss or a
// failed put, never a crash, a hang or wrong data.
#include "cache/redis_store.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>

#include "cache/flash_store.h"
#include "cache_test_util.h"
#include "platform/cancel.h"
#include "platform/error.h"
#include "redis_test_util.h"

namespace cb::cache {
namespace {

using testing::FakeServer;
using testing::make_key;
using testing::make_kv;
using testing::make_tokens;
using testing::RedisServer;
using testing::small_shape;
using testing::TempDir;

RedisOptions options_for(const RedisServer& server) {
  RedisOptions o;
  o.port = server.port();
  o.connect_timeout_ms = 300;
  o.command_timeout_ms = 300;
  o.reconnect_interval_ms = 100;
  return o;
}

std::optional<ChunkKV> fetch_all(RedisStore& store, const RedisChunkHandle& h) {
  ChunkKV out(h.shape());
  for (int l = 0; l < h.n_layers(); ++l)
    if (!store.fetch_layer(h, l, out.k_layer(l), out.v_layer(l))) return std::nullopt;
  return out;
}

bool same_bits(const ChunkKV& a, const ChunkKV& b) {
  return a.shape == b.shape && a.k.size() == b.k.size() &&
         std::memcmp(a.k.data(), b.k.data(), a.k.size() * sizeof(float)) == 0 &&
         std::memcmp(a.v.data(), b.v.data(), a.v.size() * sizeof(float)) == 0;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A command on the test's own connection; the reply's string or error text.
std::string raw(redisContext* c, const char* fmt, const std::string& a, const std::string& b = "") {
  auto* r = static_cast<redisReply*>(redisCommand(c, fmt, a.data(), a.size(), b.data(), b.size()));
  std::string out = r && r->str ? std::string(r->str, r->len) : "";
  if (r) freeReplyObject(r);
  return out;
}

class RedisStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = server_.start();
    ASSERT_EQ(why, "");
  }
  RedisServer server_;
};

// Each codec decodes from Redis to exactly the floats it decodes to from
// flash: the same segments, the same decoder.
TEST_F(RedisStoreTest, RoundTripIsBitExactWithFlashPerCodec) {
  TempDir dir;
  auto flash = FlashStore::open(dir.path());
  auto redis = RedisStore::open(options_for(server_));
  for (Codec codec : {Codec::kF16, Codec::kQ8, Codec::kQ4}) {
    SCOPED_TRACE(codec_name(codec));
    const ChunkKey key = make_key(make_tokens(40, static_cast<int>(codec)), codec);
    const ChunkKV kv = make_kv(small_shape(), 7 + static_cast<int>(codec));
    ASSERT_TRUE(redis->put(key, kv.view()));
    ASSERT_EQ(flash->put(key, kv.view()), PutResult::kStored);
    auto rh = redis->lookup(key);
    auto fh = flash->lookup(key);
    ASSERT_TRUE(rh && fh);
    EXPECT_EQ(rh->shape(), kv.shape);
    EXPECT_EQ(rh->codec(), codec);
    EXPECT_EQ(rh->total_bytes(), fh->total_bytes());
    auto from_redis = fetch_all(*redis, *rh);
    auto from_flash = testing::fetch_all(*flash, *fh);
    ASSERT_TRUE(from_redis && from_flash);
    EXPECT_TRUE(same_bits(*from_redis, *from_flash));
    if (codec == Codec::kF16) {
      EXPECT_TRUE(testing::equals_f16_of(*from_redis, kv));
    }
  }
  const RedisStoreStats st = redis->stats();
  EXPECT_EQ(st.hits, 3u);
  EXPECT_EQ(st.puts, 3u);
  EXPECT_EQ(st.codec[static_cast<int>(Codec::kQ4)].layers, 4u);
  EXPECT_GT(st.bytes_read, 0u);
  EXPECT_EQ(st.errors, 0u) << st.last_error;
}

TEST_F(RedisStoreTest, TwoStoresShareChunksAndKeysStayApart) {
  auto a = RedisStore::open(options_for(server_));
  auto b = RedisStore::open(options_for(server_));
  const ChunkKey key = make_key(make_tokens(40, 1), Codec::kQ8, "app1");
  const ChunkKV kv = make_kv(small_shape(), 1);
  a->put_async(key, kv);
  a->flush();
  auto h = b->lookup(key);
  ASSERT_TRUE(h);
  auto got = fetch_all(*b, *h);
  ASSERT_TRUE(got);
  // Another namespace, another token, another codec: other values.
  ChunkKey other_ns = key;
  other_ns.ns = "app2";
  ChunkKey other_tokens = key;
  other_tokens.tokens.back() += 1;
  ChunkKey other_codec = key;
  other_codec.codec = Codec::kQ4;
  EXPECT_FALSE(b->lookup(other_ns));
  EXPECT_FALSE(b->lookup(other_tokens));
  EXPECT_FALSE(b->lookup(other_codec));
  EXPECT_EQ(b->value_name(key).rfind("cb:", 0), 0u);
  // A key without a codec is the store's default codec (q8): the same value.
  ChunkKey default_codec = key;
  default_codec.codec.reset();
  EXPECT_TRUE(b->lookup(default_codec));
  EXPECT_TRUE(b->remove(key));
  EXPECT_FALSE(a->lookup(key));
  EXPECT_FALSE(b->remove(key));
}

TEST_F(RedisStoreTest, TtlOptionSetsAnExpiry) {
  RedisOptions o = options_for(server_);
  o.ttl_seconds = 100;
  auto store = RedisStore::open(o);
  const ChunkKey key = make_key(make_tokens(40, 9));
  ASSERT_TRUE(store->put(key, make_kv(small_shape(), 9).view()));
  redisContext* c = server_.connect();
  const std::string name = store->value_name(key);
  auto* r = static_cast<redisReply*>(redisCommand(c, "TTL %b", name.data(), name.size()));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->type, REDIS_REPLY_INTEGER);
  EXPECT_GT(r->integer, 90);
  EXPECT_LE(r->integer, 100);
  freeReplyObject(r);
  redisFree(c);
}

// The server dies between a lookup and the layer reads: the reads fail,
// later lookups miss at once, and a server back on the port is used again.
TEST_F(RedisStoreTest, ServerKilledMidRequestIsAMissThenReconnects) {
  auto store = RedisStore::open(options_for(server_));
  const ChunkKey key = make_key(make_tokens(40, 2));
  const ChunkKV kv = make_kv(small_shape(), 2);
  ASSERT_TRUE(store->put(key, kv.view()));
  auto h = store->lookup(key);
  ASSERT_TRUE(h);
  const std::optional<ChunkKV> first = fetch_all(*store, *h);
  ASSERT_TRUE(first);
  server_.stop();
  const auto t0 = std::chrono::steady_clock::now();
  ChunkKV out(kv.shape);
  EXPECT_FALSE(store->fetch_layer(*h, 1, out.k_layer(1), out.v_layer(1)));
  EXPECT_FALSE(store->lookup(key));
  // A 2 MiB value written into the closed connection: the writes after the
  // peer's reset fail with EPIPE, which must not raise SIGPIPE (fatal here).
  const ChunkKV big = make_kv({4, 256, 8, 64}, 3);
  EXPECT_FALSE(store->put(make_key(make_tokens(256, 3), Codec::kF16), big.view()));
  EXPECT_FALSE(store->put(key, kv.view()));
  EXPECT_LT(seconds_since(t0), 1.0);
  RedisStoreStats st = store->stats();
  EXPECT_GE(st.errors, 2u);
  EXPECT_GE(st.put_failures, 1u);
  EXPECT_NE(st.last_error.find("redis"), std::string::npos) << st.last_error;

  ASSERT_EQ(server_.start(), "");  // same port; the data is gone (no persistence)
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // the reconnect interval
  EXPECT_FALSE(store->lookup(key));
  ASSERT_TRUE(store->put(key, kv.view()));
  auto again = store->lookup(key);
  ASSERT_TRUE(again);
  auto got = fetch_all(*store, *again);
  ASSERT_TRUE(got);
  EXPECT_TRUE(same_bits(*got, *first));
  EXPECT_GE(store->stats().connects, 2u);
}

// A server that stops answering (SIGSTOP) costs one command timeout, not a
// hang; the next calls, with the connection dropped, do not wait again
// longer than the timeouts either.
TEST_F(RedisStoreTest, UnresponsiveServerTimesOut) {
  RedisOptions o = options_for(server_);
  o.command_timeout_ms = 200;
  o.connect_timeout_ms = 200;
  auto store = RedisStore::open(o);
  const ChunkKey key = make_key(make_tokens(40, 4));
  ASSERT_TRUE(store->put(key, make_kv(small_shape(), 4).view()));
  auto h = store->lookup(key);
  ASSERT_TRUE(h);
  server_.pause();
  auto t0 = std::chrono::steady_clock::now();
  ChunkKV out(h->shape());
  EXPECT_FALSE(store->fetch_layer(*h, 0, out.k_layer(0), out.v_layer(0)));
  const double first = seconds_since(t0);
  EXPECT_GE(first, 0.15);
  EXPECT_LT(first, 1.0);
  t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(store->lookup(key));  // reconnect: accepted by the kernel, no answer
  EXPECT_LT(seconds_since(t0), 1.0);
  server_.resume();
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_TRUE(store->lookup(key));
}

// A value whose header claims another shape than its key's tokens, with
// every checksum right (anyone who can write to the server can build one),
// is a miss: more tokens would write past the caller's rows, and a huge
// count would size an allocation.
TEST_F(RedisStoreTest, AHeaderClaimingAnotherTokenCountIsAMiss) {
  auto store = RedisStore::open(options_for(server_));
  const ChunkKey key = make_key(make_tokens(40, 11), Codec::kQ8);
  const ChunkKV kv = make_kv(small_shape(), 11);
  ASSERT_TRUE(store->put(key, kv.view()));
  ASSERT_TRUE(store->lookup(key));
  const std::string name = store->value_name(key);
  redisContext* c = server_.connect();
  const std::string value = raw(c, "GET %b", name);
  for (int32_t tokens : {160, 80000, 2147483647, 0, -40}) {
    KvShape forged = small_shape();
    forged.n_tokens = tokens;
    raw(c, "SET %b %b", name, testing::forge_redis_shape(value, forged));
    EXPECT_FALSE(store->lookup(key)) << tokens << " tokens";
  }
  raw(c, "SET %b %b", name, value);
  EXPECT_TRUE(store->lookup(key));
  redisFree(c);
  // A put whose KV does not match its key is the caller's bug.
  EXPECT_THROW(store->put(make_key(make_tokens(39, 11)), kv.view()), Error);
}

RedisOptions options_for(const FakeServer& server, int timeout_ms) {
  RedisOptions o;
  o.port = server.port();
  o.connect_timeout_ms = timeout_ms;
  o.command_timeout_ms = timeout_ms;
  o.reconnect_interval_ms = 0;
  return o;
}

// A reply header, then a byte every 50 ms: each read ends well inside the
// timeout, but the command as a whole must not outlast it.
TEST(RedisMisbehaving, ASlowDripEndsAtTheCommandTimeout) {
  FakeServer server("$100\r\n", 100, 50, 0);
  auto store = RedisStore::open(options_for(server, 300));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(store->lookup(make_key(make_tokens(40, 1))));
  const double took = seconds_since(t0);
  EXPECT_GE(took, 0.25);
  EXPECT_LT(took, 1.0);
  EXPECT_NE(store->stats().last_error.find("within 300 ms"), std::string::npos)
      << store->stats().last_error;
  // A request's other chunks do not wait again within the reconnect
  // interval.
  auto slow = options_for(server, 300);
  slow.reconnect_interval_ms = 60000;
  auto backing_off = RedisStore::open(slow);  // its PING is answered
  EXPECT_FALSE(backing_off->lookup(make_key(make_tokens(40, 2))));
  const auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(backing_off->lookup(make_key(make_tokens(40, 3 + i))));
  EXPECT_LT(seconds_since(t1), 0.1);
}

// The thread's cancellation check (a session's abort callback) ends the
// wait long before the timeout.
TEST(RedisMisbehaving, ACancelledRequestStopsWaiting) {
  FakeServer server("$100\r\n", 100, 50, 0);
  auto store = RedisStore::open(options_for(server, 10000));
  const auto t0 = std::chrono::steady_clock::now();
  ScopedCancelCheck cancel([&] { return seconds_since(t0) > 0.2; });
  EXPECT_FALSE(store->lookup(make_key(make_tokens(40, 1))));
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_NE(store->stats().last_error.find("cancelled"), std::string::npos)
      << store->stats().last_error;
}

// A reply far longer than the 4 KiB header read asked for is cut off, not
// buffered whole.
TEST(RedisMisbehaving, AnOversizedReplyIsRefused) {
  constexpr size_t kFlood = 256u << 20;
  FakeServer server("$" + std::to_string(kFlood) + "\r\n", 0, 0, kFlood);
  auto store = RedisStore::open(options_for(server, 5000));
  EXPECT_FALSE(store->lookup(make_key(make_tokens(40, 1))));
  EXPECT_NE(store->stats().last_error.find("longer than"), std::string::npos)
      << store->stats().last_error;
  // What the client took before hanging up, plus what the kernel buffers.
  EXPECT_LT(server.sent(), size_t{32} << 20);
}

TEST(RedisStoreDown, NoServerIsAMissAndOpenStillWorks) {
  RedisOptions o;
  o.port = testing::free_loopback_port();
  o.reconnect_interval_ms = 60000;
  auto store = RedisStore::open(o);
  EXPECT_FALSE(store->ping());
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(store->lookup(make_key(make_tokens(40, i))));
  EXPECT_LT(seconds_since(t0), 0.5);  // back-off: no connect per call
  const RedisStoreStats st = store->stats();
  EXPECT_EQ(st.misses, 100u);
  EXPECT_NE(st.last_error.find("cannot connect to redis at 127.0.0.1:" + std::to_string(o.port)),
            std::string::npos)
      << st.last_error;
}

TEST(RedisStoreOptions, BadOptionsAreClearErrors) {
  RedisOptions o;
  o.port = 0;
  EXPECT_THROW(RedisStore::open(o), Error);
  o = {};
  o.command_timeout_ms = 0;
  EXPECT_THROW(RedisStore::open(o), Error);
  o = {};
  o.host = "";
  EXPECT_THROW(RedisStore::open(o), Error);
  o = {};
  o.username = "alice";
  EXPECT_THROW(RedisStore::open(o), Error);
}

// No message names a password, whatever is mistyped around it.
TEST(RedisStoreOptions, ErrorsNeverShowThePassword) {
  for (const char* address : {"redis://user:s3cretpw@host:port", "redis://:s3cretpw@host:6379/db9x",
                              "redis://user:s3cretpw@:6379", "redis://user:s3cretpw",
                              "user:s3cretpw@host:0", "rediss://user:s3cretpw@host:6379"}) {
    RedisOptions o;
    try {
      parse_redis_address(address, o);
      ADD_FAILURE() << "accepted " << address;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find("s3cretpw"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("redis address"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(redacted_redis_address("redis://u:pw@h:1/2"), "redis://***@h:1/2");
  EXPECT_EQ(redacted_redis_address("h:6379"), "h:6379");
}

TEST(RedisStoreOptions, ParsesAddresses) {
  RedisOptions o;
  parse_redis_address("cache.local:6380", o);
  EXPECT_EQ(o.host, "cache.local");
  EXPECT_EQ(o.port, 6380);
  o = {};
  parse_redis_address("redis://alice:s3cr:et@10.0.0.2:7000/3", o);
  EXPECT_EQ(o.username, "alice");
  EXPECT_EQ(o.password, "s3cr:et");
  EXPECT_EQ(o.host, "10.0.0.2");
  EXPECT_EQ(o.port, 7000);
  EXPECT_EQ(o.db, 3);
  o = {};
  parse_redis_address("redis://:pw@h", o);
  EXPECT_EQ(o.username, "");
  EXPECT_EQ(o.password, "pw");
  EXPECT_EQ(o.port, 6379);
  o = {};
  parse_redis_address("myhost", o);
  EXPECT_EQ(o.host, "myhost");
  EXPECT_THROW(parse_redis_address("h:notaport", o), Error);
  EXPECT_THROW(parse_redis_address(":6379", o), Error);
  EXPECT_THROW(parse_redis_address("redis://h/x", o), Error);
  try {
    parse_redis_address("rediss://h:6380", o);
    FAIL() << "TLS accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TLS"), std::string::npos);
  }
}

class RedisAuthTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(server_.start(), ""); }
  RedisServer server_{{"--requirepass", "right-password"}};
};

TEST_F(RedisAuthTest, WrongPasswordIsAMissWithAClearError) {
  RedisOptions o = options_for(server_);
  o.password = "wrong-password";
  auto store = RedisStore::open(o);
  EXPECT_FALSE(store->ping());
  const ChunkKey key = make_key(make_tokens(40, 5));
  EXPECT_FALSE(store->put(key, make_kv(small_shape(), 5).view()));
  EXPECT_FALSE(store->lookup(key));
  const RedisStoreStats st = store->stats();
  EXPECT_NE(st.last_error.find("AUTH"), std::string::npos) << st.last_error;
  EXPECT_NE(st.last_error.find("WRONGPASS"), std::string::npos) << st.last_error;

  RedisOptions none = options_for(server_);
  auto anonymous = RedisStore::open(none);
  EXPECT_FALSE(anonymous->lookup(key));
  EXPECT_NE(anonymous->stats().last_error.find("NOAUTH"), std::string::npos);

  RedisOptions right = options_for(server_);
  right.password = "right-password";
  auto good = RedisStore::open(right);
  ASSERT_TRUE(good->put(key, make_kv(small_shape(), 5).view()));
  EXPECT_TRUE(good->lookup(key));
  EXPECT_EQ(good->stats().errors, 0u);
}

TEST(RedisAcl, UsernameAndPasswordArePassedThrough) {
  RedisServer server;
  ASSERT_EQ(server.start(), "");
  redisContext* c = server.connect();
  auto* r = static_cast<redisReply*>(redisCommand(c, "ACL SETUSER tier on >tier-pw ~cb:* +@all"));
  ASSERT_TRUE(r && r->type == REDIS_REPLY_STATUS);
  freeReplyObject(r);
  redisFree(c);
  RedisOptions o = options_for(server);
  o.username = "tier";
  o.password = "tier-pw";
  auto store = RedisStore::open(o);
  const ChunkKey key = make_key(make_tokens(40, 6));
  ASSERT_TRUE(store->put(key, make_kv(small_shape(), 6).view()));
  EXPECT_TRUE(store->lookup(key));
  // The user may touch cb:* only.
  o.key_prefix = "private:";
  auto outside = RedisStore::open(o);
  EXPECT_FALSE(outside->put(key, make_kv(small_shape(), 6).view()));
  EXPECT_NE(outside->stats().last_error.find("NOPERM"), std::string::npos)
      << outside->stats().last_error;
}

// maxmemory with noeviction: puts fail once the server is full, and what it
// holds stays readable.
TEST(RedisFull, PutFailsCleanlyAndLookupsStillWork) {
  RedisServer server({"--maxmemory", "1mb", "--maxmemory-policy", "noeviction"});
  ASSERT_EQ(server.start(), "");
  auto store = RedisStore::open(options_for(server));
  // f16: 8 KiB a chunk; an empty server already uses ~0.9 of its 1 MiB.
  const KvShape shape{2, 32, 2, 16};
  int stored = 0;
  bool refused = false;
  for (int i = 0; i < 200 && !refused; ++i) {
    const ChunkKey key = make_key(make_tokens(32, i), Codec::kF16);
    if (store->put(key, make_kv(shape, i).view())) {
      ++stored;
    } else {
      refused = true;
    }
  }
  ASSERT_TRUE(refused);
  ASSERT_GT(stored, 0);
  const RedisStoreStats st = store->stats();
  EXPECT_GE(st.put_failures, 1u);
  EXPECT_NE(st.last_error.find("OOM"), std::string::npos) << st.last_error;
  for (int i = 0; i < stored; ++i) {
    auto h = store->lookup(make_key(make_tokens(32, i), Codec::kF16));
    ASSERT_TRUE(h) << i;
    auto got = fetch_all(*store, *h);
    ASSERT_TRUE(got);
    EXPECT_TRUE(testing::equals_f16_of(*got, make_kv(shape, i)));
  }
}

// A value damaged on the server: in a segment, the layer read fails; in the
// header, the lookup misses; a value that is not ours misses.  Never wrong
// data.
TEST_F(RedisStoreTest, CorruptValuesAreMisses) {
  auto store = RedisStore::open(options_for(server_));
  const ChunkKey key = make_key(make_tokens(40, 8), Codec::kQ8);
  const ChunkKV kv = make_kv(small_shape(), 8);
  ASSERT_TRUE(store->put(key, kv.view()));
  auto h = store->lookup(key);
  ASSERT_TRUE(h);
  const std::string name = store->value_name(key);
  redisContext* c = server_.connect();
  // Flip a byte near the end: inside the last layer's segment.
  std::string value = raw(c, "GET %b", name);
  ASSERT_FALSE(value.empty());
  std::string bad_tail = value;
  bad_tail[bad_tail.size() - 3] ^= 0x40;
  raw(c, "SET %b %b", name, bad_tail);
  ChunkKV out(kv.shape);
  EXPECT_TRUE(store->fetch_layer(*h, 0, out.k_layer(0), out.v_layer(0)));
  const int last = kv.shape.n_layers - 1;
  EXPECT_FALSE(store->fetch_layer(*h, last, out.k_layer(last), out.v_layer(last)));
  EXPECT_GE(store->stats().corrupt, 1u);
  // Flip a byte of the header: the lookup misses.
  std::string bad_header = value;
  bad_header[20] ^= 0x01;  // n_layers
  raw(c, "SET %b %b", name, bad_header);
  EXPECT_FALSE(store->lookup(key));
  // Truncated, or not ours at all.
  raw(c, "SET %b %b", name, value.substr(0, 100));
  EXPECT_FALSE(store->lookup(key));
  raw(c, "SET %b %b", name, std::string("hello"));
  EXPECT_FALSE(store->lookup(key));
  // A value of another chunk copied under this key: the key hash differs.
  const ChunkKey other = make_key(make_tokens(40, 9), Codec::kQ8);
  ASSERT_TRUE(store->put(other, kv.view()));
  raw(c, "SET %b %b", name, raw(c, "GET %b", store->value_name(other)));
  EXPECT_FALSE(store->lookup(key));
  EXPECT_TRUE(store->lookup(other));
  // The next put replaces the damaged value.
  ASSERT_TRUE(store->put(key, kv.view()));
  auto fixed = store->lookup(key);
  ASSERT_TRUE(fixed);
  EXPECT_TRUE(fetch_all(*store, *fixed));
  redisFree(c);
}

}  // namespace
}  // namespace cb::cache
