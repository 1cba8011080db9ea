// The CacheBlend fusor: builds a request's KV cache from the cached KV of its
// chunks, recomputing only a selected set of tokens per layer.
//
// A request is a list of segments (prompt head, chunks, suffix) whose tokens
// concatenate to the request's tokens.  A segment with a ChunkLayerSource has
// cached KV (K before RoPE, V) for each layer; the others are computed.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cache/chunk_kv.h"
#include "cache/chunk_source.h"
#include "runtime/blend/blend_options.h"
#include "runtime/blend/layer_pipeline.h"
#include "runtime/session.h"

namespace cb {

struct Segment {
  std::span<const int32_t> tokens;
  cache::ChunkLayerSource* cached = nullptr;  // null: no cached KV
  // True when the cached KV was computed after exactly the tokens that
  // precede this segment in the request (so reusing it is exact); prefix
  // mode reuses only such a leading segment.
  bool exact_prefix = false;
  // The cached chunk's copy in the session's backend memory, if it has one
  // (Session::resident_chunks(); CachedChunkRef::resident).
  ResidentChunk* resident = nullptr;
};

struct FusionStats {
  int64_t n_tokens = 0;
  int64_t n_reused = 0;                 // tokens whose cached KV was used
  std::vector<int64_t> rows_per_layer;  // tokens computed at each layer
  std::vector<int32_t> final_rows;      // positions computed at the last layer
  std::vector<int32_t> probe_rows;      // the chunk shift's probes (BlendOptions::shift_probes)
  int64_t chunks_recomputed = 0;        // cached chunks that could not be read
  // The fusion's wall time, loads and restarts included: its share of TTFT.
  // (Named before the pipeline existed; recompute_ms is the compute alone.)
  double compute_ms = 0.0;
  // Ratio of the last check layer (1 in full mode, 0 in reuse and prefix);
  // raised when the quality guard raised the first check's count.
  double ratio = 0.0;
  // Blend: the share of the selection policy's total score that the
  // tokens kept at the first check hold (1 when all are kept), and whether
  // the quality guard added tokens.
  double selected_share = 0.0;
  bool guard_raised = false;
  bool pipelined = false;
  // Over every attempt of the request (a restart after a failed chunk
  // loads again):
  uint64_t bytes_read = 0;  // stored bytes of cached layers loaded
  // Bytes of cached layers copied from resident chunks instead (their
  // K as f32, their V as the cache holds it).
  uint64_t resident_bytes = 0;
  // The loader's busy time, load_ms: read + decode + RoPE of cached K; of
  // it fetch_ms is the read + decode (fetch_layer), summed over the fetch
  // threads (PipelineOptions::fetch_threads).
  double load_ms = 0.0;
  double fetch_ms = 0.0;
  // GPU time of the staged copies of loaded layers to the backend's KV cache
  // (Backend::wants_staged_uploads; 0 otherwise).  The copies run beside
  // the loader's work, so this is not part of load_ms.
  double upload_ms = 0.0;
  double blocked_ms = 0.0;    // the compute side waiting for loads (serial: all of load_ms)
  double recompute_ms = 0.0;  // computing layers, waits excluded
  // Compute time of each layer of the successful attempt (waits excluded),
  // for refreshing the compute cost model.
  std::vector<double> layer_ms;
  // Fraction of a full prefill's per-layer row work that was done, every
  // pass of the request included (the lookahead policy's reuse pass; not
  // the oracle's, which is a study bound).
  double computed_fraction() const;
};

// Fills the empty session `s` with the fused KV of the request and returns
// the last token's logits; afterwards s.n_past() is the request length and
// decoding continues as after a normal prefill.  Throws cb::Error:
// kInvalidArgument (no segments, empty request, bad options, session not
// empty, chunk KV of the wrong shape), kContextOverflow (request longer than
// the session's context).
std::span<const float> fuse_prefill(Session& s, std::span<const Segment> segments,
                                    const BlendOptions& opts, FusionStats* stats = nullptr,
                                    const PipelineOptions& pipeline = {});

// The shape of the KV of an n_tokens chunk under `model`: what a stored
// chunk must have to be used (ChunkStore::find).
cache::KvShape chunk_kv_shape(const Model& model, size_t n_tokens);

// A chunk's KV: prefill of head + chunk in the empty session `scratch`
// (left empty again), keeping the chunk's rows of K before RoPE and of V.
cache::ChunkKV precompute_chunk_kv(Session& scratch, std::span<const int32_t> head,
                                   std::span<const int32_t> chunk);

}  // namespace cb
