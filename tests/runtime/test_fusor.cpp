// The identities CacheBlend's fusion must satisfy, on the real
// model: r = 1 is full prefill, r = 0 is full reuse, prefix caching is exact,
// a stored chunk re-positioned by RoPE equals the chunk computed in place.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <set>

#include "runtime/sampler.h"

#include "platform/error.h"
#include "runtime/blend/fusor.h"
#include "runtime/blend/selection.h"
#include "runtime/llama_layer.h"
#include "runtime/model.h"
#include "tests/runtime/counting_backends.h"
#include "tests/runtime/model_path.h"
#include "tests/runtime/rag_request_fixture.h"

namespace cb {
namespace {

const Model& model() {
  return test::shared_model();
}

std::vector<int32_t> tok(const std::string& s) {
  return model().tokenizer().encode(s, false, true);
}

using test::rel_l2;

// A small RAG request: head P, three chunks, question suffix.
struct Request {
  std::vector<int32_t> head =
      tok("<|im_start|>system\nAnswer from the documents.<|im_end|>\n"
          "<|im_start|>user\n");
  // Chunks long next to the head and the question, as retrieved passages
  // are: the lookahead's reuse pass then costs less than the recompute.
  std::vector<std::vector<int32_t>> chunks = {
      tok("Ada Lovelace worked with Charles Babbage on the Analytical Engine in London. "
          "She translated an article by Luigi Menabrea about the engine and added notes of "
          "her own, longer than the article itself. One note describes an algorithm for "
          "computing Bernoulli numbers. "),
      tok("The Analytical Engine was a mechanical general-purpose computer design. It had an "
          "arithmetic unit called the mill, a memory called the store, and it read programs "
          "and data from punched cards, an idea borrowed from the Jacquard loom used for "
          "weaving patterned silk. "),
      tok("Babbage was born in 1791 and lived most of his life in Marylebone. His house on "
          "Dorset Street held a workshop where parts of the Difference Engine were built, and "
          "he gave evening parties there that scientists, writers and politicians attended. ")};
  std::vector<int32_t> suffix =
      tok("Where did the person Ada worked with live?<|im_end|>\n<|im_start|>assistant\n");

  std::vector<int32_t> all() const {
    std::vector<int32_t> t = head;
    for (const auto& c : chunks) t.insert(t.end(), c.begin(), c.end());
    t.insert(t.end(), suffix.begin(), suffix.end());
    return t;
  }
};

// The request's segments with chunk i read from src[i]; the first chunk
// follows exactly the head it was computed after.
std::vector<Segment> request_segments(
    const Request& req, const std::vector<std::unique_ptr<cache::MemoryChunkSource>>& src) {
  std::vector<Segment> s = {{req.head}};
  for (size_t i = 0; i < req.chunks.size(); ++i)
    s.push_back({req.chunks[i], src[i].get(), /*exact_prefix=*/i == 0});
  s.push_back({req.suffix});
  return s;
}

class FusorTest : public testing::Test {
 protected:
  void SetUp() override {
    Session scratch(model(), {.n_ctx = 512, .n_threads = 2, .int8_prefill = false});
    for (const auto& c : req.chunks) kv.push_back(precompute_chunk_kv(scratch, req.head, c));
    for (const auto& k : kv) sources.push_back(std::make_unique<cache::MemoryChunkSource>(k));
  }
  std::vector<Segment> segments() { return request_segments(req, sources); }
  std::vector<float> fused(const BlendOptions& o, FusionStats* st = nullptr,
                           KvType kv = KvType::kF16, const PipelineOptions& p = {}) {
    Session s(model(), {.n_ctx = 512, .n_threads = 2, .int8_prefill = false, .kv_type = kv});
    auto segs = segments();
    auto l = fuse_prefill(s, segs, o, st, p);
    return {l.begin(), l.end()};
  }
  std::vector<float> full(KvType kv = KvType::kF16) {
    Session s(model(), {.n_ctx = 512, .n_threads = 2, .int8_prefill = false, .kv_type = kv});
    auto l = s.prefill(req.all());
    return {l.begin(), l.end()};
  }

  Request req;
  std::vector<cache::ChunkKV> kv;
  std::vector<std::unique_ptr<cache::MemoryChunkSource>> sources;
};

BlendOptions blend_with(Selection sel, std::vector<CheckLayer> schedule) {
  BlendOptions o;
  o.schedule = std::move(schedule);
  o.selection = sel;
  return o;
}

// Every inexact reused token recomputed from the check on: the first chunk
// (computed after the request's own head, so its KV is exact) is the only
// one not carried past the check.
TEST_F(FusorTest, RatioOneReproducesFullPrefill) {
  FusionStats st;
  auto b = fused({BlendMode::kBlend, {{1, 1.0f}}}, &st);
  EXPECT_LE(rel_l2(b, full()), 1e-4);
  const int64_t n = st.n_tokens, exact = static_cast<int64_t>(req.chunks[0].size());
  ASSERT_GE(st.rows_per_layer.size(), 2u);
  EXPECT_EQ(st.rows_per_layer[0], n);
  for (size_t l = 1; l < st.rows_per_layer.size(); ++l) EXPECT_EQ(st.rows_per_layer[l], n - exact);
}

// A fused layer runs its rows in the session's batches (n_batch); rows are
// independent there, so the batch size leaves the result's bits alone.
TEST_F(FusorTest, RowBatchesLeaveTheBlendUnchanged) {
  std::vector<std::vector<float>> logits;
  for (int64_t n_batch : {int64_t{16}, int64_t{256}}) {
    Session s(model(), {.n_ctx = 512, .n_threads = 2, .n_batch = n_batch, .int8_prefill = false});
    auto segs = segments();
    FusionStats st;
    auto l = fuse_prefill(s, segs, BlendOptions{}, &st);
    ASSERT_GT(st.rows_per_layer[0], 3 * 16);  // several batches at 16
    logits.emplace_back(l.begin(), l.end());
  }
  EXPECT_EQ(logits[0], logits[1]);
}

// A request whose only chunk is exact: nothing to choose among, and the
// chunk is not recomputed past the check (it used to be, at full cost).
TEST_F(FusorTest, OnlyAnExactChunkIsNotRecomputed) {
  std::vector<Segment> segs = {{req.head}, {req.chunks[0], sources[0].get(), true}, {req.suffix}};
  for (Selection sel : {Selection::kHkvd, Selection::kLookahead}) {
    SCOPED_TRACE(selection_name(sel));
    Session s(model(), {.n_ctx = 512, .n_threads = 2, .int8_prefill = false});
    FusionStats st;
    fuse_prefill(s, segs, blend_with(sel, {{first_check_layer(sel), 0.2f}}), &st);
    const int64_t exact = static_cast<int64_t>(req.chunks[0].size());
    for (size_t l = 1; l < st.rows_per_layer.size(); ++l)
      EXPECT_EQ(st.rows_per_layer[l], st.n_tokens - exact) << l;
    EXPECT_LT(st.computed_fraction(), 1.0);
  }
}

TEST_F(FusorTest, PrefixModeEqualsFullPrefill) {
  FusionStats st;
  auto p = fused({BlendMode::kPrefix, {}}, &st);
  EXPECT_LE(rel_l2(p, full()), 1e-4);
  EXPECT_EQ(st.n_reused, static_cast<int64_t>(req.chunks[0].size()));
}

// The defaults: the lookahead policy at ratio 0.2, its check at layer 0
// (no layer computes every token), closer to full prefill than reuse.
TEST_F(FusorTest, DefaultIsLookaheadFromLayerZero) {
  const BlendOptions d;
  EXPECT_EQ(d.selection, Selection::kLookahead);
  ASSERT_EQ(d.schedule.size(), 1u);
  EXPECT_EQ(d.schedule[0].layer, 0);
  EXPECT_FLOAT_EQ(d.schedule[0].ratio, 0.2f);
  FusionStats st;
  auto b = fused(d, &st);
  const int64_t uncached = static_cast<int64_t>(req.head.size() + req.suffix.size());
  // Every layer: the reuse pass's uncached rows, then the blend pass's, in
  // which the head is not computed again (its KV does not depend on the
  // chunks) and the rows left out are dropped before their projections.
  for (int64_t rows : st.rows_per_layer)
    EXPECT_EQ(rows,
              uncached + static_cast<int64_t>(req.suffix.size()) + std::llround(0.2 * st.n_reused));
  EXPECT_LT(rel_l2(b, full()), rel_l2(fused({BlendMode::kReuse, {}}), full()));
}

TEST_F(FusorTest, RatioZeroEqualsReuse) {
  FusionStats sb, sr;
  auto b = fused({BlendMode::kBlend, {{1, 0.0f}}}, &sb);
  auto r = fused({BlendMode::kReuse, {}}, &sr);
  EXPECT_LE(rel_l2(b, r), 1e-4);
  EXPECT_EQ(sb.final_rows, sr.final_rows);
  // Reuse differs from full prefill: chunks never attended to each other.
  EXPECT_GT(rel_l2(r, full()), 1e-3);
}

// The identities with either cache type.  They are not bitwise in f32
// either (r = 1 recomputes the leading exact chunk's layer 0, r = 0 carries
// every row through layer 0), so an f16 cache may round an element either
// side of a boundary where the two passes differ by an ulp of f32; what the
// f16 cache must not do is widen them beyond the f32 bar.  The pipeline,
// whose passes are the same arithmetic, stays bitwise with f16.
TEST_F(FusorTest, IdentitiesHoldWithEitherCacheType) {
  for (KvType kv : {KvType::kF32, KvType::kF16}) {
    const std::vector<float> f = full(kv), r = fused({BlendMode::kReuse, {}}, nullptr, kv);
    const double one = rel_l2(fused({BlendMode::kBlend, {{1, 1.0f}}}, nullptr, kv), f);
    const double zero = rel_l2(fused({BlendMode::kBlend, {{1, 0.0f}}}, nullptr, kv), r);
    std::printf("%s cache: r = 1 vs full prefill %.3e, r = 0 vs reuse %.3e\n", kv_type_name(kv),
                one, zero);
    EXPECT_LE(one, 1e-4) << kv_type_name(kv);
    EXPECT_LE(zero, 1e-4) << kv_type_name(kv);
    const BlendOptions blend = blend_with(Selection::kHkvd, {{1, 0.3f}});
    EXPECT_EQ(fused(blend, nullptr, kv, {.enabled = false}), fused(blend, nullptr, kv))
        << "pipelined equals serial, " << kv_type_name(kv);
  }
}

TEST_F(FusorTest, BlendIsBetweenReuseAndFull) {
  auto f = full();
  FusionStats st;
  BlendOptions hkvd;
  hkvd.selection = Selection::kHkvd;
  hkvd.schedule = {{1, 0.15f}};
  auto b = fused(hkvd, &st);
  auto r = fused({BlendMode::kReuse, {}});
  EXPECT_LT(rel_l2(b, f), rel_l2(r, f));
  const int64_t uncached = static_cast<int64_t>(req.head.size() + req.suffix.size());
  EXPECT_EQ(st.rows_per_layer[0], st.n_tokens);
  EXPECT_EQ(st.rows_per_layer[1], uncached + std::llround(0.15 * st.n_reused));
}

TEST_F(FusorTest, SelectedSetHoldsEveryUncachedToken) {
  for (float r : {0.0f, 0.05f, 0.3f}) {
    FusionStats st;
    BlendOptions o = blend_with(Selection::kHkvd, {{1, 0.5f}, {3, r}});
    fused(o, &st);
    std::vector<uint8_t> in(static_cast<size_t>(st.n_tokens), 0);
    for (int32_t p : st.final_rows) in[p] = 1;
    const int64_t n_head = static_cast<int64_t>(req.head.size());
    for (int64_t p = 0; p < n_head; ++p) EXPECT_TRUE(in[p]) << "head position " << p;
    for (int64_t p = st.n_tokens - static_cast<int64_t>(req.suffix.size()); p < st.n_tokens; ++p)
      EXPECT_TRUE(in[p]) << "suffix position " << p;
    // Gradual filtering narrows: layer 1 keeps 50 %, layer 3 keeps r.
    EXPECT_GE(st.rows_per_layer[1], st.rows_per_layer[3]);
  }
}

TEST_F(FusorTest, StoredLayer0KeyRotatedEqualsKeyComputedInPlace) {
  // An f32 cache: the tolerance is that of recomputation, below f16's step.
  Session s(model(),
            {.n_ctx = 512, .n_threads = 2, .int8_prefill = false, .kv_type = KvType::kF32});
  s.prefill(req.all());
  const int64_t kv_dim = model().hparams().kv_dim();
  const LlamaHparams& hp = model().hparams();
  // Chunk 2 sits after the head and chunks 0 and 1.
  const int64_t p0 =
      static_cast<int64_t>(req.head.size() + req.chunks[0].size() + req.chunks[1].size());
  const int64_t len = static_cast<int64_t>(req.chunks[2].size());
  std::vector<float> k(kv[2].k.begin(), kv[2].k.begin() + len * kv_dim);
  std::vector<int32_t> pos(static_cast<size_t>(len));
  for (int64_t i = 0; i < len; ++i) pos[i] = static_cast<int32_t>(p0 + i);
  rope_keys(s.backend(), hp, 0, s.layer_weights()[0], k.data(), pos.data(), len);
  std::vector<float> in_place_k(static_cast<size_t>(len * kv_dim)), in_place_v(in_place_k.size());
  s.read_kv_rows(0, false, p0, len, in_place_k.data());
  s.read_kv_rows(0, true, p0, len, in_place_v.data());
  for (int64_t i = 0; i < len * kv_dim; ++i) {
    ASSERT_NEAR(k[i], in_place_k[i], 1e-4f * (1.0f + std::fabs(in_place_k[i]))) << i;
    ASSERT_NEAR(kv[2].v[i], in_place_v[i], 1e-4f * (1.0f + std::fabs(in_place_v[i]))) << i;
  }
}

TEST_F(FusorTest, GenerationContinuesFromTheFusedCache) {
  Session a(model(), {.n_ctx = 512, .n_threads = 2, .int8_prefill = false});
  auto segs = segments();
  auto la = fuse_prefill(a, segs, {BlendMode::kBlend, {{1, 1.0f}}});
  Session b(model(), {.n_ctx = 512, .n_threads = 2, .int8_prefill = false});
  auto lb = b.prefill(req.all());
  ASSERT_EQ(argmax(la), argmax(lb));
  int32_t t = argmax(lb);
  EXPECT_LE(rel_l2(a.decode(t), b.decode(t)), 1e-4);
}

// BlendOptions::context_scale biases the attention of the rows after the
// reused chunks, and only theirs, and the session keeps the bias for what it
// decodes next: the question fused and an answer token decoded after it give
// what the question and the token fused in one request give.
TEST_F(FusorTest, ContextScaleBiasesTheQuestionAndWhatIsDecodedAfterIt) {
  const SessionOptions so{
      .n_ctx = 512, .n_threads = 2, .int8_decode = false, .int8_prefill = false};
  BlendOptions scaled{BlendMode::kReuse};
  scaled.context_scale = 0.6f;
  Session plain(model(), so), s(model(), so);
  auto segs = segments();
  const auto lp = fuse_prefill(plain, segs, {BlendMode::kReuse});
  const std::vector<float> ls = [&] {
    auto l = fuse_prefill(s, segs, scaled);
    return std::vector<float>(l.begin(), l.end());
  }();
  EXPECT_GT(rel_l2(ls, {lp.begin(), lp.end()}), 1e-3);
  // The chunks' rows and the head's: the same KV bit for bit.
  const int64_t query_begin = static_cast<int64_t>(req.all().size() - req.suffix.size());
  const int64_t kv_dim = model().hparams().kv_dim();
  for (int64_t layer : {int64_t{0}, model().hparams().n_layer - 1}) {
    std::vector<float> a(static_cast<size_t>(query_begin * kv_dim)), b(a.size());
    plain.read_kv_rows(layer, true, 0, query_begin, a.data());
    s.read_kv_rows(layer, true, 0, query_begin, b.data());
    EXPECT_EQ(a, b) << "layer " << layer;
  }
  ASSERT_TRUE(s.context_bias().active());
  EXPECT_EQ(s.context_bias().key_begin,
            static_cast<int64_t>(req.head.size() + req.chunks[0].size()));
  EXPECT_EQ(s.context_bias().key_end, query_begin);

  const int32_t t = argmax(ls);
  const std::vector<float> decoded = [&] {
    auto l = s.decode(t);
    return std::vector<float>(l.begin(), l.end());
  }();
  std::vector<int32_t> question_and_token = req.suffix;
  question_and_token.push_back(t);
  segs.back().tokens = question_and_token;
  Session one(model(), so);
  const auto lo = fuse_prefill(one, segs, scaled);
  const std::vector<float> in_one(lo.begin(), lo.end());
  EXPECT_LE(rel_l2(decoded, in_one), 1e-4);
  // Without the bias the decoded token's logits are another distribution.
  s.truncate(s.n_past() - 1);
  s.set_context_bias({});
  auto unbiased = s.decode(t);
  EXPECT_GT(rel_l2({unbiased.begin(), unbiased.end()}, in_one), 1e-3);

  // A truncation into the chunks, or a request in another mode, drops it.
  s.truncate(0);
  fuse_prefill(s, segs, scaled);
  ASSERT_TRUE(s.context_bias().active());
  s.truncate(query_begin - 1);
  EXPECT_FALSE(s.context_bias().active());
  s.truncate(0);
  fuse_prefill(s, segs, scaled);
  s.truncate(0);
  fuse_prefill(s, segs, {BlendMode::kFull});
  EXPECT_FALSE(s.context_bias().active());
}

// On a GPU an op's activation outside backend memory is staged over PCIe at
// every call: the fusion keeps all of them in alloc_buffer() memory but the
// final logits row and, at each check layer, the row of candidate scores
// the host ranks (a chunk's precompute also copies out its K and V); its
// results are those of the plain CPU backend.
TEST_F(FusorTest, ActivationsStayInBackendMemory) {
  auto owned = std::make_unique<test::CountingBackend>();
  test::CountingBackend& be = *owned;
  Session s(model(), {.n_ctx = 512, .n_threads = 2, .int8_prefill = false}, std::move(owned));
  Session plain(model(), {.n_ctx = 512, .n_threads = 2, .int8_prefill = false});
  auto segs = segments();
  BlendOptions gradual{BlendMode::kBlend, {{1, 0.5f}, {3, 0.15f}}};
  gradual.selection = Selection::kHkvd;
  const auto got = fuse_prefill(s, segs, gradual);
  EXPECT_EQ(be.host_args, 3);  // the logits and the two check layers' scores
  const auto want = fuse_prefill(plain, segs, gradual);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin(), want.end()));
  // Lookahead ranks from its reuse pass (host sums by contract): only the
  // later check layer's scores come back.
  be.host_args = 0;
  s.truncate(0);
  gradual.selection = Selection::kLookahead;
  fuse_prefill(s, segs, gradual);
  EXPECT_EQ(be.host_args, 2);
  be.host_args = 0;
  s.truncate(0);
  const cache::ChunkKV captured = precompute_chunk_kv(s, req.head, req.chunks[2]);
  // Each layer's chunk K and V leave backend memory through an op.
  EXPECT_EQ(be.host_args, 2 * model().hparams().n_layer);
  EXPECT_EQ(captured.k, kv[2].k);
  EXPECT_EQ(captured.v, kv[2].v);
}

// A GPU backend waits for each op issued outside a batch before it
// returns, and for a batch once, at its end.  A default blend request's
// compute side (a lookahead pass over every layer, then the blend's pass)
// issues each layer's ops, its chunk shift's too, as one batch; outside
// batches only the two passes' token embeddings.
TEST_F(FusorTest, ABlendRequestIsABatchALayer) {
  auto owned = std::make_unique<test::BatchWatchingBackend>();
  test::BatchWatchingBackend& be = *owned;
  Session s(model(), {.n_ctx = 512, .n_threads = 2, .int8_prefill = false}, std::move(owned));
  auto segs = segments();
  FusionStats st;
  fuse_prefill(s, segs, BlendOptions{}, &st);
  ASSERT_GT(st.final_rows.size(), 0u);
  const auto me = std::this_thread::get_id();
  int64_t unbatched = 0;
  for (const auto& [op, n] : be.unbatched(me)) {
    std::printf("outside a batch: %lld %s\n", static_cast<long long>(n), backend_op_name(op));
    unbatched += n;
  }
  const int64_t n_layer = model().hparams().n_layer;
  std::printf("batches: %lld over %lld layers\n", static_cast<long long>(be.batches(me)),
              static_cast<long long>(n_layer));
  EXPECT_LE(unbatched, 2);
  EXPECT_LE(be.batches(me), 2 * n_layer + 2);
}

// A chunk whose KV cannot be read mid-request is computed instead: the
// result equals fusing with that chunk uncached.
using test::FailingSource;

TEST_F(FusorTest, UnreadableChunkIsRecomputed) {
  FailingSource broken(*sources[1], 7);
  auto segs = segments();
  segs[2].cached = &broken;
  Session s(model(), {.n_ctx = 512, .n_threads = 2, .int8_prefill = false});
  FusionStats st;
  auto got = fuse_prefill(s, segs, {}, &st);
  std::vector<float> g(got.begin(), got.end());
  EXPECT_EQ(st.chunks_recomputed, 1);
  segs[2].cached = nullptr;
  Session s2(model(), {.n_ctx = 512, .n_threads = 2, .int8_prefill = false});
  auto want = fuse_prefill(s2, segs, {});
  EXPECT_LE(rel_l2(g, want), 1e-6);
}

constexpr Selection kAllSelections[] = {
    Selection::kHkvd,   Selection::kHkvdKv, Selection::kAttention, Selection::kLookahead,
    Selection::kRandom, Selection::kOracle, Selection::kOracleKl};

// The identities hold whatever ranks the tokens: all of them is full
// prefill, none is reuse, and the pipeline changes nothing.
TEST_F(FusorTest, EveryPolicyKeepsTheIdentities) {
  const auto f = full();
  const auto r = fused({BlendMode::kReuse, {}});
  for (Selection sel : kAllSelections) {
    SCOPED_TRACE(selection_name(sel));
    FusionStats st;
    EXPECT_LE(rel_l2(fused(blend_with(sel, {{1, 1.0f}}), &st), f), 1e-4);
    FusionStats s0;
    EXPECT_LE(rel_l2(fused(blend_with(sel, {{1, 0.0f}}), &s0), r), 1e-4);
    const BlendOptions mid = blend_with(sel, {{1, 0.3f}});
    std::vector<std::vector<float>> out;
    for (bool pipelined : {true, false}) {
      Session s(model(), {.n_ctx = 512, .n_threads = 2, .int8_prefill = false});
      auto segs = segments();
      auto l = fuse_prefill(s, segs, mid, nullptr, {.enabled = pipelined});
      out.emplace_back(l.begin(), l.end());
    }
    EXPECT_EQ(out[0], out[1]);
  }
}

// Chunk KV that is a full prefill's (each chunk computed after everything
// before it) plus an offset on every chunk after the first: per chunk,
// layer and element c, times weight(chunk, token), on K before RoPE, and
// -c/2 times it on V.
struct OffsetChunks {
  std::vector<cache::ChunkKV> kv;  // the sources borrow them
  std::vector<std::unique_ptr<cache::MemoryChunkSource>> src;
  std::vector<Segment> segments(const Request& req) const { return request_segments(req, src); }
};
OffsetChunks offset_chunks(const Request& req,
                           const std::function<float(size_t chunk, int64_t token)>& weight) {
  Session scratch(model(), {.n_ctx = 512, .n_threads = 2, .int8_prefill = false});
  OffsetChunks out;
  std::vector<int32_t> before = req.head;
  for (size_t i = 0; i < req.chunks.size(); ++i) {
    cache::ChunkKV& k = out.kv.emplace_back(precompute_chunk_kv(scratch, before, req.chunks[i]));
    before.insert(before.end(), req.chunks[i].begin(), req.chunks[i].end());
    const int64_t dim = k.shape.kv_dim();
    for (int l = 0; l < k.shape.n_layers && i > 0; ++l)
      for (int64_t t = 0; t < k.shape.n_tokens; ++t)
        for (int64_t d = 0; d < dim; ++d) {
          // Different per chunk, layer and element.
          const float c =
              (0.05f * static_cast<float>((d * 7 + l * 3 + static_cast<int64_t>(i) * 5) % 11) -
               0.25f) *
              weight(i, t);
          k.k_layer(l)[t * dim + d] += c;
          k.v_layer(l)[t * dim + d] -= 0.5f * c;
        }
  }
  for (const cache::ChunkKV& k : out.kv)
    out.src.push_back(std::make_unique<cache::MemoryChunkSource>(k));
  return out;
}

// The chunk shift undoes exactly what it models: an offset shared by a
// chunk's tokens.  Layer by layer, the recomputed tokens see exact keys and
// values below, so their fresh KV is exact and their mean correction is
// minus the offset: the blend is then a full prefill, with any policy that
// recomputes a token of every chunk, and with spans too (every span's mean
// is the chunk's).  Without the shift the offsets stay.
TEST_F(FusorTest, ChunkShiftUndoesAnOffsetSharedByAChunksTokens) {
  const OffsetChunks offset = offset_chunks(req, [](size_t, int64_t) { return 1.0f; });
  const std::vector<Segment> segs = offset.segments(req);
  const std::vector<float> f = full(KvType::kF32);
  // (Not HKVD: its V deviation is the offset here, so it spends the whole
  // count on the chunk with the larger one.)
  for (Selection sel : {Selection::kLookahead, Selection::kRandom}) {
    SCOPED_TRACE(selection_name(sel));
    double err[3];
    for (int shift : {0, 1, 2}) {
      BlendOptions o = blend_with(sel, {{first_check_layer(sel), 0.3f}});
      o.chunk_shift = shift > 0;
      o.shift_span = shift == 2 ? 16 : 0;
      Session s(model(),
                {.n_ctx = 512, .n_threads = 2, .int8_prefill = false, .kv_type = KvType::kF32});
      FusionStats st;
      auto l = fuse_prefill(s, segs, o, &st);
      err[shift] = rel_l2(std::vector<float>(l.begin(), l.end()), f);
      EXPECT_EQ(st.chunks_recomputed, 0);
      int32_t begin = static_cast<int32_t>(req.head.size() + req.chunks[0].size());
      for (size_t i = 1; i < req.chunks.size(); ++i) {
        const int32_t end = begin + static_cast<int32_t>(req.chunks[i].size());
        EXPECT_TRUE(std::any_of(st.final_rows.begin(), st.final_rows.end(),
                                [&](int32_t p) { return p >= begin && p < end; }))
            << "chunk " << i << " has a recomputed token";
        begin = end;
      }
    }
    std::printf(
        "%s: offset chunk KV against full prefill, rel L2 %.2e without the shift, %.2e "
        "with it, %.2e with spans\n",
        selection_name(sel), err[0], err[1], err[2]);
    EXPECT_LE(err[1], 1e-4);
    EXPECT_LE(err[2], 1e-4);
    EXPECT_GT(err[0], 100.0 * err[1]);
  }
}

// A policy picks tokens for what they matter to the answer, and their
// corrections need not be those of the tokens it leaves.  Here the tokens a
// random pick chose carry an extra offset the others lack: the mean over
// every recomputed token then misses the others' correction, the mean over
// the evenly spread probes finds it.
TEST_F(FusorTest, ShiftProbesMeasureTheCorrectionOfTheTokensLeft) {
  std::vector<int32_t> begins;
  int32_t at = static_cast<int32_t>(req.head.size());
  for (const std::vector<int32_t>& chunk : req.chunks) {
    begins.push_back(at);
    at += static_cast<int32_t>(chunk.size());
  }
  // The tokens in `extra` are off by twice as much as the others.
  auto offset_sources = [&](const std::set<int32_t>& extra) {
    return offset_chunks(req, [&](size_t i, int64_t t) {
      return extra.count(begins[i] + static_cast<int32_t>(t)) ? 2.0f : 1.0f;
    });
  };
  auto blend = [&](const OffsetChunks& src, float probes, FusionStats* st) {
    BlendOptions o = blend_with(Selection::kRandom, {{0, 0.3f}});
    o.shift_probes = probes;
    Session s(model(),
              {.n_ctx = 512, .n_threads = 2, .int8_prefill = false, .kv_type = KvType::kF32});
    auto l = fuse_prefill(s, src.segments(req), o, st);
    return std::vector<float>(l.begin(), l.end());
  };
  const std::vector<float> f = full(KvType::kF32);
  // The random pick does not depend on the KV, nor do the probes: a first
  // run finds which tokens they are.
  FusionStats first;
  blend(offset_sources({}), 0.25f, &first);
  ASSERT_FALSE(first.probe_rows.empty());
  std::set<int32_t> picked(first.final_rows.begin(), first.final_rows.end());
  for (int32_t p : first.probe_rows) {
    EXPECT_TRUE(picked.count(p)) << "probe " << p << " is recomputed";
    picked.erase(p);
  }
  const auto src = offset_sources(picked);
  FusionStats with_probes, without;
  const double err_probes = rel_l2(blend(src, 0.25f, &with_probes), f);
  const double err_all = rel_l2(blend(src, 0.0f, &without), f);
  EXPECT_EQ(with_probes.final_rows, first.final_rows);
  EXPECT_EQ(with_probes.probe_rows, first.probe_rows);
  EXPECT_TRUE(without.probe_rows.empty());
  std::printf("extra offset on the picked tokens: rel L2 %.2e with probes, %.2e without\n",
              err_probes, err_all);
  EXPECT_LE(err_probes, 1e-4);
  EXPECT_GT(err_all, 100.0 * err_probes);
}

// What a chunk lacks drifts along it: here its offset grows from half to
// one and a half times c over the chunk.  One mean for the chunk leaves
// its ends off by up to half the offset; half the chunk's mean and half
// each span's leave less.  A span as long as the chunk is the chunk's mean
// bitwise, and spans keep the identities.
TEST_F(FusorTest, ShiftSpansFollowACorrectionThatDriftsAlongAChunk) {
  const OffsetChunks drift = offset_chunks(req, [&](size_t i, int64_t t) {
    return 0.5f + static_cast<float>(t) / static_cast<float>(req.chunks[i].size());
  });
  const std::vector<float> f = full(KvType::kF32);
  auto blend = [&](int64_t span, float ratio, const PipelineOptions& p = {}) {
    BlendOptions o = blend_with(Selection::kLookahead, {{0, ratio}});
    o.shift_probes = 1.0f;
    o.shift_span = span;
    Session s(model(),
              {.n_ctx = 512, .n_threads = 2, .int8_prefill = false, .kv_type = KvType::kF32});
    auto l = fuse_prefill(s, drift.segments(req), o, nullptr, p);
    return std::vector<float>(l.begin(), l.end());
  };
  const double err_reuse = rel_l2(blend(0, 0.0f), f);
  const std::vector<float> chunk_mean = blend(0, 0.3f);
  const double err_chunk = rel_l2(chunk_mean, f), err_spans = rel_l2(blend(16, 0.3f), f);
  std::printf("drifting offset: rel L2 %.2e reused, %.2e chunk mean, %.2e with spans\n", err_reuse,
              err_chunk, err_spans);
  EXPECT_LT(err_chunk, err_reuse);
  EXPECT_LT(err_spans, 0.8 * err_chunk);
  EXPECT_EQ(blend(1000, 0.3f), chunk_mean);
  EXPECT_LE(rel_l2(blend(16, 1.0f), full(KvType::kF32)), 1e-4);
  EXPECT_LE(rel_l2(blend(16, 0.0f), blend(0, 0.0f)), 1e-4);
  EXPECT_EQ(blend(16, 0.3f, {.enabled = false}), blend(16, 0.3f)) << "pipelined equals serial";
}

// A GPU pays for every op, so a layer's chunk shift is the same few ops
// however many chunks it moves: its ops (a blend's with the shift less the
// same blend's without) for two shifted chunks cut in spans are those for
// one, and at most 40 a layer.
TEST_F(FusorTest, ChunkShiftIsAFewOpsPerLayerWhateverTheChunkCount) {
  struct OpCounter : test::CountingBackend {
    std::atomic<int64_t> ops{0};  // the loader thread's ops too
    void before_op(BackendOp) override { ++ops; }
  };
  auto shift_ops = [&](const std::vector<Segment>& segs) {
    int64_t ops[2];
    for (const bool shift : {false, true}) {
      auto owned = std::make_unique<OpCounter>();
      OpCounter& be = *owned;
      Session s(model(), {.n_ctx = 512, .n_threads = 2, .int8_prefill = false}, std::move(owned));
      // Random picks and no probes: the same rows with and without the shift.
      BlendOptions o = blend_with(Selection::kRandom, {{0, 0.3f}});
      o.chunk_shift = shift;
      o.shift_probes = 0.0f;
      o.shift_span = 16;
      fuse_prefill(s, segs, o);
      ops[shift] = be.ops;
    }
    return ops[1] - ops[0];
  };
  std::vector<Segment> segs = segments();  // head, 3 chunks (the first exact), question
  const int64_t two = shift_ops(segs);
  segs.erase(segs.begin() + 3);
  const int64_t one = shift_ops(segs);
  const int64_t n_layer = model().hparams().n_layer;
  std::printf("chunk shift: %lld ops for two chunks, %lld for one, over %lld layers\n",
              static_cast<long long>(two), static_cast<long long>(one),
              static_cast<long long>(n_layer));
  EXPECT_GT(one, 0);
  EXPECT_EQ(two, one);
  EXPECT_LE(two, 40 * n_layer);
}

// The first chunk follows exactly the head it was computed after: its KV is
// exact, so no policy spends the ratio on it.
TEST_F(FusorTest, ExactLeadingChunkIsNeverRecomputed) {
  const int64_t first = static_cast<int64_t>(req.head.size());
  const int64_t len = static_cast<int64_t>(req.chunks[0].size());
  for (Selection sel : kAllSelections) {
    SCOPED_TRACE(selection_name(sel));
    FusionStats st;
    fused(blend_with(sel, {{1, 0.3f}}), &st);
    for (int32_t p : st.final_rows) EXPECT_FALSE(p >= first && p < first + len) << p;
    // The count is the ratio of every reused token, spent elsewhere.  After
    // the lookahead's reuse pass the head is not computed again.
    const int64_t uncached =
        static_cast<int64_t>(req.suffix.size()) +
        (sel == Selection::kLookahead ? 0 : static_cast<int64_t>(req.head.size()));
    EXPECT_EQ(static_cast<int64_t>(st.final_rows.size()),
              uncached + std::llround(0.3 * static_cast<double>(st.n_reused)));
  }
}

TEST_F(FusorTest, LookaheadCountsItsReusePass) {
  FusionStats hk, look;
  fused(blend_with(Selection::kHkvd, {{1, 0.15f}}), &hk);
  fused(blend_with(Selection::kLookahead, {{1, 0.15f}}), &look);
  const int64_t n_head = static_cast<int64_t>(req.head.size());
  const int64_t n_suffix = static_cast<int64_t>(req.suffix.size());
  // The blend pass keeps as many rows as HKVD's but the head, which the
  // reuse pass computed.
  EXPECT_EQ(look.final_rows.size() + req.head.size(), hk.final_rows.size());
  // Layer 0 (before the check) carries every row from the first chunk that
  // is not exact on; every layer also ran the reuse pass's head and
  // question, so the layers after the check hold the question twice.
  const int64_t first_inexact = n_head + static_cast<int64_t>(req.chunks[0].size());
  EXPECT_EQ(look.rows_per_layer[0], look.n_tokens - first_inexact + n_head + n_suffix);
  for (size_t l = 1; l < hk.rows_per_layer.size(); ++l)
    EXPECT_EQ(look.rows_per_layer[l], hk.rows_per_layer[l] + n_suffix) << l;
}

// Rows before the first inexact chunk (the head, the exact leading chunk)
// attend only to each other: after the lookahead's reuse pass their KV is
// final, at every layer, and the blend pass leaves it alone.
TEST_F(FusorTest, HeadKvAfterLookaheadIsFullPrefills) {
  // f32 caches: with f16 an element a few ulps off may round the other way.
  Session f(model(),
            {.n_ctx = 512, .n_threads = 2, .int8_prefill = false, .kv_type = KvType::kF32});
  f.prefill(req.all());
  Session s(model(),
            {.n_ctx = 512, .n_threads = 2, .int8_prefill = false, .kv_type = KvType::kF32});
  auto segs = segments();
  FusionStats st;
  fuse_prefill(s, segs, blend_with(Selection::kLookahead, {{0, 0.2f}}), &st);
  ASSERT_FALSE(st.final_rows.empty());
  ASSERT_GT(st.final_rows.front(), static_cast<int32_t>(req.head.size()));
  const int64_t kv_dim = model().hparams().kv_dim(), n = static_cast<int64_t>(req.head.size());
  for (int64_t l = 0; l < model().hparams().n_layer; ++l) {
    std::vector<float> k(static_cast<size_t>(n * kv_dim)), v(k.size()), fk(k.size()), fv(k.size());
    s.read_kv_rows(l, false, 0, n, k.data());
    s.read_kv_rows(l, true, 0, n, v.data());
    f.read_kv_rows(l, false, 0, n, fk.data());
    f.read_kv_rows(l, true, 0, n, fv.data());
    EXPECT_LE(rel_l2(k, fk), 1e-5) << l;
    EXPECT_LE(rel_l2(v, fv), 1e-5) << l;
  }
}

// Where the reuse pass and the recompute would cost more than a full
// prefill (a question as long as the chunks), lookahead ranks by HKVD in
// one pass instead, from layer 1.
TEST_F(FusorTest, CostlyLookaheadFallsBackToHkvd) {
  req.suffix.clear();
  for (int i = 0; i < 12; ++i) {
    const auto q = tok("Where did the person Ada worked with live, and when? ");
    req.suffix.insert(req.suffix.end(), q.begin(), q.end());
  }
  FusionStats look, hkvd;
  const auto a = fused(blend_with(Selection::kLookahead, {{0, 0.2f}}), &look);
  const auto b = fused(blend_with(Selection::kHkvd, {{1, 0.2f}}), &hkvd);
  EXPECT_EQ(a, b);
  EXPECT_EQ(look.rows_per_layer, hkvd.rows_per_layer);
  EXPECT_LT(look.computed_fraction(), 1.0);
}

TEST_F(FusorTest, RandomSelectionFollowsItsSeed) {
  auto pick = [&](uint64_t seed) {
    BlendOptions o = blend_with(Selection::kRandom, {{1, 0.2f}});
    o.seed = seed;
    FusionStats st;
    fused(o, &st);
    return st.final_rows;
  };
  EXPECT_EQ(pick(1), pick(1));
  EXPECT_NE(pick(1), pick(2));
}

TEST_F(FusorTest, SinkTokensOfEveryInexactChunkAreRecomputed) {
  BlendOptions o = blend_with(Selection::kHkvd, {{1, 0.0f}});
  o.sink_tokens = 2;
  FusionStats st;
  fused(o, &st);
  int64_t pos = static_cast<int64_t>(req.head.size() + req.chunks[0].size());
  std::vector<int32_t> want;
  for (int64_t p = 0; p < static_cast<int64_t>(req.head.size()); ++p) want.push_back(p);
  for (size_t c = 1; c < req.chunks.size(); ++c) {
    want.push_back(static_cast<int32_t>(pos));
    want.push_back(static_cast<int32_t>(pos + 1));
    pos += static_cast<int64_t>(req.chunks[c].size());
  }
  for (int64_t p = pos; p < st.n_tokens; ++p) want.push_back(static_cast<int32_t>(p));
  EXPECT_EQ(st.final_rows, want);
}

TEST_F(FusorTest, GuardRaisesTheRatioUntilTheShareIsHeld) {
  BlendOptions o = blend_with(Selection::kHkvd, {{1, 0.05f}});
  FusionStats plain;
  fused(o, &plain);
  EXPECT_FALSE(plain.guard_raised);
  EXPECT_GT(plain.selected_share, 0.0);
  EXPECT_LT(plain.selected_share, 1.0);
  o.guard_share = 0.99f;  // beyond what 5 % of the tokens hold
  o.guard_max_ratio = 0.4f;
  FusionStats raised;
  fused(o, &raised);
  EXPECT_TRUE(raised.guard_raised);
  EXPECT_GT(raised.selected_share, plain.selected_share);
  EXPECT_GT(raised.final_rows.size(), plain.final_rows.size());
  const int64_t uncached = static_cast<int64_t>(req.head.size() + req.suffix.size());
  EXPECT_LE(static_cast<int64_t>(raised.final_rows.size()),
            uncached + std::llround(0.4 * static_cast<double>(raised.n_reused)));
  EXPECT_GT(raised.ratio, 0.05);
  // A share already held leaves the count alone.
  o.guard_share = static_cast<float>(plain.selected_share) * 0.5f;
  FusionStats held;
  fused(o, &held);
  EXPECT_FALSE(held.guard_raised);
  EXPECT_EQ(held.final_rows, plain.final_rows);
}

TEST_F(FusorTest, BadRequestsAreClearErrors) {
  Session s(model(), {.n_ctx = 64, .n_threads = 1, .int8_prefill = false});
  auto segs = segments();
  EXPECT_THROW(fuse_prefill(s, {}, {}), Error);
  try {
    fuse_prefill(s, segs, {});  // ~80 tokens into a 64-token context
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kContextOverflow);
  }
  Session big(model(), {.n_ctx = 512, .n_threads = 1, .int8_prefill = false});
  for (BlendOptions bad :
       {BlendOptions{BlendMode::kBlend, {{1, 1.5f}}}, BlendOptions{BlendMode::kBlend, {{1, -0.1f}}},
        BlendOptions{BlendMode::kBlend, {{model().hparams().n_layer, 0.1f}}},
        BlendOptions{BlendMode::kBlend, {{3, 0.1f}, {1, 0.05f}}},
        BlendOptions{BlendMode::kBlend, {{1, 0.1f}, {3, 0.2f}}},
        BlendOptions{BlendMode::kBlend, {}}}) {
    EXPECT_THROW(fuse_prefill(big, segs, bad), Error);
    EXPECT_EQ(big.n_past(), 0);
  }
  Session small(model(), {.n_ctx = 8, .n_threads = 1, .int8_prefill = false});
  EXPECT_THROW(precompute_chunk_kv(small, req.head, req.chunks[0]),
               Error);  // chunk over the context
}

// HKVD selection is the backend's top_k (on the CPU, top_k_indices).
std::vector<int32_t> select_hkvd_tokens(const std::vector<float>& d, int64_t k) {
  std::vector<int32_t> top(static_cast<size_t>(k));
  make_cpu_backend(1)->top_k(d.data(), static_cast<int64_t>(d.size()), k, top.data());
  return top;
}

TEST(ChooseTokens, KeepsTheBestAndRaisesToTheGuardsShare) {
  const std::vector<float> d = {0.5f, 3.0f, 1.0f, 3.0f, 0.0f, 2.0f, 3.0f};  // total 12.5
  TokenChoice c = choose_tokens(d, 2);
  EXPECT_EQ(c.chosen, (std::vector<int32_t>{1, 3}));  // ties: the lower index
  EXPECT_DOUBLE_EQ(c.share, 6.0 / 12.5);
  EXPECT_FALSE(c.raised);
  c = choose_tokens(d, 2, 0.7, 5);  // 3+3+3 = 9 >= 0.7 x 12.5
  EXPECT_EQ(c.chosen, (std::vector<int32_t>{1, 3, 6}));
  EXPECT_TRUE(c.raised);
  c = choose_tokens(d, 2, 0.99, 4);  // capped at 4
  EXPECT_EQ(c.chosen, (std::vector<int32_t>{1, 3, 5, 6}));
  EXPECT_DOUBLE_EQ(c.share, 11.0 / 12.5);
  EXPECT_EQ(choose_tokens(d, 7).share, 1.0);
  EXPECT_EQ(choose_tokens(std::vector<float>(4, 0.0f), 1).share, 1.0);
  const std::vector<float> odd = {NAN, 1.0f, INFINITY, -2.0f};
  EXPECT_EQ(choose_tokens(odd, 2).chosen, (std::vector<int32_t>{1, 2}));
  EXPECT_THROW(choose_tokens(d, 8), Error);
}

TEST(Hkvd, PicksExactlyTheKLargestWithDeterministicTies) {
  std::vector<float> d = {0.5f, 3.0f, 1.0f, 3.0f, 0.0f, 2.0f, 3.0f};
  EXPECT_EQ(select_hkvd_tokens(d, 2), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(select_hkvd_tokens(d, 3), (std::vector<int32_t>{1, 3, 6}));
  EXPECT_EQ(select_hkvd_tokens(d, 4), (std::vector<int32_t>{1, 3, 5, 6}));
  EXPECT_EQ(select_hkvd_tokens(d, 0), (std::vector<int32_t>{}));
  EXPECT_EQ(select_hkvd_tokens(d, 7).size(), d.size());
  EXPECT_THROW(select_hkvd_tokens(d, 8), Error);
  std::mt19937 rng(5);
  std::vector<float> r(1000);
  for (float& v : r) v = static_cast<float>(rng() % 50);
  auto top = select_hkvd_tokens(r, 100);
  float min_in = 1e9f;
  for (int32_t i : top) min_in = std::min(min_in, r[i]);
  int64_t larger_outside = 0;
  for (size_t i = 0; i < r.size(); ++i)
    if (!std::binary_search(top.begin(), top.end(), static_cast<int32_t>(i)) && r[i] > min_in)
      ++larger_outside;
  EXPECT_EQ(larger_outside, 0);
}

}  // namespace
}  // namespace cb
