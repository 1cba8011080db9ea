// libFuzzer target: the flash chunk store (cache/flash_store.h) opened on a
// directory the fuzzer has damaged.
//
// A store of three chunks (f16, q8 and q4, three layers each) is written once
// per process; each input copies it and applies edits read from the input,
// one record after another:
//   - set a column of an entries or segments row (chosen by position) to an
//     integer (edge values, or 8 raw bytes), NULL, text, a blob or a real;
//   - add a small delta to such a column;
//   - delete a row;
//   - change one byte of index.sqlite;
//   - change one byte of a blob file, or cut it short.
// Then it checks what flash_store.h promises about damage:
//   - open() repairs what it can and never throws anything but cb::Error;
//   - lookup() and fetch_layer() never throw for a damaged store; a
//     fetch_layer that fails has dropped the entry (the next lookup misses);
//   - a layer read back with the chunk's own shape holds exactly the values
//     first read from the undamaged store: damage is a miss, never wrong
//     data (edits that move rows between chunks or layers may make it
//     another stored layer, never anything else);
//   - a new chunk can be put and read back, and the store opens again.
//
//   build-fuzz/bin/fuzz_chunk_store -max_total_time=60
#include <sqlite3.h>
#include <stdlib.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cache/chunk_kv.h"
#include "cache/flash_store.h"
#include "platform/error.h"
#include "platform/sqlite.h"
#include "tests/cache/cache_test_util.h"

namespace {

namespace fs = std::filesystem;
using cb::cache::ChunkKey;
using cb::cache::ChunkKV;
using cb::cache::Codec;
using cb::cache::FlashStore;
using cb::cache::KvShape;
using cb::cache::testing::make_key;
using cb::cache::testing::make_kv;
using cb::cache::testing::make_tokens;

void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_chunk_store: %s\n", what);
  std::abort();
}

class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint64_t bytes(int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v = v << 8 | byte();
    return v;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

constexpr KvShape kShape{3, 5, 2, 8};
constexpr std::array<Codec, 3> kCodecs{Codec::kF16, Codec::kQ8, Codec::kQ4};

struct Column {
  const char* table;
  const char* name;
  bool moves_data;  // an edit can make a row describe another chunk's or layer's bytes
};
constexpr std::array<Column, 20> kColumns{{
    {"entries", "id", true},          {"entries", "key_hash", false},
    {"entries", "namespace", false},  {"entries", "model", false},
    {"entries", "chunk_head", false}, {"entries", "codec", false},
    {"entries", "tokens", false},     {"entries", "n_layers", false},
    {"entries", "n_tokens", false},   {"entries", "n_head_kv", false},
    {"entries", "head_dim", false},   {"entries", "blob", true},
    {"entries", "bytes", false},      {"entries", "last_access", false},
    {"entries", "pinned", false},     {"segments", "entry_id", true},
    {"segments", "layer", true},      {"segments", "offset", false},
    {"segments", "size", false},      {"segments", "checksum", false},
}};
constexpr std::array<int64_t, 16> kEdgeValues{0,
                                              1,
                                              -1,
                                              2,
                                              63,
                                              64,
                                              65,
                                              4096,
                                              -64,
                                              int64_t{1} << 31,
                                              (int64_t{1} << 32) - 1,
                                              int64_t{1} << 32,
                                              std::numeric_limits<int32_t>::max(),
                                              std::numeric_limits<int32_t>::min(),
                                              std::numeric_limits<int64_t>::max(),
                                              std::numeric_limits<int64_t>::min()};

// The undamaged store, written once per process, and what it reads back.
struct Pristine {
  fs::path root;
  fs::path store;
  std::vector<ChunkKey> keys;
  std::vector<ChunkKV> stored;  // as read back: the codecs' rounding included

  Pristine() {
    std::string tmpl = (fs::temp_directory_path() / "fuzz_chunk_store.XXXXXX").string();
    require(::mkdtemp(tmpl.data()) != nullptr, "cannot make a temporary directory");
    root = tmpl;
    store = root / "pristine";
    auto s = FlashStore::open(store.string());
    for (size_t i = 0; i < kCodecs.size(); ++i) {
      keys.push_back(
          make_key(make_tokens(kShape.n_tokens, static_cast<int32_t>(i + 1)), kCodecs[i]));
      const ChunkKV kv = make_kv(kShape, i + 11);
      require(s->put(keys.back(), kv.view()) == cb::cache::PutResult::kStored, "setup put");
      auto h = s->lookup(keys.back());
      require(h.has_value(), "setup lookup");
      auto back = cb::cache::testing::fetch_all(*s, *h);
      require(back.has_value(), "setup fetch");
      stored.push_back(std::move(*back));
    }
  }
  ~Pristine() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
};

bool same_floats(const float* a, const float* b, int64_t n) {
  return std::equal(a, a + n, b, [](float x, float y) {
    return std::bit_cast<uint32_t>(x) == std::bit_cast<uint32_t>(y);
  });
}

// Layer `layer` of chunk `chunk` as first stored, or (moved) any stored layer.
bool is_stored_layer(const Pristine& p, size_t chunk, int layer, bool moved, const float* k,
                     const float* v) {
  const int64_t n = kShape.layer_floats();
  for (size_t c = 0; c < p.stored.size(); ++c) {
    for (int l = 0; l < kShape.n_layers; ++l) {
      if (!moved && (c != chunk || l != layer)) continue;
      const ChunkKV& kv = p.stored[c];
      if (same_floats(k, kv.k.data() + l * n, n) && same_floats(v, kv.v.data() + l * n, n)) {
        return true;
      }
    }
  }
  return false;
}

void sql_edit(sqlite3* db, Input& in, bool* moved) {
  const uint8_t op = in.byte();
  const Column& col = kColumns[in.byte() % kColumns.size()];
  const int64_t row = in.byte() % 12;
  const std::string where =
      std::string(col.table) == "entries"
          ? "id = (SELECT id FROM entries ORDER BY id LIMIT 1 OFFSET ?2)"
          : "(entry_id, layer) = (SELECT entry_id, layer FROM segments ORDER BY entry_id, layer "
            "LIMIT 1 OFFSET ?2)";
  std::string sql;
  if (op % 3 == 0) {
    sql = std::string("DELETE FROM ") + col.table + " WHERE " + where;
  } else if (op % 3 == 1) {
    sql = std::string("UPDATE ") + col.table + " SET " + col.name + " = ?1 WHERE " + where;
  } else {
    sql = std::string("UPDATE ") + col.table + " SET " + col.name + " = " + col.name +
          " + ?1 WHERE " + where;
  }
  *moved = *moved || (op % 3 != 0 && col.moves_data);
  try {
    cb::sqlite::Statement s(db, sql.c_str(), "fuzzed index");
    if (op % 3 == 2) {
      s.bind(1, static_cast<int64_t>(static_cast<int8_t>(in.byte())));
    } else if (op % 3 == 1) {
      switch (in.byte() % 6) {
        case 0:
          s.bind(1, kEdgeValues[in.byte() % kEdgeValues.size()]);
          break;
        case 1:
          s.bind_u64(1, in.bytes(8));
          break;
        case 2:
          break;  // unbound: NULL
        case 3:
          s.bind(1, std::string(in.byte() % 8, static_cast<char>(in.byte())));
          break;
        case 4:
          s.bind_blob(1, std::string(in.byte() % 8, static_cast<char>(in.byte())));
          break;
        default:
          s.bind_double(1, static_cast<double>(static_cast<int8_t>(in.byte())) / 3);
          break;
      }
    }
    s.bind(2, row);
    s.step();
  } catch (const cb::Error&) {
    // A constraint the schema enforces (NOT NULL, UNIQUE, the primary key):
    // the edit is refused, as it would be for any writer.
  }
}

void poke_file(const fs::path& path, Input& in) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec || size == 0) return;
  const uint64_t at = in.bytes(3) % size;
  const uint8_t value = in.byte();
  FILE* f = std::fopen(path.c_str(), "r+b");
  require(f != nullptr, "cannot open a file to damage");
  std::fseek(f, static_cast<long>(at), SEEK_SET);
  std::fputc(value, f);
  std::fclose(f);
}

void damage_blob(const fs::path& store, Input& in) {
  std::vector<fs::path> blobs;
  for (const auto& e : fs::directory_iterator(store / "blobs")) blobs.push_back(e.path());
  if (blobs.empty()) return;
  std::sort(blobs.begin(), blobs.end());
  const fs::path& blob = blobs[in.byte() % blobs.size()];
  if (in.byte() & 1) {
    std::error_code ec;
    const auto size = fs::file_size(blob, ec);
    if (!ec) fs::resize_file(blob, in.bytes(2) % (size + 1), ec);
  } else {
    poke_file(blob, in);
  }
}

// Damages the copy; true if an edit may have moved data between rows.
bool damage(const fs::path& store, Input& in) {
  bool moved = false;
  sqlite3* db = nullptr;
  require(sqlite3_open_v2((store / "index.sqlite").c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) ==
              SQLITE_OK,
          "cannot open the copied index");
  for (int edits = 0; !in.empty() && edits < 8; ++edits) {
    const uint8_t kind = in.byte() % 4;
    if (kind <= 1) {
      sql_edit(db, in, &moved);
    } else if (kind == 2) {
      sqlite3_close(db);
      db = nullptr;
      poke_file(store / "index.sqlite", in);
      moved = true;  // a byte of a record can be a layer number or an entry id
      require(sqlite3_open_v2((store / "index.sqlite").c_str(), &db, SQLITE_OPEN_READWRITE,
                              nullptr) == SQLITE_OK,
              "cannot reopen the damaged index");
    } else {
      damage_blob(store, in);
    }
  }
  sqlite3_close(db);
  return moved;
}

// Every stored chunk looked up and read back from the damaged store.
void check_reads(FlashStore& store, const Pristine& p, bool moved) {
  for (size_t c = 0; c < p.keys.size(); ++c) {
    const auto h = store.lookup(p.keys[c]);
    if (!h) continue;
    if (!(h->shape() == kShape)) continue;  // a caller compares it with its model's (and misses)
    ChunkKV out(kShape);
    for (int l = 0; l < kShape.n_layers; ++l) {
      if (!store.fetch_layer(*h, l, out.k_layer(l), out.v_layer(l))) {
        require(!store.lookup(p.keys[c]).has_value(), "a failed read did not drop the entry");
        break;
      }
      require(is_stored_layer(p, c, l, moved, out.k_layer(l), out.v_layer(l)),
              "a damaged store read back values that were never stored");
    }
  }
}

void check_still_usable(FlashStore& store) {
  const ChunkKey key = make_key(make_tokens(kShape.n_tokens, 99), Codec::kF16);
  const ChunkKV kv = make_kv(kShape, 99);
  store.put(key, kv.view());
  const auto h = store.lookup(key);
  require(h.has_value(), "a chunk put into the repaired store is not found");
  const auto back = cb::cache::testing::fetch_all(store, *h);
  require(back.has_value() && cb::cache::testing::equals_f16_of(*back, kv),
          "a chunk put into the repaired store does not read back");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Pristine pristine;
  const fs::path work = pristine.root / "work";
  std::error_code ec;
  fs::remove_all(work, ec);
  fs::copy(pristine.store, work, fs::copy_options::recursive);
  Input in(data, size);
  const bool moved = damage(work, in);

  std::unique_ptr<FlashStore> store;
  try {
    store = FlashStore::open(work.string());
  } catch (const cb::Error& e) {
    // The one index open() may refuse: one a newer build wrote (a damaged
    // schema version).  Any other damage is repaired.
    if (e.code() == cb::ErrorCode::kUnsupported) return 0;
    std::fprintf(stderr, "fuzz_chunk_store: %s\n", e.what());
    require(false, "a damaged store does not open");
  }
  try {
    check_reads(*store, pristine, moved);
    check_still_usable(*store);
  } catch (const cb::Error& e) {
    std::fprintf(stderr, "fuzz_chunk_store: %s\n", e.what());
    require(false, "a damaged store threw");
  }
  store.reset();
  try {
    FlashStore::open(work.string());
  } catch (const cb::Error& e) {
    std::fprintf(stderr, "fuzz_chunk_store: %s\n", e.what());
    require(false, "the repaired store does not open again");
  }
  return 0;
}
