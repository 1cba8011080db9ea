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
  g_.rope(q, pos, hp_.n_head, hp_.head_dim, hp_.rot_dim, hp_.rope_freq_base, hp_.rope_freq_factors);
}

void LlamaLayer::rope_k(TensorId k, const int32_t* pos) {
  g_.rope(k, pos, hp_.n_head_kv, hp_.head_dim, hp_.rot_dim, hp_.rope_freq_base,
          hp_.rope_freq_factors);
}

TensorId LlamaLayer::attention(TensorId q, const int32_t* q_pos, TensorId k_cache, TensorId v_cache,
                               int64_t n_kv) {
  return g_.attention(q, q_pos, k_cache, v_cache, n_kv, hp_.n_head, hp_.n_head_kv, hp_.head_dim,
                      attention_scale(hp_));
}

void LlamaLayer::attention_output(TensorId x, TensorId a) {
  g_.add_into(x, g_.matmul(w_.wo, a, mm_));
}

void LlamaLayer::ffn(TensorId x) {
  TensorId h = g_.rmsnorm(x, w_.ffn_norm, hp_.rms_eps);
  TensorId m = g_.silu_mul(g_.matmul(w_.w_gate, h, mm_), g_.matmul(w_.w_up, h, mm_));
  g_.add_into(x, g_.matmul(w_.w_down, m, mm_));
}

void add_output_head(Graph& g, const LlamaHparams& hp, const float* output_norm,
                     const WeightView& output, TensorId x, TensorId logits, Graph::Precision mm) {
  g.matmul_into(output, g.rmsnorm(x, output_norm, hp.rms_eps), logits, mm);
}

void rope_keys(Backend& be, const LlamaHparams& hp, float* k, const int32_t* pos, int64_t n) {
  be.rope(k, pos, n, hp.n_head_kv, hp.head_dim, hp.rot_dim, hp.rope_freq_base,
          hp.rope_freq_factors);
}

void rope_queries(Backend& be, const LlamaHparams& hp, float* q, const int32_t* pos, int64_t n) {
  be.rope(q, pos, n, hp.n_head, hp.head_dim, hp.rot_dim, hp.rope_freq_base, hp.rope_freq_factors);
}

AttentionArgs attention_args(const LlamaHparams& hp, const float* q, const int32_t* q_pos,
                             int64_t n_q, const float* k_cache, const float* v_cache,
                             int64_t n_kv) {
  AttentionArgs a;
  a.q = q;
  a.q_pos = q_pos;
  a.n_q = n_q;
  a.k = k_cache;
  a.v = v_cache;
  a.n_kv = n_kv;
  a.n_head = hp.n_head;
  a.n_head_kv = hp.n_head_kv;
  a.head_dim = hp.head_dim;
  a.scale = attention_scale(hp);
  return a;
}

}  // namespace cb
