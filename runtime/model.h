// A Llama-family model loaded from GGUF: hyper-parameters from the
// architecture's keys (llama.*, qwen2.*), weights used in place from the
// mapping, and the tokenizer.  Nothing here is specific to one model; the
// file's metadata is authoritative.
//
// A Model is immutable after load and may be shared by many sessions on many
// threads.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "runtime/chat_format.h"
#include "runtime/gguf/gguf_file.h"
#include "runtime/tokenizer/tokenizer.h"

namespace cb {

// The architectures a Model loads (general.architecture).  All run the
// Llama block of llama_layer.h; qwen2 adds biases to the Q, K and V
// projections, qwen3 an RMS norm of each query and key head, and both
// rotate NEOX-style (see Model::load).  gemma3 has qwen3's head norms and
// rotation, scales the embeddings, norms the attention's and the
// feed-forward's outputs too, gates with GELU, and its local layers attend
// to a sliding window with their own RoPE base.
enum class Arch { kLlama, kQwen2, kQwen3, kGemma3 };
const char* arch_name(Arch a);

enum class Activation { kSilu, kGeluTanh };  // the feed-forward's gate

struct LlamaHparams {
  Arch arch = Arch::kLlama;
  int64_t n_layer = 0;
  int64_t n_embd = 0;
  int64_t n_ff = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;  // n_embd / n_head unless the file says otherwise
  int64_t rot_dim = 0;   // llama.rope.dimension_count (defaults to head_dim)
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;
  float rope_freq_base = 10000.0f;
  // Per-pair divisors of RoPE's frequencies (rot_dim / 2 floats: Llama 3.1+'s
  // rope_freqs), or null.
  const float* rope_freq_factors = nullptr;
  // Linear RoPE scaling (positions divided by the factor, as Gemma 3 4B+
  // does on its global layers): rot_dim / 2 copies of the factor, or empty.
  std::vector<float> rope_linear_factors;
  float rms_eps = 1e-5f;
  float embedding_scale = 1.0f;  // token embeddings are multiplied by it (gemma3: sqrt(n_embd))
  Activation ffn_activation = Activation::kSilu;
  // Local layers (gemma3): every layer but each sliding_window_pattern-th
  // (layer % pattern == pattern - 1 is global) sees only the last
  // sliding_window keys, and rotates with rope_freq_base_local.
  int64_t sliding_window = 0;
  int64_t sliding_window_pattern = 0;
  float rope_freq_base_local = 10000.0f;

  int64_t kv_dim() const { return n_head_kv * head_dim; }
  bool is_local(int64_t layer) const {
    return sliding_window > 0 && sliding_window_pattern > 0 &&
           layer % sliding_window_pattern < sliding_window_pattern - 1;
  }
  // Keys a query of `layer` sees (0 = all before it) and its RoPE base.
  int64_t attention_window(int64_t layer) const { return is_local(layer) ? sliding_window : 0; }
  float rope_base(int64_t layer) const {
    return is_local(layer) ? rope_freq_base_local : rope_freq_base;
  }
  // The per-pair frequency divisors of `layer` (null: none).  Local layers
  // are not scaled.
  const float* rope_factors(int64_t layer) const {
    if (!rope_linear_factors.empty()) return is_local(layer) ? nullptr : rope_linear_factors.data();
    return rope_freq_factors;
  }
};

struct LayerWeights {
  const float* attn_norm = nullptr;  // n_embd
  WeightView wq, wk, wv, wo;
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr;  // projection biases (qwen2)
  const float *q_norm = nullptr, *k_norm = nullptr;         // per-head norms, head_dim (qwen3)
  const float* ffn_norm = nullptr;                          // n_embd
  WeightView w_gate, w_up, w_down;
  // Norms of the attention's and the feed-forward's outputs before they join
  // the residual stream (gemma3), n_embd each, or null.
  const float *attn_post_norm = nullptr, *ffn_post_norm = nullptr;
  // The layer's RoPE frequency divisors (LlamaHparams::rope_factors),
  // rot_dim / 2, or null.
  const float* rope_factors = nullptr;
};

class Model {
 public:
  // Throws cb::Error: kIo, kFormat, kUnsupported (architecture, tensor type).
  // `chat_format` overrides the format the file's chat template names.
  static std::unique_ptr<Model> load(const std::string& path,
                                     std::optional<ChatFormat> chat_format = std::nullopt);

  const LlamaHparams& hparams() const { return hp_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const GgufFile& gguf() const { return gguf_; }
  const std::string& name() const { return name_; }
  const std::string& path() const { return gguf_.path(); }

  const WeightView& token_embd() const { return tok_embd_; }
  const WeightView& output() const { return output_; }  // token_embd when tied
  const float* output_norm() const { return output_norm_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  // The chat format of prompts for this model (chat_format.h).  Throws
  // cb::Error(kUnsupported) with the reason when the file's template is
  // unknown and load() was given none: the model still runs, but cannot
  // format a chat.
  ChatFormat chat_format() const;
  // The system message the file's chat template writes when a conversation
  // has none (chat_default_system); empty when it writes none.
  const std::string& chat_default_system() const { return chat_default_system_; }

  // Stable 128-bit hash (hex) of all file bytes (metadata and tensor data):
  // the model's identity in chunk-cache keys.  Computed on first use.
  const std::string& fingerprint() const;

 private:
  explicit Model(GgufFile f) : gguf_(std::move(f)) {}
  // The parts of load(), in order.
  void read_hparams();
  void read_rope_scaling(const std::string& arch_prefix);
  void read_gemma_hparams(const std::string& arch_prefix);
  void read_weights();
  void read_tokenizer(const std::string& path, std::optional<ChatFormat> chat_format);
  int64_t required(const std::string& key) const;
  const float* f32_vector(const std::string& name, int64_t n);
  WeightView matrix(const std::string& name, int64_t n_in, int64_t n_out);
  // Copies of a matrix's rows and of a vector, reordered: out[i] = in[order[i]].
  WeightView reordered_rows(const WeightView& w, const std::vector<int64_t>& order);
  const float* reordered(const float* v, const std::vector<int64_t>& order);

  GgufFile gguf_;
  LlamaHparams hp_;
  std::string name_;
  std::unique_ptr<Tokenizer> tokenizer_;
  WeightView tok_embd_, output_;
  const float* output_norm_ = nullptr;
  std::vector<LayerWeights> layers_;
  std::optional<ChatFormat> chat_format_;
  std::string chat_format_error_;  // why chat_format_ is empty
  std::string chat_default_system_;
  std::vector<std::vector<float>> owned_;               // norm weights converted to f32
  std::vector<std::vector<unsigned char>> owned_rows_;  // reordered matrices
  mutable std::once_flag fingerprint_once_;
  mutable std::string fingerprint_;
};

}  // namespace cb
