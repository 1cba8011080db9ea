// The one interface every compute backend implements (the CPU backend, and
// the CUDA plugin's).
// Model code never calls a kernel directly: the graph executor (runtime/)
// dispatches each op to a Backend.  All activations are row-major f32
// matrices; weights keep their on-disk (possibly quantized) layout.
//
// Pointers passed to a backend are in the backend's own memory (for the CPU
// backend: ordinary host memory).  Buffers come from alloc_buffer(); weights
// go through prepare_weight() once at load time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>

#include "kernels/dtype.h"

namespace cb {

// A weight matrix as stored in GGUF: n_out rows, each of n_in elements of
// `type`, rows contiguous (row stride = dtype_row_bytes(type, n_in)).
// GGUF's ne[0] is n_in, ne[1] is n_out.
struct WeightView {
  const void* data = nullptr;
  DType type = DType::F32;
  int64_t n_in = 0;
  int64_t n_out = 0;
};

// A bias on the logits of a block of keys: query rows at positions >=
// query_from add `bias` to their scaled scores of keys [key_begin, key_end),
// which multiplies those keys' softmax weights by exp(bias) against the
// others' (APE's context scale: the question's attention to reused chunk KV,
// computed without the chunks before it, is damped).  bias 0 or an empty
// block: none.  attention() and attention_contributions() apply it; a
// backend without it refuses an active one (kUnsupported), never ignores it.
struct KeyBlockBias {
  int64_t key_begin = 0;
  int64_t key_end = 0;
  int64_t query_from = 0;
  float bias = 0.0f;
  bool active() const { return bias != 0.0f && key_end > key_begin; }
  bool operator==(const KeyBlockBias& o) const {
    return key_begin == o.key_begin && key_end == o.key_end && query_from == o.query_from &&
           bias == o.bias;
  }
  // The bias query position qp pays to key j.
  float at(int64_t qp, int64_t j) const {
    return qp >= query_from && j >= key_begin && j < key_end ? bias : 0.0f;
  }
};

// A product with the element-wise ops beside it in a transformer block
// folded in (Backend::product): its input is x, or act(x) * up (a gated
// feed-forward's down projection, act SiLU or GELU as silu_mul / gelu_mul);
// its output is written to y, or added to y (a residual branch's output
// projection: y += W x, as add() would).  Decode spends a launch on each of
// those ops on a GPU, for a few thousand elements.
struct ProductArgs {
  enum class Gate : uint8_t { kNone, kSilu, kGeluTanh };
  const WeightView* w = nullptr;
  // n_rows x w->n_in.  With a gate, the gate's values, which the product
  // may overwrite with act(x) * up (the default does, as the graph's
  // silu_mul runs in place on the gate).
  float* x = nullptr;
  const float* up = nullptr;  // with a gate: n_rows x w->n_in
  Gate gate = Gate::kNone;
  int64_t n_rows = 0;
  const float* bias = nullptr;  // w->n_out floats added to each output row, or null
  bool q8 = false;              // matmul_q8's product (else matmul's)
  bool accumulate = false;      // y += the product (else y = it)
  // With accumulate: n_rows x w->n_out floats the default writes the product
  // to before adding it; a backend that adds as it writes leaves it alone.
  float* scratch = nullptr;
  float* y = nullptr;  // n_rows x w->n_out; must not overlap x, up or scratch
};

// Attention of n_q query rows over the first n_kv rows of a layer's KV cache.
// KV row j holds the key/value of the token at global position j, so the
// causal mask is "key j visible to query i iff j <= q_pos[i]", and with a
// sliding window of w keys (a local layer of Gemma 3) also j > q_pos[i] - w.
// Query rows may be any subset of positions in any order (CacheBlend
// recomputes a subset).
// Grouped-query attention: query head h reads KV head h / (n_head / n_head_kv).
// K and V are elements of kv_type: F32, or F16 (raw binary16 bits, the
// session's default KV cache).  An F16 cache is read in place, each element
// widened exactly to f32, so the result is bit for bit the one the same
// backend gives for an F32 cache holding the f16-rounded values.
struct AttentionArgs {
  const float* q = nullptr;        // n_q x (n_head * head_dim), RoPE already applied
  const int32_t* q_pos = nullptr;  // n_q global positions
  int64_t n_q = 0;
  const void* k = nullptr;     // n_kv x (n_head_kv * head_dim) of kv_type, RoPE applied
  const void* v = nullptr;     // n_kv x (n_head_kv * head_dim) of kv_type
  DType kv_type = DType::F32;  // F32 or F16
  int64_t n_kv = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  float scale = 0.0f;     // usually 1/sqrt(head_dim)
  int64_t window = 0;     // keys a query sees, its own included; 0 = all before it
  KeyBlockBias key_bias;  // none by default
  float* out = nullptr;   // n_q x (n_head * head_dim)
};

// The keys [attention_first_key, attention_key_end) that query row qi sees.
inline int64_t attention_key_end(const AttentionArgs& a, int64_t qi) {
  const int64_t end = static_cast<int64_t>(a.q_pos[qi]) + 1;
  return end < 0 ? 0 : (end < a.n_kv ? end : a.n_kv);
}
inline int64_t attention_first_key(const AttentionArgs& a, int64_t qi) {
  const int64_t first = a.window > 0 ? static_cast<int64_t>(a.q_pos[qi]) + 1 - a.window : 0;
  return first > 0 ? first : 0;
}

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // Rows per forward chunk of a session that leaves its batch size to the
  // backend.  A chunk's activations (its FFN rows above all) weigh against
  // the per-call costs it spreads: on a CPU, 256 rows keep a 1B model's
  // activations at about 20 MiB for ~4 % more prefill time than 512.
  virtual int64_t default_batch_rows() const { return 256; }

  // Memory.  alloc_buffer returns memory aligned to at least 64 bytes, or
  // throws cb::Error(kOutOfMemory).  The host may be unable to touch it (a
  // discrete GPU's device memory): host data enters through upload() and
  // ops' host inputs, and leaves through ops' host outputs (copy_to_host).
  // free_buffer may be called inside a batch: the ops the calling thread has
  // issued in it complete first (they may still use the memory).
  virtual void* alloc_buffer(size_t bytes) = 0;
  virtual void free_buffer(void* p) = 0;
  // Makes a host (mmapped) weight usable by this backend.  The CPU backend
  // returns it unchanged; a GPU backend uploads it.
  virtual WeightView prepare_weight(const WeightView& host) = 0;

  // y[r][o] = sum_i W[o][i] * x[r][i]   for r < n_rows, o < w.n_out.
  // x is n_rows x w.n_in, y is n_rows x w.n_out.
  virtual void matmul(const WeightView& w, const float* x, int64_t n_rows, float* y) = 0;
  // The same product for decode, where the weights are read once per token
  // and the f32 path is bound by turning them into floats: the backend may
  // quantize each activation row to int8 in blocks of 32 (one f32 scale per
  // block, as llama.cpp does) and take integer dot products with the
  // quantized weights.  That rounds the activations (relative error of an
  // output about 1e-3 to 1e-2, against ~1e-6 for matmul), so prefill, whose
  // logits are held to a float64 reference, keeps matmul().  Backends
  // without such a path, and weight types without an int8 kernel, run
  // matmul().
  virtual void matmul_q8(const WeightView& w, const float* x, int64_t n_rows, float* y) {
    matmul(w, x, n_rows, y);
  }
  // A projection with a bias: matmul() (matmul_q8() when q8), then
  // add_bias(y, bias, n_rows, w.n_out), bitwise; the default makes those
  // two calls, a backend may add the bias as it writes y.
  virtual void matmul_bias(const WeightView& w, const float* x, int64_t n_rows, const float* bias,
                           float* y, bool q8) {
    if (q8) {
      matmul_q8(w, x, n_rows, y);
    } else {
      matmul(w, x, n_rows, y);
    }
    add_bias(y, bias, n_rows, w.n_out);
  }
  // ProductArgs' product.  The default runs silu_mul / gelu_mul in place on
  // x, matmul_bias / matmul_q8 / matmul (into scratch when accumulating)
  // and add(): a backend that fuses them must give the same bits.
  virtual void product(const ProductArgs& a);
  // product() of a[0], ..., a[n - 1] in turn (the default), where no
  // product's output is another's input or output: a backend may run
  // products of one input together (a layer's Q, K and V projections, its
  // gate and up projections).
  virtual void products(const ProductArgs* a, int64_t n) {
    for (int64_t i = 0; i < n; ++i) product(a[i]);
  }
  // out[r] = dequantized row ids[r] of w (embedding lookup); out is n x w.n_in.
  // Every id must be in [0, w.n_out); the caller checks.
  virtual void get_rows(const WeightView& w, const int32_t* ids, int64_t n, float* out) = 0;
  // out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight
  virtual void rmsnorm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps,
                       float* out) = 0;
  // In place: for each row r and head, rotate adjacent pairs (x[2i], x[2i+1])
  // of the first rot_dim dims by angle pos[r] * freq_base^(-2i/rot_dim),
  // divided by freq_factors[i] when freq_factors (rot_dim / 2 floats, host
  // memory: Llama 3's rope_freqs) is not null.  x is n_rows x (n_heads * head_dim).
  virtual void rope(float* x, const int32_t* pos, int64_t n_rows, int64_t n_heads, int64_t head_dim,
                    int64_t rot_dim, float freq_base, const float* freq_factors) = 0;
  virtual void attention(const AttentionArgs& a) = 0;
  // Query-aware selection, what each key adds to the attention output:
  // out[j] += sum over the a.n_q query rows and a.n_head heads h of
  // w(i, h, j) * |v_j|_h, for j < a.n_kv, where w is the weight attention()
  // gives key j (row i's softmax over the keys it sees) and |v_j|_h the L2
  // norm of value j's part for head h's KV head.  a.out is not read.
  // `out` is ordinary host memory: the n_kv sums are what the host ranks.
  virtual void attention_contributions(const AttentionArgs& a, float* out) = 0;
  // out[i] = silu(gate[i]) * up[i]; out may be gate or up (the graph runs
  // it in place on gate).
  virtual void silu_mul(const float* gate, const float* up, int64_t n, float* out) = 0;
  // out[i] = gelu(gate[i]) * up[i], GELU in its tanh form (Gemma's GeGLU):
  // gelu(x) = x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))).  out
  // may be gate or up.
  virtual void gelu_mul(const float* gate, const float* up, int64_t n, float* out) = 0;
  // x[i] *= s  (Gemma's embedding scale)
  virtual void scale(float* x, int64_t n, float s) = 0;
  // out[i] = a[i] + b[i]  (out may alias a or b)
  virtual void add(const float* a, const float* b, int64_t n, float* out) = 0;
  // x[r][i] += bias[i] for r < n_rows, i < dim: a projection's bias (bias
  // may be host memory).  Bitwise what add() gives row by row, which is how
  // the default does it; a backend may do it in one pass.
  virtual void add_bias(float* x, const float* bias, int64_t n_rows, int64_t dim) {
    for (int64_t r = 0; r < n_rows; ++r) add(x + r * dim, bias, dim, x + r * dim);
  }
  // The mean of each of n_seg segments of rows (row_len floats each):
  // out[s] = the mean of x's rows [seg[s], seg[s + 1]).  seg is host memory,
  // n_seg + 1 offsets, each segment non-empty.  The sums have one order on
  // every backend, pairwise halving: while a segment has n > 1 rows, its
  // last n / 2 rows are added onto its first n / 2; then its first row is
  // multiplied by 1 / n0 (f32), n0 the segment's size.  x is scratch (its
  // rows are overwritten); out must not overlap it (a backend may write out
  // while other segments are still being summed).  Bitwise what the default
  // gives with add(), gather_rows() and scale(); a backend may do it in one
  // pass.
  virtual void segment_means(float* x, int64_t row_len, const int32_t* seg, int64_t n_seg,
                             float* out);
  // dst[r] = src[idx[r]]   (rows of row_len floats)
  virtual void gather_rows(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                           float* dst) = 0;
  // CacheBlend's KV deviation: out[r] = sum_j (a[r][j] - b[r][j])^2 over rows
  // of row_len floats.
  virtual void row_sq_diff(const float* a, const float* b, int64_t n_rows, int64_t row_len,
                           float* out) = 0;
  // dst[idx[r]] = src[r]
  virtual void scatter_rows(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                            float* dst) = 0;
  // The two row moves of an F16 KV cache (raw binary16 bits, row_len per
  // row).  scatter_rows_f16: dst[idx[r]] = src[r] rounded to f16 (to
  // nearest, ties to even, as platform/half.h: the same bits on every
  // backend); gather_rows_f16: dst[r] = src[idx[r]] widened to f32 (exact).
  virtual void scatter_rows_f16(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                                uint16_t* dst) = 0;
  virtual void gather_rows_f16(const uint16_t* src, int64_t row_len, const int32_t* idx, int64_t n,
                               float* dst) = 0;
  // CacheBlend's HKVD selection: the indices of the k largest of values[0, n),
  // written to out[0, k) in increasing index order; equal values go to the
  // lower index, so the choice is deterministic.  0 <= k <= n.  `out` may be
  // ordinary host memory (k indices are what the host needs next).
  virtual void top_k(const float* values, int64_t n, int64_t k, int32_t* out);

  // --- Deferred completion ---
  // Outside a batch every op has finished, and its results are visible to
  // the host, when it returns.  Between begin_batch() and the matching
  // end_batch() (they nest; both from the same thread) a backend may return
  // before an op is done: a GPU backend enqueues the work and end_batch()
  // of the outermost level waits once for all of it.  So inside a batch the
  // caller must not touch on the host a buffer from alloc_buffer() that an op
  // of the batch writes or reads, until end_batch() returns.  Ordinary host
  // memory passed as an op's input may be reused as soon as the op returns,
  // and an op whose output is ordinary host memory still completes before it
  // returns.  Ops from other threads are not part of the batch.  The CPU
  // backend finishes every op at once, so these do nothing there.
  virtual void begin_batch() {}
  virtual void end_batch() {}

  // --- Replayed batches ---
  // A caller that issues the same ops with the same arguments (every
  // pointer, size and scalar) batch after batch, where only the contents of
  // alloc_buffer() memory differ in between (a decode token, whose id and
  // position are uploaded before it), may let the backend record such a
  // batch once and replay the recording.  begin_replay(key) opens an
  // outermost batch, as begin_batch() does, for the ops the caller issued
  // last under `key` (nonzero, chosen by the caller), and says what the
  // caller does before its end_batch():
  //  - kReplayed: nothing; the backend has issued the ops from a recording;
  //  - kIssue: issue the ops (the backend may look at them);
  //  - kRecord: issue the ops, which the backend records and runs only at
  //    end_batch(); if that end_batch() throws Error(kUnsupported), the
  //    recording failed and none of them ran, and the caller may issue
  //    them again in an ordinary batch (other errors are the ops' own).
  // The ops of such a batch read no host memory (weights from
  // prepare_weight(), every other input in alloc_buffer() memory); an
  // output in host memory holds its result when end_batch() returns, not
  // before.  forget_replay(key) drops the recording: the caller calls it
  // before it frees or changes anything that the ops under `key` name.  By
  // default nothing is recorded (a CPU runs the ops at once: there is
  // nothing to save).
  enum class ReplayStart { kReplayed, kIssue, kRecord };
  virtual ReplayStart begin_replay(uint64_t key) {
    (void)key;
    begin_batch();
    return ReplayStart::kIssue;
  }
  virtual void forget_replay(uint64_t key) { (void)key; }

  // --- Uploads by a loader thread (the layerwise KV pipeline) ---
  // True when data loaded on the host should reach this backend's buffers
  // through host staging memory and upload() (a discrete GPU: page-locked
  // memory and a DMA copy), false when the host may write straight into
  // alloc_buffer() memory (the CPU; an integrated GPU such as Jetson, whose
  // buffers the host maps: zero-copy).
  virtual bool wants_staged_uploads() const { return false; }
  // Host memory that upload() copies from at full speed.  Throws
  // cb::Error(kOutOfMemory) when none is left.
  virtual void* alloc_host_staging(size_t bytes);
  virtual void free_host_staging(void* p);
  // Copies `bytes` from host memory `src` (ideally from alloc_host_staging),
  // or from this backend's alloc_buffer() memory (a copy within the
  // backend), to backend memory `dst`.  A GPU backend enqueues the copy on
  // the calling thread's own queue, separate from other threads' compute,
  // and returns at once; a thread's copies run in the order it issued them
  // (so one may read what an earlier one wrote).  The copy is complete, and
  // `src` may be rewritten, when a later op from the same thread outside a
  // batch returns, or after wait_uploads().
  virtual void upload(void* dst, const void* src, size_t bytes);
  // Waits for every upload() the calling thread has issued.  Returns the
  // time the copies themselves took since the previous call, in ms, as the
  // backend measured it (GPU events), or 0 when it cannot tell (the CPU,
  // where upload() is a memcpy and its time is the caller's to measure).
  virtual double wait_uploads() { return 0.0; }
  // Bytes of this backend's memory worth keeping retrieved chunks' KV in
  // between requests (SessionOptions::resident_kv_bytes), so that a
  // chunk loaded again is copied within the backend instead of staged and
  // uploaded; 0 where that gains nothing (the host's memory is the
  // backend's).
  virtual uint64_t resident_kv_bytes() const { return 0; }
};

// Runs ops(), which issues ops on `be`, and then ends the batch open on
// `be` (begin_batch or begin_replay).  When ops() throws, the batch is
// still ended and ops()'s error is the one that leaves: a failing
// end_batch() after it usually reports the same fault again.
template <class Ops>
void end_batch_after(Backend& be, Ops&& ops) {
  try {
    ops();
  } catch (...) {
    try {
      be.end_batch();
    } catch (...) {
    }
    throw;
  }
  be.end_batch();
}

// Runs ops() as one batch (begin_batch .. end_batch).
template <class Ops>
void run_batch(Backend& be, Ops&& ops) {
  be.begin_batch();
  end_batch_after(be, std::forward<Ops>(ops));
}

// n floats of backend memory src copied to host memory dst by an op (a
// one-row gather with a host output), so it works where the host cannot
// read backend memory itself (a discrete GPU's device memory).
void copy_to_host(Backend& be, const float* src, int64_t n, float* dst);

// Backend::top_k on the host, for host memory (the default implementation).
void top_k_indices(const float* values, int64_t n, int64_t k, int32_t* out);
// Backend::segment_means' argument check: n_seg + 1 host offsets from 0 up,
// each segment non-empty (kInvalidArgument otherwise).
void check_segments(const int32_t* seg, int64_t n_seg);

enum class CpuKernelLevel {
  kAuto,         // best the CPU supports (chosen once, at first use)
  kScalar,       // the reference kernels
  kAvx2,         // AVX2 + FMA + F16C
  kAvx2Vnni,     // kAvx2 + AVX-VNNI (VEX VPDPBUSD int8 GEMM)
  kAvx512,       // kAvx2 + AVX-512 F, BW, VL and VNNI (VNNI int8 GEMM and GEMV)
  kNeon,         // AArch64 Advanced SIMD
  kNeonDotprod,  // kNeon + the dot-product extension (SDOT int8 GEMM and GEMV)
};

// The CPU backend, running its ops on `n_threads` threads (0 = all cores).
// kAuto takes the level that the environment variable CB_CPU_KERNELS names
// where it is set (a name as parse_cpu_kernel_level reads it), else the
// best this CPU supports.  Error kUnsupported when the CPU or build lacks
// the level asked for (by `level` or CB_CPU_KERNELS), kInvalidArgument
// when CB_CPU_KERNELS names no level.
std::unique_ptr<Backend> make_cpu_backend(int n_threads,
                                          CpuKernelLevel level = CpuKernelLevel::kAuto);

// "auto", "scalar", "avx2", "avx2-vnni", "avx512", "neon", "neon-dotprod"
// as a level; false for any other name.
bool parse_cpu_kernel_level(std::string_view name, CpuKernelLevel* level);

// Name of the kernel level a CPU backend created with kAuto would use on this
// machine ("avx512", "avx2-vnni", "avx2", "neon-dotprod", "neon",
// "scalar"), for benchmarks to report.
// Errors as make_cpu_backend's.
const char* cpu_kernel_level_name();

}  // namespace cb
