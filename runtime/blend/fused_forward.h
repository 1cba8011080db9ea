// The fused prefill.  Each layer runs in two steps over the rows R carried at
// that layer (global positions, ascending):
//   1. norm and Q/K/V projections of R;
//   2. RoPE, K/V written to the cache at R's positions, attention of R's
//      queries over all n keys (causal by global position), output
//      projection and FFN of R.
// Before step 1 every cached chunk's KV of the layer is in the cache (K
// rotated to its global position), so rows outside R attend and are attended
// with their cached KV; the layer pipeline loads it, ahead of time when it
// runs on its own thread.  At a check layer, between the steps, the
// fresh V of R's reused rows is compared with the cached V, and R narrows to
// the best-ranked ones (the policy's score, selection.h) plus every uncached
// row.  A policy whose ranking is known before the pass (lookahead, random,
// oracle) narrows R before step 1 of its check layer instead.
//
// One pass of one attempt: fuse_prefill (fusor.cpp) sets the rows, flags
// and options, runs it, and runs it again without a chunk that failed to
// load.  Internal to runtime/blend.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cache/chunk_kv.h"
#include "kernels/backend.h"
#include "runtime/blend/blend_options.h"
#include "runtime/blend/layer_pipeline.h"
#include "runtime/graph.h"
#include "runtime/session.h"

namespace cb {

// Floats in backend memory (alloc_buffer), so that a GPU backend computes on
// them in place: host vectors would be staged over PCIe at every op.  The
// host never touches them: what it needs comes back through ops
// (copy_to_host).
class BackendFloats {
 public:
  explicit BackendFloats(Backend& be) : p_(nullptr, Free{&be}) {}
  float* data() { return static_cast<float*>(p_.get()); }
  // At least n floats.  Growing does not keep the contents: every caller
  // overwrites them.
  void reserve(size_t n) {
    if (n <= capacity_) return;
    p_.reset();  // before the new one: peak memory
    capacity_ = 0;
    p_.reset(p_.get_deleter().be->alloc_buffer(n * sizeof(float)));
    capacity_ = n;
  }

 private:
  struct Free {
    Backend* be;
    void operator()(void* p) const { be->free_buffer(p); }
  };
  std::unique_ptr<void, Free> p_;
  size_t capacity_ = 0;
};

// One fused forward over a request of n tokens in session s.
class FusedForward {
 public:
  FusedForward(Session& s, std::span<const int32_t> tokens)
      : s_(s),
        hp_(s.model().hparams()),
        be_(s.backend()),
        tokens_(tokens),
        n_(static_cast<int64_t>(tokens.size())) {}

  // Rows computed at layer 0 (ascending positions).
  std::vector<int32_t> rows;
  // The cached chunks this pass loads, in position order.
  std::vector<CachedChunkRef> cached;
  // Every reused chunk, loaded by this pass or an earlier one (only begin
  // and len are read), and whether the blend shifts their tokens that are
  // not recomputed (BlendOptions::chunk_shift).
  std::vector<CachedChunkRef> chunks;
  bool chunk_shift = false;
  // BlendOptions::shift_probes, and per position whether the token is a
  // probe (set by the first check).
  float shift_probes = 0.0f;
  std::vector<uint8_t> probe;
  int64_t shift_span = 0;  // BlendOptions::shift_span
  PipelineOptions pipeline;
  std::vector<uint8_t> is_cached;  // per position
  // Check-layer schedule (blend only) and the count the ratios refer to.
  std::vector<CheckLayer> schedule;
  int64_t n_reused = 0;
  // How the first check ranks the candidates; `prior` (per position), when
  // set, holds the scores a pass before this one measured.
  Selection selection = Selection::kHkvd;
  std::vector<float> prior;
  std::vector<uint8_t> keep_always;  // per position: computed at every layer
  std::vector<uint8_t> exact;        // per position: cached KV that is exact, never recomputed
  int32_t query_begin = 0;           // the question's rows are those at or after it
  float guard_share = 0.0f, guard_max_ratio = 0.0f;
  // When set (n_layer x n floats), each layer adds what every position
  // contributes to the question's attention output (attention weight times
  // value norm, Backend::attention_contributions).
  std::vector<float>* attention_by_layer = nullptr;
  // After the first check: the chosen tokens' share of the policy's total
  // score, whether the guard added tokens, and the factor it scaled the
  // schedule's counts by.
  double selected_share = 1.0;
  bool guard_raised = false;
  double ratio_scale = 1.0;
  // When set, the chunk rows [capture_begin, n) of K before RoPE and of V
  // are copied here for every layer.
  cache::ChunkKV* capture = nullptr;
  int32_t capture_begin = 0;
  // What this pass's layers count in the session's progress report: layer
  // l reports progress_first + l + 1 of progress_total (0: n_layer).
  ProgressStage progress_stage = ProgressStage::kBlend;
  int64_t progress_first = 0, progress_total = 0;
  std::vector<int64_t> rows_per_layer;
  std::vector<double> layer_ms;  // compute time per layer, load waits excluded
  PipelineLoadStats load_stats;  // after run()

  // Runs all layers; returns false if a cached chunk could not be read (its
  // index is in failed_chunk) so the caller can retry without it.
  bool run(bool want_logits);
  size_t failed_chunk = 0;

 private:
  bool layers(LayerPipeline& loads, bool want_logits);
  void project(int64_t layer);  // step 1
  // Check layer: narrows the rows to the kept ones.  `projected`: step 1 has
  // run, so Q/K/V narrow too (and fresh KV may be measured).
  void select(int64_t layer, float ratio, bool first, bool projected);
  // The k best of the candidate rows `cand` (indices into rows) by the
  // policy's score, marked in `chosen`; sets the guard's stats when first.
  void choose(int64_t layer, bool first, const std::vector<int32_t>& cand, int64_t k,
              std::vector<uint8_t>& chosen);
  // Step 2.  Every carried row's K/V goes into the cache (and the
  // question's contributions are taken); attention and FFN then run for
  // the rows from `out_begin` (an index into rows) on: at the last layer
  // only the logits' row, or none, is read.
  void attend_and_ffn(int64_t layer, int64_t out_begin);
  // BlendOptions::chunk_shift at `layer`, before the carried rows' K/V go
  // into the cache (the cache still holds their reused KV there).
  void shift_chunks(int64_t layer);
  struct ShiftPlan;
  ShiftPlan plan_shift() const;
  void run_graph(Graph& g);
  void resize_buffers();
  const LayerWeights& weights(int64_t layer) const;  // the session's, prepared
  // Candidate scores of the check layer `layer`, into host memory.
  void deviation(int64_t layer, std::span<const int32_t> cand, std::span<const int32_t> cand_pos,
                 bool with_k, std::vector<float>& score);
  void question_attention(int64_t layer, std::span<const int32_t> cand_pos,
                          std::vector<float>& score);
  AttentionArgs question_rows(const float* q, const int32_t* pos, int64_t n_q, int64_t layer);

  Session& s_;
  const LlamaHparams& hp_;
  Backend& be_;
  std::span<const int32_t> tokens_;
  int64_t n_;
  // rows.size() x dim each; scratch_ is narrow()'s destination.
  BackendFloats x_{be_}, q_{be_}, k_{be_}, v_{be_}, scratch_{be_};
  // select()'s fresh and cached rows and deviations
  BackendFloats fresh_{be_}, old_{be_}, dev_{be_};
  // shift_chunks()'s corrections (per span, then per chunk) and scratch
  BackendFloats corr_{be_}, shift_scratch_{be_};
  BackendFloats arena_{be_};
};

}  // namespace cb
