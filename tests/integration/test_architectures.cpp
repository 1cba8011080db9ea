// Every architecture against the float64 reference on a random-weight model
// of its own, written at test time with the `gguf` package
// (tests/oracle/write_random_gguf.py; CTest's oracle_arch_reference writes
// them and the reference logits into build/oracle/arch/).  Then the fusor's
// identities on each:
// r = 1 is full prefill, r = 0 is reuse, and a stored chunk's layer-0 K
// rotated to a new position is the K computed there (the re-positioning
// follows the architecture's RoPE).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "runtime/blend/fusor.h"
#include "runtime/llama_layer.h"
#include "runtime/model.h"
#include "runtime/session.h"
#include "tests/integration/reference_logits.h"
#include "tests/runtime/counting_backends.h"

namespace cb {
namespace {

const std::string kDir = CB_BINARY_DIR "/oracle/arch";

using test::read_f64;

struct Prompt {
  std::string name;
  std::vector<int32_t> ids;
};

// prompts.txt: "name id id ..." per line.
std::vector<Prompt> read_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<Prompt> out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    Prompt p;
    words >> p.name;
    for (int32_t id; words >> id;) p.ids.push_back(id);
    out.push_back(std::move(p));
  }
  return out;
}

double rel_l2(std::span<const float> a, std::span<const float> b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    den += double{b[i]} * b[i];
  }
  return std::sqrt(num / den);
}

class Architecture : public testing::TestWithParam<const char*> {
 protected:
  std::string dir() const { return kDir + "/" + GetParam(); }
  std::unique_ptr<Model> load() const { return Model::load(kDir + "/" + GetParam() + ".gguf"); }
};

TEST_P(Architecture, LastLogitsMatchFloat64Reference) {
  auto model = load();
  // llama3: a `llama` file with Llama 3.1's RoPE frequency divisors.
  const std::string name = GetParam();
  EXPECT_EQ(arch_name(model->hparams().arch), name == "llama3" ? "llama" : name);
  EXPECT_EQ(model->hparams().rope_freq_factors != nullptr, name == "llama3");
  const std::vector<Prompt> prompts = read_prompts(dir() + "/prompts.txt");
  ASSERT_GE(prompts.size(), 3u);
  for (const Prompt& p : prompts) {
    const std::vector<double> ref = read_f64(dir() + "/" + p.name + ".logits.f64");
    ASSERT_EQ(ref.size(), static_cast<size_t>(model->hparams().n_vocab)) << p.name;
    Session s(*model, {.n_ctx = 512,
                       .n_threads = 2,
                       .n_batch = 64,
                       .int8_prefill = false,
                       .kv_type = KvType::kF32});
    const test::LogitsError e = test::compare_logits(s.prefill(p.ids), ref);
    std::printf("  %-6s %-12s %3zu tokens  rel L2 %.2e\n", GetParam(), p.name.c_str(), p.ids.size(),
                e.rel_l2);
    EXPECT_LE(e.rel_l2, 1e-3) << p.name;
    EXPECT_TRUE(e.same_argmax) << p.name;
  }
}

// A RAG-shaped request of random ids: head, three chunks, question.
struct Request {
  std::vector<int32_t> head, suffix;
  std::vector<std::vector<int32_t>> chunks;
  std::vector<int32_t> all() const {
    std::vector<int32_t> t = head;
    for (const auto& c : chunks) t.insert(t.end(), c.begin(), c.end());
    t.insert(t.end(), suffix.begin(), suffix.end());
    return t;
  }
};

Request random_request() {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> byte(0, 255);
  auto ids = [&](int n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int32_t& t : v) t = byte(rng);
    return v;
  };
  return {ids(6), ids(12), {ids(40), ids(55), ids(33)}};
}

// The request's chunks stored after its head by `scratch`, and its
// segments over them (the first chunk reused as stored).
struct StoredRequest {
  StoredRequest(Session& scratch, const Request& req) {
    for (const auto& c : req.chunks) kv.push_back(precompute_chunk_kv(scratch, req.head, c));
    for (const auto& k : kv) sources.push_back(std::make_unique<cache::MemoryChunkSource>(k));
    segments.push_back({req.head});
    for (size_t i = 0; i < req.chunks.size(); ++i)
      segments.push_back({req.chunks[i], sources[i].get(), i == 0});
    segments.push_back({req.suffix});
  }
  std::vector<cache::ChunkKV> kv;
  std::vector<std::unique_ptr<cache::MemoryChunkSource>> sources;
  std::vector<Segment> segments;
};

TEST_P(Architecture, FusorIdentities) {
  auto model = load();
  const Request req = random_request();
  // f32 caches throughout: the bars are f32's (the real model's fusor tests
  // hold the f16 cache to them), and a chunk's KV depends on the cache type
  // of the prefill that made it.
  Session scratch(*model,
                  {.n_ctx = 512, .n_threads = 2, .int8_prefill = false, .kv_type = KvType::kF32});
  const StoredRequest stored(scratch, req);
  const std::vector<cache::ChunkKV>& kv = stored.kv;
  const std::vector<Segment>& segs = stored.segments;
  auto fused = [&](const BlendOptions& o) {
    Session s(*model,
              {.n_ctx = 512, .n_threads = 2, .int8_prefill = false, .kv_type = KvType::kF32});
    auto l = fuse_prefill(s, segs, o);
    return std::vector<float>(l.begin(), l.end());
  };
  Session full_session(
      *model, {.n_ctx = 512, .n_threads = 2, .int8_prefill = false, .kv_type = KvType::kF32});
  auto full_span = full_session.prefill(req.all());
  const std::vector<float> full(full_span.begin(), full_span.end());

  BlendOptions all_tokens;
  all_tokens.selection = Selection::kHkvd;
  all_tokens.schedule = {{1, 1.0f}};
  EXPECT_LE(rel_l2(fused(all_tokens), full), 1e-4) << "r = 1 is full prefill";
  BlendOptions none = all_tokens;
  none.schedule = {{1, 0.0f}};
  const std::vector<float> reuse = fused({BlendMode::kReuse, {}});
  EXPECT_LE(rel_l2(fused(none), reuse), 1e-4) << "r = 0 is reuse";
  EXPECT_GT(rel_l2(reuse, full), 1e-4) << "reuse differs from full prefill";

  // Chunk 2, stored after the head alone, rotated to where it sits here.
  const LlamaHparams& hp = model->hparams();
  const int64_t kv_dim = hp.kv_dim();
  const int64_t p0 =
      static_cast<int64_t>(req.head.size() + req.chunks[0].size() + req.chunks[1].size());
  const int64_t len = static_cast<int64_t>(req.chunks[2].size());
  std::vector<float> k(kv[2].k.begin(), kv[2].k.begin() + len * kv_dim);
  std::vector<int32_t> pos(static_cast<size_t>(len));
  std::iota(pos.begin(), pos.end(), static_cast<int32_t>(p0));
  rope_keys(full_session.backend(), hp, 0, full_session.layer_weights()[0], k.data(), pos.data(),
            len);
  std::vector<float> in_place(static_cast<size_t>(len * kv_dim));
  full_session.read_kv_rows(0, false, p0, len, in_place.data());
  for (int64_t i = 0; i < len * kv_dim; ++i)
    ASSERT_NEAR(k[i], in_place[i], 1e-4f * (1.0f + std::fabs(in_place[i]))) << i;
}

// Every weight an op reads (matrices, norm weights, the projections'
// biases, the per-head norms, the output norm, RoPE's frequency divisors)
// comes from prepare_weight(), as the Backend interface asks: a GPU backend
// uploads it once, where a host pointer would cost it a lookup, a
// comparison and perhaps an upload at every op of every token, and keeps a
// decode token from being replayed as one graph.  Prefill, decode and a
// blend (its loads, chunk shift and question rotate keys and queries
// outside a graph).
TEST_P(Architecture, OpsReadOnlyPreparedWeights) {
  auto model = load();
  const Request req = random_request();
  const SessionOptions opts{.n_ctx = 512, .n_threads = 2, .int8_prefill = false};
  auto counted = [&] {
    auto be = std::make_unique<test::CountingBackend>(2, /*relocate_weights=*/true);
    test::CountingBackend* raw = be.get();
    return std::make_pair(std::make_unique<Session>(*model, opts, std::move(be)), raw);
  };
  auto [s, be] = counted();
  Session plain(*model, opts);
  const std::vector<int32_t> all = req.all();
  auto got = s->prefill(all);
  auto want = plain.prefill(all);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin(), want.end()));
  got = s->decode(7);
  want = plain.decode(7);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin(), want.end()));
  EXPECT_EQ(be->unprepared_weights, 0);

  auto [blend, blend_be] = counted();
  Session scratch(*model, opts);
  const StoredRequest stored(scratch, req);
  fuse_prefill(*blend, stored.segments, BlendOptions{});
  blend->decode(7);
  EXPECT_EQ(blend_be->unprepared_weights, 0);
}

INSTANTIATE_TEST_SUITE_P(RandomWeights, Architecture,
                         testing::Values("llama", "llama3", "qwen2", "qwen3", "gemma3"),
                         [](const testing::TestParamInfo<const char*>& i) {
                           return std::string(i.param);
                         });

}  // namespace
}  // namespace cb
