#include "runtime/llama_layer.h"

#include <cmath>

namespace cb {

namespace {

float attention_scale(const LlamaHparams& hp) {
  return 1.0f / std::sqrt(static_cast<float>(hp.head_dim));
}

}  // namespace

TensorId LlamaLayer::attention_input(TensorId x) {
  return g_.rmsnorm(x, w_.attn_norm, hp_.rms_eps);
}

TensorId LlamaLayer::project(const WeightView& w, const float* bias, const float* head_norm,
                             TensorId h, TensorId out) {
  // With a head norm the product goes to the arena first: the norm reads it
  // whole into `out`.
  const TensorId product = out == kNewTensor || head_norm != nullptr ? g_.matmul(w, h, mm_) : out;
  if (product == out) g_.matmul_into(w, h, out, mm_);
  if (bias != nullptr) g_.add_bias(product, bias);
  if (head_norm == nullptr) return product;
  return g_.rmsnorm_groups(product, head_norm, hp_.head_dim, hp_.rms_eps,
                           out == kNewTensor ? -1 : out);
}

TensorId LlamaLayer::project_q(TensorId h, TensorId out) {
  return project(w_.wq, w_.bq, w_.q_norm, h, out);
}
TensorId LlamaLayer::project_k(TensorId h, TensorId out) {
  return project(w_.wk, w_.bk, w_.k_norm, h, out);
}
TensorId LlamaLayer::project_v(TensorId h, TensorId out) {
  return project(w_.wv, w_.bv, nullptr, h, out);
}

void LlamaLayer::rope_q(TensorId q, const int32_t* pos) {
  g_.rope(q, pos, hp_.n_head, hp_.head_dim, hp_.rot_dim, hp_.rope_base(layer_), w_.rope_factors);
}

void LlamaLayer::rope_k(TensorId k, const int32_t* pos) {
  g_.rope(k, pos, hp_.n_head_kv, hp_.head_dim, hp_.rot_dim, hp_.rope_base(layer_), w_.rope_factors);
}

TensorId LlamaLayer::attention(TensorId q, const int32_t* q_pos, TensorId k_cache, TensorId v_cache,
                               int64_t n_kv, const KeyBlockBias& key_bias) {
  return g_.attention(q, q_pos, k_cache, v_cache, n_kv, hp_.n_head, hp_.n_head_kv, hp_.head_dim,
                      attention_scale(hp_), hp_.attention_window(layer_), key_bias);
}

void LlamaLayer::add_branch(TensorId x, TensorId branch, const float* post_norm) {
  g_.add_into(x, g_.rmsnorm(branch, post_norm, hp_.rms_eps));
}

void LlamaLayer::attention_output(TensorId x, TensorId a) {
  if (w_.attn_post_norm == nullptr) return g_.matmul_add_into(w_.wo, a, x, mm_);
  add_branch(x, g_.matmul(w_.wo, a, mm_), w_.attn_post_norm);
}

void LlamaLayer::ffn(TensorId x) {
  TensorId h = g_.rmsnorm(x, w_.ffn_norm, hp_.rms_eps);
  TensorId gate = g_.matmul(w_.w_gate, h, mm_), up = g_.matmul(w_.w_up, h, mm_);
  const ProductArgs::Gate act = hp_.ffn_activation == Activation::kGeluTanh
                                    ? ProductArgs::Gate::kGeluTanh
                                    : ProductArgs::Gate::kSilu;
  if (w_.ffn_post_norm == nullptr) {
    g_.matmul_gated(w_.w_down, gate, up, act, mm_, x);
    return;
  }
  add_branch(x, g_.matmul_gated(w_.w_down, gate, up, act, mm_), w_.ffn_post_norm);
}

TensorId add_embeddings(Graph& g, const LlamaHparams& hp, const WeightView& tok_embd,
                        const int32_t* ids, int64_t n) {
  TensorId x = g.get_rows(tok_embd, ids, n);
  if (hp.embedding_scale != 1.0f) g.scale(x, hp.embedding_scale);
  return x;
}

void embed_tokens(Backend& be, const LlamaHparams& hp, const WeightView& tok_embd,
                  const int32_t* ids, int64_t n, float* out) {
  be.get_rows(tok_embd, ids, n, out);
  if (hp.embedding_scale != 1.0f) be.scale(out, n * hp.n_embd, hp.embedding_scale);
}

void add_output_head(Graph& g, const LlamaHparams& hp, const float* output_norm,
                     const WeightView& output, TensorId x, TensorId logits, Graph::Precision mm) {
  g.matmul_into(output, g.rmsnorm(x, output_norm, hp.rms_eps), logits, mm);
}

void rope_keys(Backend& be, const LlamaHparams& hp, int64_t layer, const LayerWeights& w, float* k,
               const int32_t* pos, int64_t n) {
  be.rope(k, pos, n, hp.n_head_kv, hp.head_dim, hp.rot_dim, hp.rope_base(layer), w.rope_factors);
}

void rope_queries(Backend& be, const LlamaHparams& hp, int64_t layer, const LayerWeights& w,
                  float* q, const int32_t* pos, int64_t n) {
  be.rope(q, pos, n, hp.n_head, hp.head_dim, hp.rot_dim, hp.rope_base(layer), w.rope_factors);
}

AttentionArgs attention_args(const LlamaHparams& hp, int64_t layer, const float* q,
                             const int32_t* q_pos, int64_t n_q, const void* k_cache,
                             const void* v_cache, DType kv_type, int64_t n_kv) {
  AttentionArgs a;
  a.q = q;
  a.q_pos = q_pos;
  a.n_q = n_q;
  a.k = k_cache;
  a.v = v_cache;
  a.kv_type = kv_type;
  a.n_kv = n_kv;
  a.n_head = hp.n_head;
  a.n_head_kv = hp.n_head_kv;
  a.head_dim = hp.head_dim;
  a.scale = attention_scale(hp);
  a.window = hp.attention_window(layer);
  return a;
}

void store_kv_rows(Backend& be, DType type, const float* src, int64_t row_len, const int32_t* idx,
                   int64_t n, void* cache) {
  if (type == DType::F16) {
    be.scatter_rows_f16(src, row_len, idx, n, static_cast<uint16_t*>(cache));
  } else {
    be.scatter_rows(src, row_len, idx, n, static_cast<float*>(cache));
  }
}

void load_kv_rows(Backend& be, DType type, const void* cache, int64_t row_len, const int32_t* idx,
                  int64_t n, float* dst) {
  if (type == DType::F16) {
    be.gather_rows_f16(static_cast<const uint16_t*>(cache), row_len, idx, n, dst);
  } else {
    be.gather_rows(static_cast<const float*>(cache), row_len, idx, n, dst);
  }
}

}  // namespace cb
