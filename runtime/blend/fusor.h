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
#include "runtime/blend/blend_options.h"
#include "runtime/session.h"

namespace cb {

// Where one chunk's cached KV comes from, a layer at a time (the chunk store
// and the in-memory table implement it).
class ChunkLayerSource {
 public:
  virtual ~ChunkLayerSource() = default;
  // Writes layer `layer`'s K (before RoPE) and V, n_tokens x kv_dim floats
  // each.  Returns false if they cannot be read (corrupt, evicted): the
  // fusor then computes the chunk instead.
  virtual bool fetch_layer(int64_t layer, float* k, float* v) = 0;
};

// A ChunkLayerSource over KV held in memory.
class MemoryChunkSource final : public ChunkLayerSource {
 public:
  explicit MemoryChunkSource(const cache::ChunkKV& kv) : kv_(kv) {}
  bool fetch_layer(int64_t layer, float* k, float* v) override;

 private:
  const cache::ChunkKV& kv_;
};

struct Segment {
  std::span<const int32_t> tokens;
  ChunkLayerSource* cached = nullptr;  // null: no cached KV
  // True when the cached KV was computed after exactly the tokens that
  // precede this segment in the request (so reusing it is exact); prefix
  // mode reuses only such a leading segment.
  bool exact_prefix = false;
};

struct FusionStats {
  int64_t n_tokens = 0;
  int64_t n_reused = 0;                 // tokens whose cached KV was used
  std::vector<int64_t> rows_per_layer;  // tokens computed at each layer
  std::vector<int32_t> final_rows;      // positions computed at the last layer
  int64_t chunks_recomputed = 0;        // cached chunks that could not be read
  double compute_ms = 0.0;
  // Fraction of a full prefill's per-layer row work that was done.
  double computed_fraction() const;
};

// Fills the empty session `s` with the fused KV of the request and returns
// the last token's logits; afterwards s.n_past() is the request length and
// decoding continues as after a normal prefill.  Throws cb::Error:
// kInvalidArgument (no segments, empty request, bad options, session not
// empty, chunk KV of the wrong shape), kContextOverflow (request longer than
// the session's context).
std::span<const float> fuse_prefill(Session& s, std::span<const Segment> segments,
                                    const BlendOptions& opts, FusionStats* stats = nullptr);

// A chunk's KV: prefill of head + chunk in the empty session `scratch`
// (left empty again), keeping the chunk's rows of K before RoPE and of V.
cache::ChunkKV precompute_chunk_kv(Session& scratch, std::span<const int32_t> head,
                                   std::span<const int32_t> chunk);

}  // namespace cb
