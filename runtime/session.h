// A session: one conversation's KV cache over a shared Model, and the
// forward pass that fills it.  Not thread-safe: one thread drives a session
// at a time; different sessions may run concurrently on one Model.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "kernels/backend.h"
#include "runtime/graph.h"
#include "runtime/model.h"
#include "runtime/resident_chunks.h"

namespace cb {

// Which Backend a session computes on.  kCuda needs the CUDA plugin
// (kernels/cuda/cuda_backend.h: cuda_plugin_available(), cuda_device_count());
// without it, or without the device, asking for it throws kUnsupported.
enum class BackendKind { kCpu, kCuda };

// What a caller asks for: kAuto is CUDA device `device` when the plugin
// loads and that device exists, else the CPU; kCuda insists; kCpu never
// loads the plugin (it would start the CUDA driver for nothing).
enum class BackendRequest { kAuto, kCpu, kCuda };
// The backend that `request` gets on this machine.  Throws
// cb::Error(kUnsupported) for kCuda when the plugin does not load, no device
// is usable, or `device` is beyond the count, saying which.
BackendKind resolve_backend(BackendRequest request, int device);

// The element type of a session's KV cache.  f16 (the default) takes half
// the memory of f32 (a 1B model at 8K context: 256 MiB instead of 512 MiB);
// each K/V element is rounded once, to nearest, when it is written, and
// read back exactly, so the logits move by about 1e-3 relative L2.  f32
// keeps the cache exact (the float64 oracle tests and llama.cpp goldens
// pin it).
enum class KvType : uint8_t { kF16, kF32 };
// The backend element type of `t` (DType::F16 or DType::F32); throws
// cb::Error(kInvalidArgument) for a value outside the enum.
DType kv_dtype(KvType t);
const char* kv_type_name(KvType t);  // "f16", "f32"

// What a progress report counts (Session::set_progress_report).
enum class ProgressStage : uint8_t {
  kPrefill,  // tokens through the model (prefill, embed): done/total tokens
  kChunk,    // a chunk's KV computed for the chunk cache: done/total layers
  kBlend,    // a fused pass over a request with reused chunk KV: layers
};
// Told after each forward batch (kPrefill) or layer (kChunk, kBlend), on the
// calling thread; done runs from 1 to total within a stage.  A report that
// throws ends the call as a failing op would.
using ProgressReport = std::function<void(ProgressStage, int64_t done, int64_t total)>;

struct SessionOptions {
  int64_t n_ctx = 0;  // 0: min(model's training context, 4096)
  int n_threads = 0;  // 0: all cores
  // Tokens per forward chunk, in a prefill and in a blend's layers; it
  // bounds the activation memory.  0: the backend's default
  // (Backend::default_batch_rows: 256 on the CPU, 2048 on CUDA).
  int64_t n_batch = 0;
  CpuKernelLevel kernels = CpuKernelLevel::kAuto;
  // decode() multiplies int8-quantized activations by the quantized weights
  // (Backend::matmul_q8's GEMV, as llama.cpp does): ~1.25x faster decode on
  // SmolLM2 Q4_1, logits ~2.5e-2 relative L2 (median; up to ~0.1) from the
  // f32 path's.  false keeps decode on the f32 path, the arithmetic of
  // prefill (for callers and tests that need that identity).
  bool int8_decode = true;
  // prefill() and the CacheBlend passes over the session do the same with
  // Backend::matmul_q8's many-row product: an int8 GEMM where the backend
  // has one (x86: ~3x the f32 GEMM with AVX-512 VNNI, ~2x with AVX2), else
  // the exact f32 GEMM.
  // false keeps f32 activations (the float64 oracle tests pin that path).
  bool int8_prefill = true;
  // kCuda: every op on CUDA device `device` (n_threads and kernels are then
  // unused).  The KV cache and activations live in device memory there (on
  // a Jetson, mapped host memory): see docs/CUDA.md.
  BackendKind backend = BackendKind::kCpu;
  int device = 0;
  KvType kv_type = KvType::kF16;
  // Backend memory for retrieved chunks' KV kept between requests
  // (resident_chunks()): -1, the backend's choice (Backend::
  // resident_kv_bytes: none on the CPU or an integrated GPU, whose memory
  // the chunk store already is); 0, none.  Used only on a backend that
  // wants staged uploads.
  int64_t resident_kv_bytes = -1;
};

class Session {
 public:
  // Throws cb::Error(kInvalidArgument) for n_ctx beyond the model's context,
  // kOutOfMemory when the KV cache cannot be allocated.
  Session(const Model& model, const SessionOptions& opts);
  // On `backend` instead of the one opts names (opts.backend, n_threads,
  // kernels and device are then unused): for tests that wrap a backend.
  Session(const Model& model, const SessionOptions& opts, std::unique_ptr<Backend> backend);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Appends `tokens` at positions n_past().. and returns the logits of the
  // last one (n_vocab floats, valid until the next call).  Throws
  // kContextOverflow if they do not fit (the session is left unchanged) and
  // kInvalidArgument for an empty span or an id outside the vocabulary.
  // When the stop check fires (kCancelled) or an op fails, n_past() is left
  // as it was before the call.
  std::span<const float> prefill(std::span<const int32_t> tokens);
  // One token, as prefill({&token, 1}) but on decode's matmul path (see
  // SessionOptions::int8_decode).
  std::span<const float> decode(int32_t token);
  // A text's embedding: the mean over its tokens of the last layer's hidden
  // state after the output norm, scaled to unit length (n_embd floats).  The
  // tokens run as a sequence of their own, in the KV cache's positions from
  // 0: the context is discarded, before the call and after it (also when it
  // throws, as prefill does).
  std::vector<float> embed(std::span<const int32_t> tokens);

  int64_t n_past() const { return n_past_; }
  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_batch() const { return n_batch_; }
  // The precision of prefill's weight products (SessionOptions::int8_prefill).
  Graph::Precision prefill_precision() const {
    return int8_prefill_ ? Graph::Precision::kInt8Activations : Graph::Precision::kF32;
  }
  // Forgets everything after the first n tokens (n <= n_past()).
  void truncate(int64_t n);
  const Model& model() const { return model_; }
  Backend& backend() { return *backend_; }

  // The layer's KV cache: n_ctx rows of kv_dim elements of kv_dtype() (f32,
  // or f16 as raw binary16 bits), row j = position j.  K is stored after
  // RoPE.  Backend memory, which the host may be unable to touch (a GPU's
  // device memory): read it through read_kv_rows() or backend ops.
  void* k_cache(int64_t layer) { return k_cache_[layer]; }
  void* v_cache(int64_t layer) { return v_cache_[layer]; }
  KvType kv_type() const { return kv_type_; }
  DType kv_dtype() const { return cb::kv_dtype(kv_type_); }
  // Bytes of the whole KV cache (every layer's K and V, n_ctx rows).
  size_t kv_cache_bytes() const { return kv_bytes_; }
  // Rows [first, first + n) of the layer's K (or V) as f32, into host memory
  // `out` (n x kv_dim floats), through the backend (for tests and the
  // fusor's oracle: the cache may be device memory).
  void read_kv_rows(int64_t layer, bool v, int64_t first, int64_t n, float* out);

  // For code that fills the KV cache by other means than prefill() (the
  // CacheBlend fusor): the backend-prepared weights (the norm weights and
  // biases too), the logits buffer, and a way to declare rows [0, n) of
  // every layer valid.
  const std::vector<LayerWeights>& layer_weights() const { return layers_; }
  const WeightView& token_embd() const { return tok_embd_; }
  const WeightView& output() const { return output_; }
  const float* output_norm() const { return output_norm_; }
  std::span<float> logits_buffer() { return logits_; }
  void set_n_past(int64_t n);
  // A bias on the attention that the rows after the reused chunks pay to
  // them (BlendOptions::context_scale), set by the fusor with the KV it
  // leaves: every later forward pass of the session (the answer's decode)
  // applies it, until rows of its key block are truncated or written anew.
  void set_context_bias(const KeyBlockBias& b) { context_bias_ = b; }
  const KeyBlockBias& context_bias() const { return context_bias_; }
  // Chunk KV kept in backend memory across requests (SessionOptions::
  // resident_kv_bytes; reset and truncate leave it).
  ResidentChunks& resident_chunks() { return *resident_; }

  // Asked before every op of prefill() and of the fusor's passes over this
  // session (empty: never); see StopCheck.  decode() is one token and does
  // not ask: a generation loop asks stop_requested() between tokens.
  void set_stop_check(StopCheck check) { stop_ = std::move(check); }
  const StopCheck* stop_check() const { return stop_ ? &stop_ : nullptr; }
  bool stop_requested() const { return stop_ && stop_(); }
  // Told how far prefill(), embed() and the fusor's passes over this
  // session have come (empty: nobody).
  void set_progress_report(ProgressReport report) { progress_ = std::move(report); }
  void report_progress(ProgressStage stage, int64_t done, int64_t total) const {
    if (progress_) progress_(stage, done, total);
  }

 private:
  void check_tokens(std::span<const int32_t> tokens) const;
  // With `hidden`, every row's normed final hidden state goes there (n x
  // n_embd) instead of the last row's logits.
  void forward_batch(const int32_t* tokens, int64_t n, Graph::Precision mm, const StopCheck* stop,
                     float* hidden = nullptr);
  // Adds the forward pass of n tokens to g: their ids and positions are
  // read through `tokens` and `pos` when g runs (so they must outlive it),
  // the attention spans n_kv rows, and only row *last_row goes past the
  // last layer's K/V unless `hidden` takes every row (see forward_batch).
  void add_forward(Graph& g, const int32_t* tokens, const int32_t* pos, const int32_t* last_row,
                   int64_t n, int64_t n_kv, Graph::Precision mm, float* hidden);
  // Grows the session's arena to `bytes` if it is smaller.
  void ensure_arena(size_t bytes);
  // Runs g in the session's arena, grown to arena_bytes first if needed.
  void execute(const Graph& g, size_t arena_bytes, const StopCheck* stop);
  // Drops the backend's recording of the decode graph, if any.
  void forget_decode_key();
  // The context bias ends where rows of its key block were dropped.
  void forget_stale_context_bias();

  const Model& model_;
  std::unique_ptr<Backend> backend_;
  int64_t n_ctx_ = 0;
  int64_t n_batch_ = 0;
  int64_t n_past_ = 0;
  KeyBlockBias context_bias_;
  bool int8_decode_ = true;
  bool int8_prefill_ = true;
  KvType kv_type_ = KvType::kF16;
  size_t kv_bytes_ = 0;
  std::vector<void*> k_cache_, v_cache_;
  std::vector<LayerWeights> layers_;  // backend-prepared views and vectors
  WeightView tok_embd_, output_;
  const float* output_norm_ = nullptr;
  void* arena_ = nullptr;
  size_t arena_bytes_ = 0;
  std::vector<float> logits_;
  std::unique_ptr<ResidentChunks> resident_;
  StopCheck stop_;
  ProgressReport progress_;
  // decode()'s graph, built at its first token, and what it reads.
  std::unique_ptr<Graph> decode_graph_;
  size_t decode_arena_bytes_ = 0;
  // The token's id and position, in backend memory (uploaded from the
  // host copy at each token).
  int32_t* decode_in_ = nullptr;
  int32_t decode_in_host_[2] = {0, 0};
  // The key the backend may have recorded the decode graph under (0:
  // none), valid while the arena and the context bias it ran with stay.
  uint64_t decode_key_ = 0;
  KeyBlockBias decode_key_bias_;
};

}  // namespace cb
