// The Llama decoder block, written once.  Every forward pass of the runtime
// builds its layers from these pieces: a session's prefill and decode
// (session.cpp), the CacheBlend fusor (blend/fusor.cpp) and the layer bench
// (bench/layer_bench.cpp).  A variant of the block (another architecture's
// norms, biases or RoPE style) is a change here that every pass follows.
//
// One layer over rows x of the residual stream at positions pos:
//   h = rmsnorm(x)                                   attention_input
//   q, k, v = Wq h + bq, Wk h + bk, Wv h + bv        project_q, _k, _v
//     (the biases where the architecture has them: qwen2; qwen3 and gemma3
//     then normalise each head of q and k, rmsnorm with its own weights)
//   q, k rotated to their positions                  rope_q, rope_k
//     (with the layer's RoPE base: gemma3's local layers have their own)
//   a = attention of q over the layer's KV cache     attention
//     (a local layer's queries see only the last sliding_window keys)
//   x += post(Wo a)                                  attention_output
//   x += post(Wdown (act(Wgate h2) * Wup h2)),  h2 = rmsnorm(x)    ffn
//     (act: silu, or GELU for gemma3; post: gemma3's output norms, else
//     nothing)
// Split where callers work between the pieces: the session keeps only the
// last row's query at the last layer, the fusor narrows its rows between
// the projections and the attention, the bench times each piece.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "runtime/graph.h"
#include "runtime/model.h"

namespace cb {

class LlamaLayer {
 public:
  // Adds the pieces to `g`; `mm` is the precision of every weight product
  // (decode's int8 activations or f32).
  LlamaLayer(Graph& g, const LlamaHparams& hp, const LayerWeights& w, int64_t layer,
             Graph::Precision mm = Graph::Precision::kF32)
      : g_(g), hp_(hp), w_(w), layer_(layer), mm_(mm) {}

  TensorId attention_input(TensorId x);
  // The projections of the normed rows h, into `out` (a tensor of h's rows)
  // when one is given, else into a new tensor; returns where they are.
  TensorId project_q(TensorId h, TensorId out = kNewTensor);
  TensorId project_k(TensorId h, TensorId out = kNewTensor);
  TensorId project_v(TensorId h, TensorId out = kNewTensor);
  // In place: rows of q (k) rotated to the positions pos[0..rows).
  void rope_q(TensorId q, const int32_t* pos);
  void rope_k(TensorId k, const int32_t* pos);
  // The queries q at positions q_pos over the first n_kv rows of the
  // layer's caches (K rotated), causal by position, the logits biased by
  // key_bias (the session's Session::context_bias).
  TensorId attention(TensorId q, const int32_t* q_pos, TensorId k_cache, TensorId v_cache,
                     int64_t n_kv, const KeyBlockBias& key_bias = {});
  void attention_output(TensorId x, TensorId a);  // x += Wo a
  void ffn(TensorId x);                           // x += the feed-forward of rmsnorm(x)

  static constexpr TensorId kNewTensor = -1;

 private:
  TensorId project(const WeightView& w, const float* bias, const float* head_norm, TensorId h,
                   TensorId out);
  // x += rmsnorm(branch, post_norm) (Gemma 2 and 3's output norms; without
  // one, a branch's last product adds itself to x).
  void add_branch(TensorId x, TensorId branch, const float* post_norm);

  Graph& g_;
  const LlamaHparams& hp_;
  const LayerWeights& w_;
  int64_t layer_;
  Graph::Precision mm_;
};

// The residual stream's first rows: the embeddings of tokens ids[0..n),
// scaled as the architecture does.  In a graph, and into backend memory
// outside one.
TensorId add_embeddings(Graph& g, const LlamaHparams& hp, const WeightView& tok_embd,
                        const int32_t* ids, int64_t n);
void embed_tokens(Backend& be, const LlamaHparams& hp, const WeightView& tok_embd,
                  const int32_t* ids, int64_t n, float* out);

// After the last layer: the logits (a 1 x n_vocab tensor) of the single row x.
void add_output_head(Graph& g, const LlamaHparams& hp, const float* output_norm,
                     const WeightView& output, TensorId x, TensorId logits,
                     Graph::Precision mm = Graph::Precision::kF32);

// The rotations of rope_k / rope_q of `layer` (whose weights, prepared by
// `be`, are `w`) on rows in backend memory, outside a graph: cached chunk K
// placed at its positions in the request, fresh rows compared with cached
// ones.  Bitwise the same as the graph's.
void rope_keys(Backend& be, const LlamaHparams& hp, int64_t layer, const LayerWeights& w, float* k,
               const int32_t* pos, int64_t n);
void rope_queries(Backend& be, const LlamaHparams& hp, int64_t layer, const LayerWeights& w,
                  float* q, const int32_t* pos, int64_t n);

// The attention of LlamaLayer::attention of `layer` as Backend arguments,
// for callers that call the backend directly (out is left for the caller).
AttentionArgs attention_args(const LlamaHparams& hp, int64_t layer, const float* q,
                             const int32_t* q_pos, int64_t n_q, const void* k_cache,
                             const void* v_cache, DType kv_type, int64_t n_kv);

// Rows of a KV cache of `type` (F32 or F16) in backend memory, outside a
// graph: store_kv_rows writes cache[idx[r]] = src[r] (rounded to f16 for an
// F16 cache: the rounding of the graph's scatter_rows), load_kv_rows reads
// dst[r] = cache[idx[r]] as f32.  Rows are row_len elements.
void store_kv_rows(Backend& be, DType type, const float* src, int64_t row_len, const int32_t* idx,
                   int64_t n, void* cache);
void load_kv_rows(Backend& be, DType type, const void* cache, int64_t row_len, const int32_t* idx,
                  int64_t n, float* dst);

}  // namespace cb
