#include "runtime/model.h"

#include <xxhash.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "kernels/cpu/dequantize.h"
#include "kernels/dtype.h"
#include "platform/error.h"
#include "runtime/tokenizer/vocab_gguf.h"

namespace cb {
namespace {

std::string shape_text(const GgufTensor& t) {
  std::string s = "[";
  for (size_t i = 0; i < t.dims.size(); ++i) s += (i ? ", " : "") + std::to_string(t.dims[i]);
  return s + "]";
}

// NEOX-style RoPE (qwen2) rotates the pairs (x[i], x[i + rot/2]) of a head;
// the runtime's kernels rotate adjacent pairs (x[2i], x[2i+1]), at the same
// frequency for the same i.  Reordering the rows of Wq and Wk (and of their
// biases) so that row i + rot/2 follows row i turns one into the other:
// q.k sums over a head's dimensions, so attention is unchanged, and K is
// cached in that order.  Returns the source row of every row.
std::vector<int64_t> neox_rows_as_adjacent(int64_t n_heads, int64_t head_dim, int64_t rot_dim) {
  std::vector<int64_t> order(static_cast<size_t>(n_heads * head_dim));
  for (int64_t h = 0; h < n_heads; ++h) {
    int64_t* o = order.data() + h * head_dim;
    for (int64_t i = 0; i < rot_dim / 2; ++i) {
      o[2 * i] = h * head_dim + i;
      o[2 * i + 1] = h * head_dim + i + rot_dim / 2;
    }
    for (int64_t i = rot_dim; i < head_dim; ++i) o[i] = h * head_dim + i;
  }
  return order;
}

}  // namespace

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::kQwen2:
      return "qwen2";
    case Arch::kQwen3:
      return "qwen3";
    case Arch::kGemma3:
      return "gemma3";
    case Arch::kLlama:
      break;
  }
  return "llama";
}

const float* Model::f32_vector(const std::string& name, int64_t n) {
  const GgufTensor* t = gguf_.find_tensor(name);
  if (!t) fail(ErrorCode::kFormat, "model is missing tensor '" + name + "'");
  if (t->dims.size() != 1 || t->dims[0] != n)
    fail(ErrorCode::kFormat, "tensor '" + name + "' has shape " + shape_text(*t) + ", expected [" +
                                 std::to_string(n) + "]");
  if (t->type == DType::F32) return static_cast<const float*>(t->data);
  // Norm weights are tiny; converting them once keeps every kernel on f32.
  owned_.emplace_back(static_cast<size_t>(n));
  dequantize_row(t->type, t->data, owned_.back().data(), n);
  return owned_.back().data();
}

WeightView Model::matrix(const std::string& name, int64_t n_in, int64_t n_out) {
  const GgufTensor* t = gguf_.find_tensor(name);
  if (!t) fail(ErrorCode::kFormat, "model is missing tensor '" + name + "'");
  if (t->dims.size() != 2 || t->dims[0] != n_in || t->dims[1] != n_out)
    fail(ErrorCode::kFormat, "tensor '" + name + "' has shape " + shape_text(*t) + ", expected [" +
                                 std::to_string(n_in) + ", " + std::to_string(n_out) + "]");
  return WeightView{t->data, t->type, n_in, n_out};
}

WeightView Model::reordered_rows(const WeightView& w, const std::vector<int64_t>& order) {
  const size_t row = dtype_row_bytes(w.type, w.n_in);
  owned_rows_.emplace_back(row * order.size());
  unsigned char* out = owned_rows_.back().data();
  for (size_t i = 0; i < order.size(); ++i)
    std::memcpy(out + i * row, static_cast<const unsigned char*>(w.data) + order[i] * row, row);
  return WeightView{out, w.type, w.n_in, w.n_out};
}

const float* Model::reordered(const float* v, const std::vector<int64_t>& order) {
  owned_.emplace_back(order.size());
  for (size_t i = 0; i < order.size(); ++i) owned_.back()[i] = v[order[i]];
  return owned_.back().data();
}

ChatFormat Model::chat_format() const {
  if (!chat_format_) fail(ErrorCode::kUnsupported, chat_format_error_);
  return *chat_format_;
}

std::unique_ptr<Model> Model::load(const std::string& path, std::optional<ChatFormat> chat_format) {
  std::unique_ptr<Model> m(new Model(GgufFile::open(path)));
  try {
    m->read_hparams();
    m->read_weights();
    m->read_tokenizer(path, chat_format);
  } catch (const Error& e) {
    throw Error(e.code(), path + ": " + e.what());
  }
  return m;
}

// Metadata `key`, which must be present and an integer in (0, 2^24].
int64_t Model::required(const std::string& key) const {
  auto v = gguf_.get_int(key);
  if (!v) fail(ErrorCode::kFormat, "missing metadata '" + key + "'");
  if (*v <= 0 || *v > (int64_t{1} << 24))
    fail(ErrorCode::kFormat, "metadata '" + key + "' out of range: " + std::to_string(*v));
  return *v;
}

void Model::read_hparams() {
  const GgufFile& f = gguf_;
  const std::string arch = f.get_string("general.architecture").value_or("");
  LlamaHparams& hp = hp_;
  if (arch == "llama")
    hp.arch = Arch::kLlama;
  else if (arch == "qwen2")
    hp.arch = Arch::kQwen2;
  else if (arch == "qwen3")
    hp.arch = Arch::kQwen3;
  else if (arch == "gemma3")
    hp.arch = Arch::kGemma3;
  else
    fail(ErrorCode::kUnsupported,
         "unsupported architecture '" + arch + "' (supported: llama, qwen2, qwen3, gemma3)");
  const std::string k = arch + ".";
  auto req = [&](const std::string& key) { return required(key); };
  hp.n_layer = req(k + "block_count");
  hp.n_embd = req(k + "embedding_length");
  hp.n_ff = req(k + "feed_forward_length");
  hp.n_head = req(k + "attention.head_count");
  hp.n_head_kv =
      f.has(k + "attention.head_count_kv") ? req(k + "attention.head_count_kv") : hp.n_head;
  hp.n_ctx_train = req(k + "context_length");
  if (hp.n_embd % hp.n_head != 0 || hp.n_head % hp.n_head_kv != 0)
    fail(ErrorCode::kFormat, "head counts do not divide the embedding size");
  hp.head_dim =
      f.has(k + "attention.key_length") ? req(k + "attention.key_length") : hp.n_embd / hp.n_head;
  if (f.has(k + "attention.value_length") && req(k + "attention.value_length") != hp.head_dim)
    fail(ErrorCode::kUnsupported, "key and value head sizes differ");
  hp.rot_dim = f.has(k + "rope.dimension_count") ? req(k + "rope.dimension_count") : hp.head_dim;
  if (hp.rot_dim > hp.head_dim || hp.rot_dim % 2 != 0 || hp.head_dim % 2 != 0)
    fail(ErrorCode::kFormat, "invalid RoPE dimension count");
  hp.rope_freq_base = static_cast<float>(f.get_float(k + "rope.freq_base").value_or(10000.0));
  hp.rms_eps =
      static_cast<float>(f.get_float(k + "attention.layer_norm_rms_epsilon").value_or(1e-5));
  if (!(hp.rope_freq_base > 0) || !std::isfinite(hp.rope_freq_base) || !(hp.rms_eps > 0) ||
      !std::isfinite(hp.rms_eps))
    fail(ErrorCode::kFormat, "invalid RoPE base or RMS epsilon (each must be finite and > 0)");
  read_rope_scaling(k);
  if (hp.arch == Arch::kGemma3) read_gemma_hparams(k);
}

// Llama 3.1+ scales RoPE by per-pair frequency divisors, stored in the
// file (rope_freqs.weight); linear scaling divides every frequency by the
// factor, which is the same divisor for every pair.  Other scalings (YaRN)
// are not implemented.
void Model::read_rope_scaling(const std::string& k) {
  const GgufFile& f = gguf_;
  LlamaHparams& hp = hp_;
  const std::string scaling = f.get_string(k + "rope.scaling.type").value_or("none");
  const double factor = f.get_float(k + "rope.scaling.factor").value_or(1.0);
  if (f.find_tensor("rope_freqs.weight")) {
    hp.rope_freq_factors = f32_vector("rope_freqs.weight", hp.rot_dim / 2);
    // Each divides a rotation frequency: NaN, infinite, zero or negative
    // ones turn every angle into garbage.
    for (int64_t i = 0; i < hp.rot_dim / 2; ++i) {
      const float d = hp.rope_freq_factors[i];
      if (!(d > 0) || !std::isfinite(d))
        fail(ErrorCode::kFormat, "rope_freqs.weight[" + std::to_string(i) + "] is " +
                                     std::to_string(d) +
                                     ": each RoPE frequency divisor must be finite and > 0");
    }
  }
  if (scaling == "linear" && factor != 1.0) {
    if (!(factor > 0) || !std::isfinite(factor))
      fail(ErrorCode::kFormat, "invalid RoPE scaling factor " + std::to_string(factor));
    if (hp.rope_freq_factors)
      fail(ErrorCode::kUnsupported, "linear RoPE scaling together with rope_freqs");
    hp.rope_linear_factors.assign(static_cast<size_t>(hp.rot_dim / 2), static_cast<float>(factor));
  } else if (scaling != "none" && scaling != "llama3" && scaling != "linear" && factor != 1.0) {
    fail(ErrorCode::kUnsupported, "RoPE scaling ('" + scaling + "') is not supported yet");
  }
}

// As llama.cpp reads Gemma 3: five local layers to one global and RoPE base
// 10000 on local layers, unless the file says otherwise.
void Model::read_gemma_hparams(const std::string& k) {
  const GgufFile& f = gguf_;
  LlamaHparams& hp = hp_;
  auto req = [&](const std::string& key) { return required(key); };
  hp.embedding_scale = std::sqrt(static_cast<float>(hp.n_embd));
  hp.ffn_activation = Activation::kGeluTanh;
  if (f.has(k + "attention.sliding_window")) {
    hp.sliding_window = req(k + "attention.sliding_window");
    hp.sliding_window_pattern = f.has(k + "attention.sliding_window_pattern")
                                    ? req(k + "attention.sliding_window_pattern")
                                    : 6;
  }
  hp.rope_freq_base_local =
      static_cast<float>(f.get_float(k + "rope.freq_base_swa").value_or(10000.0));
  if (!(hp.rope_freq_base_local > 0) || !std::isfinite(hp.rope_freq_base_local))
    fail(ErrorCode::kFormat, "invalid local RoPE base");
  // Gemma 3 27B scales its attention by n_embd / n_head instead of the
  // head size, and its file does not say so (llama.cpp tells the model
  // by its 62 layers): refused rather than computed wrong.
  if (hp.n_layer == 62)
    fail(ErrorCode::kUnsupported, "Gemma 3 27B's attention scale is not supported");
  if (f.get_float(k + "final_logit_softcapping").value_or(0.0) != 0.0)
    fail(ErrorCode::kUnsupported, "final logit soft-capping is not supported");
}

void Model::read_weights() {
  const GgufFile& f = gguf_;
  const LlamaHparams& hp = hp_;
  const bool gemma = hp.arch == Arch::kGemma3;
  const GgufTensor* emb = f.find_tensor("token_embd.weight");
  if (!emb || emb->dims.size() != 2)
    fail(ErrorCode::kFormat, "model is missing a 2-D 'token_embd.weight'");
  hp_.n_vocab = emb->dims[1];
  tok_embd_ = matrix("token_embd.weight", hp.n_embd, hp.n_vocab);
  output_ =
      f.find_tensor("output.weight") ? matrix("output.weight", hp.n_embd, hp.n_vocab) : tok_embd_;
  output_norm_ = f32_vector("output_norm.weight", hp.n_embd);

  const int64_t q_dim = hp.n_head * hp.head_dim;
  const bool neox = hp.arch != Arch::kLlama;
  const std::vector<int64_t> q_rows =
      neox ? neox_rows_as_adjacent(hp.n_head, hp.head_dim, hp.rot_dim) : std::vector<int64_t>{};
  const std::vector<int64_t> k_rows =
      neox ? neox_rows_as_adjacent(hp.n_head_kv, hp.head_dim, hp.rot_dim) : std::vector<int64_t>{};
  const std::vector<int64_t> head_order =
      neox ? neox_rows_as_adjacent(1, hp.head_dim, hp.rot_dim) : std::vector<int64_t>{};
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights w;
    w.attn_norm = f32_vector(p + "attn_norm.weight", hp.n_embd);
    w.wq = matrix(p + "attn_q.weight", hp.n_embd, q_dim);
    w.wk = matrix(p + "attn_k.weight", hp.n_embd, hp.kv_dim());
    w.wv = matrix(p + "attn_v.weight", hp.n_embd, hp.kv_dim());
    w.wo = matrix(p + "attn_output.weight", q_dim, hp.n_embd);
    if (hp.arch == Arch::kQwen2) {
      w.bq = f32_vector(p + "attn_q.bias", q_dim);
      w.bk = f32_vector(p + "attn_k.bias", hp.kv_dim());
      w.bv = f32_vector(p + "attn_v.bias", hp.kv_dim());
    }
    if (hp.arch == Arch::kQwen3 || gemma) {
      w.q_norm = f32_vector(p + "attn_q_norm.weight", hp.head_dim);
      w.k_norm = f32_vector(p + "attn_k_norm.weight", hp.head_dim);
    }
    if (neox) {
      w.wq = reordered_rows(w.wq, q_rows);
      w.wk = reordered_rows(w.wk, k_rows);
      if (w.bq) w.bq = reordered(w.bq, q_rows);
      if (w.bk) w.bk = reordered(w.bk, k_rows);
      if (w.q_norm) w.q_norm = reordered(w.q_norm, head_order);
      if (w.k_norm) w.k_norm = reordered(w.k_norm, head_order);
    }
    w.ffn_norm = f32_vector(p + "ffn_norm.weight", hp.n_embd);
    w.w_gate = matrix(p + "ffn_gate.weight", hp.n_embd, hp.n_ff);
    w.w_up = matrix(p + "ffn_up.weight", hp.n_embd, hp.n_ff);
    w.w_down = matrix(p + "ffn_down.weight", hp.n_ff, hp.n_embd);
    if (gemma) {
      w.attn_post_norm = f32_vector(p + "post_attention_norm.weight", hp.n_embd);
      w.ffn_post_norm = f32_vector(p + "post_ffw_norm.weight", hp.n_embd);
    }
    w.rope_factors = hp.rope_factors(l);
    layers_.push_back(w);
  }
}

void Model::read_tokenizer(const std::string& path, std::optional<ChatFormat> chat_format) {
  const GgufFile& f = gguf_;
  tokenizer_ = std::make_unique<Tokenizer>(read_tokenizer_vocab(f));
  if (tokenizer_->n_vocab() > hp_.n_vocab)
    fail(ErrorCode::kFormat, "tokenizer has more tokens than the embedding matrix");
  name_ = f.get_string("general.name").value_or(path);
  chat_format_ = chat_format;
  const std::optional<std::string> chat_template = f.get_string("tokenizer.chat_template");
  if (!chat_format) {
    try {
      chat_format_ = detect_chat_format(chat_template, *tokenizer_);
    } catch (const Error& e) {
      chat_format_error_ = e.what();
    }
  }
  if (chat_format_) chat_default_system_ = cb::chat_default_system(*chat_format_, chat_template);
}

const std::string& Model::fingerprint() const {
  std::call_once(fingerprint_once_, [this] {
    XXH128_hash_t h = XXH3_128bits(gguf_.base(), gguf_.size());
    char buf[33];
    std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                  static_cast<unsigned long long>(h.low64));
    fingerprint_ = buf;
  });
  return fingerprint_;
}

}  // namespace cb
