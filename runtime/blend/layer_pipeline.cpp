#include "runtime/blend/layer_pipeline.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>

#include "platform/cancel.h"
#include "platform/cpu_features.h"
#include "platform/error.h"
#include "platform/half.h"
#include "runtime/llama_layer.h"

namespace cb {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Waits, when a load ends early (a stop, a failed chunk, an error), for the
// copies still reading the staging slots, which finish() may free next.
// Their data is discarded then, so an error of the wait is too.
struct UploadDrain {
  Backend* in_flight = nullptr;
  ~UploadDrain() {
    if (!in_flight) return;
    try {
      in_flight->wait_uploads();
    } catch (...) {
    }
  }
};

}  // namespace

void PipelineLoadStats::add(const PipelineLoadStats& o) {
  bytes_read += o.bytes_read;
  resident_bytes += o.resident_bytes;
  fetch_ms += o.fetch_ms;
  rope_ms += o.rope_ms;
  upload_ms += o.upload_ms;
  blocked_ms += o.blocked_ms;
  layers_loaded += o.layers_loaded;
}

LayerPipeline::LayerPipeline(Session& s, std::vector<CachedChunkRef> chunks,
                             const PipelineOptions& opts)
    : s_(s),
      chunks_(std::move(chunks)),
      opts_(opts),
      n_layers_(s.model().hparams().n_layer),
      threaded_(opts.enabled && !chunks_.empty()),
      staging_(nullptr, StagingFree{&s.backend()}),
      k_rows_(nullptr, BufferFree{&s.backend()}) {
  if (opts.fetch_threads < 0)
    fail(ErrorCode::kInvalidArgument,
         "fetch_threads " + std::to_string(opts.fetch_threads) + ": at least 0 (0: auto)");
  if (threaded_) {
    const int asked = opts.fetch_threads > 0 ? opts.fetch_threads
                      : s.backend().wants_staged_uploads()
                          ? std::clamp(cpu_hardware_threads() / 2, 1, 4)
                          : 1;
    fetchers_ = static_cast<int>(std::min<int64_t>(asked, static_cast<int64_t>(chunks_.size())));
    // Two chunk references to one source would read it from two threads.
    for (size_t i = 0; i < chunks_.size() && fetchers_ > 1; ++i)
      for (size_t j = i + 1; j < chunks_.size(); ++j)
        if (chunks_[i].src == chunks_[j].src) fetchers_ = 1;
  }
  const int64_t kv_dim = s.model().hparams().kv_dim();
  int32_t longest = 0;
  for (const CachedChunkRef& c : chunks_) longest = std::max(longest, c.len);
  if (s.kv_dtype() == DType::F16 && !chunks_.empty()) {
    for (const CachedChunkRef& c : chunks_) {
      row_offset_.push_back(total_rows_);
      total_rows_ += c.len;
      for (int32_t p = c.begin; p < c.begin + c.len; ++p) all_pos_.push_back(p);
    }
    k_rows_.reset(
        s.backend().alloc_buffer(static_cast<size_t>(total_rows_ * kv_dim) * sizeof(float)));
    v_f32_.resize(static_cast<size_t>(fetchers_));
    for (std::vector<float>& v : v_f32_) v.resize(static_cast<size_t>(longest * kv_dim));
  }
  if (s.backend().wants_staged_uploads() && !chunks_.empty()) {
    // K as f32; V as f32, or as the f16 rows of an f16 cache.  Slots start
    // 64-byte aligned, whatever the row length.
    const size_t bytes = static_cast<size_t>(longest * kv_dim) *
                         (sizeof(float) + (k_rows_ ? sizeof(uint16_t) : sizeof(float)));
    slot_bytes_ = (bytes + 63) / 64 * 64;
    staging_.reset(
        s.backend().alloc_host_staging(2 * static_cast<size_t>(fetchers_) * slot_bytes_));
  }
  if (fetchers_ > 1) fetch_pool_ = std::make_unique<ThreadPool>(fetchers_);
  if (threaded_) thread_ = std::thread([this] { loader_main(); });
}

LayerPipeline::~LayerPipeline() {
  finish();
}

bool LayerPipeline::stop_requested() {
  if (!threaded_) return false;
  std::lock_guard lock(mu_);
  return stop_;
}

// Where a layer's K rows land: the cache rows themselves (f32), or the f32
// buffer that is rotated and rounded into the cache after the fetches.
float* LayerPipeline::layer_k_rows(int64_t layer) {
  if (k_rows_) return static_cast<float*>(k_rows_.get());
  return static_cast<float*>(s_.k_cache(layer));
}

int64_t LayerPipeline::first_k_row(size_t c) const {
  return k_rows_ ? row_offset_[c] : static_cast<int64_t>(chunks_[c].begin);
}

LayerPipeline::FetchResult LayerPipeline::fetch_chunks(int64_t layer, int64_t task,
                                                       int64_t n_tasks) {
  FetchResult r;
  Backend& be = s_.backend();
  const int64_t kv_dim = s_.model().hparams().kv_dim();
  float* const k_base = layer_k_rows(layer);
  // An f16 cache takes V as it is fetched, rounded once (V is not rotated);
  // only K goes through the f32 rows buffer.
  const bool v_f16 = k_rows_ != nullptr;
  const size_t v_elem = v_f16 ? sizeof(uint16_t) : sizeof(float);
  char* const v_base = static_cast<char*>(s_.v_cache(layer));
  UploadDrain drain;
  int slot = 0;
  for (size_t c = static_cast<size_t>(task); c < chunks_.size();
       c += static_cast<size_t>(n_tasks)) {
    // Between chunks, so a finish() during a long (throttled) layer waits
    // for one chunk's read at most.
    if (stop_requested()) {
      r.stopped = true;
      return r;
    }
    const CachedChunkRef& ch = chunks_[c];
    const size_t n = static_cast<size_t>(ch.len * kv_dim);
    float* const k_rows = k_base + first_k_row(c) * kv_dim;
    char* const v_rows = v_base + static_cast<size_t>(ch.begin * kv_dim) * v_elem;
    ResidentChunk* const resident = staging_ ? ch.resident : nullptr;
    if (resident && resident->ready) {
      drain.in_flight = &be;
      be.upload(k_rows, resident->k(layer), n * sizeof(float));
      be.upload(v_rows, resident->v(layer), n * v_elem);
      r.st.resident_bytes += n * (sizeof(float) + v_elem);
      continue;
    }
    // Where fetch_layer writes, and where the rows are uploaded from.
    float* k = k_rows;
    char* v_out = v_rows;
    if (staging_) {
      char* const slot_start =
          static_cast<char*>(staging_.get()) + static_cast<size_t>(2 * task + slot) * slot_bytes_;
      slot ^= 1;
      k = reinterpret_cast<float*>(slot_start);
      v_out = slot_start + n * sizeof(float);
    }
    float* const v =
        v_f16 ? v_f32_[static_cast<size_t>(task)].data() : reinterpret_cast<float*>(v_out);
    const auto t0 = Clock::now();
    bool ok = false;
    try {
      ok = ch.src->fetch_layer(layer, k, v);
    } catch (...) {
      // A source that throws (I/O error, bad blob) is a chunk that cannot be
      // read, like one that returns false: the request computes it instead.
      ok = false;
    }
    if (ok && v_f16) f32_to_f16_n(v, v_out, n);
    r.st.fetch_ms += ms_since(t0);
    if (!ok) {
      // This thread's later chunks are not needed: the request restarts.
      r.failed = c;
      return r;
    }
    r.st.bytes_read += ch.src->layer_bytes(layer);
    if (staging_) {
      // The previous chunk's copies ran during this fetch; once they are
      // done, their slot is free for the next chunk.
      r.st.upload_ms += be.wait_uploads();
      drain.in_flight = &be;
      be.upload(k_rows, k, n * sizeof(float));
      be.upload(v_rows, v_out, n * v_elem);
      if (resident) {
        // After the copies above on this thread's queue, before the RoPE.
        be.upload(resident->k(layer), k_rows, n * sizeof(float));
        be.upload(resident->v(layer), v_rows, n * v_elem);
      }
    }
  }
  if (staging_) {
    // The layer's RoPE is issued by the loader thread, after this returns.
    r.st.upload_ms += be.wait_uploads();
    drain.in_flight = nullptr;
  }
  return r;
}

LayerPipeline::LoadResult LayerPipeline::load_layer(int64_t layer, PipelineLoadStats& st,
                                                    size_t& failed) {
  const auto& hp = s_.model().hparams();
  Backend& be = s_.backend();
  const int64_t kv_dim = hp.kv_dim();
  std::vector<FetchResult> fetched(static_cast<size_t>(fetchers_));
  if (fetch_pool_) {
    fetch_pool_->parallel_for(fetchers_, [&](int64_t task, int thread) {
      // A helper's read waiting on a slow store ends with the pipeline, as
      // the loader thread's does (loader_main).
      std::optional<ScopedCancelCheck> cancel;
      if (thread != 0) cancel.emplace([this] { return stop_requested(); });
      fetched[static_cast<size_t>(task)] = fetch_chunks(layer, task, fetchers_);
    });
  } else {
    fetched[0] = fetch_chunks(layer, 0, 1);
  }
  bool stopped = false;
  size_t first_failed = SIZE_MAX;
  for (const FetchResult& r : fetched) {
    st.add(r.st);
    stopped = stopped || r.stopped;
    first_failed = std::min(first_failed, r.failed);
  }
  if (stopped) return LoadResult::kStopped;
  if (first_failed != SIZE_MAX) {
    failed = first_failed;
    return LoadResult::kFailed;
  }
  // One rotation per run of adjacent chunks (usually the whole run of
  // retrieved chunks): RoPE is row-wise, so this equals rotating chunk by
  // chunk, and each backend call costs the loader a turn on the backend's
  // thread pool, which it shares with the compute side.  (Adjacent chunks
  // are adjacent in the f16 path's rows buffer too: it keeps their order.)
  float* const k_base = layer_k_rows(layer);
  const auto t1 = Clock::now();
  // One backend batch: a GPU backend waits once for the layer's ops, when
  // it ends, instead of after each.
  run_batch(be, [&] {
    for (size_t c = 0; c < chunks_.size();) {
      const int32_t begin = chunks_[c].begin;
      const int64_t row = first_k_row(c);
      int32_t end = begin + chunks_[c].len;
      for (++c; c < chunks_.size() && chunks_[c].begin == end; ++c) end += chunks_[c].len;
      pos_.resize(static_cast<size_t>(end - begin));
      std::iota(pos_.begin(), pos_.end(), begin);
      rope_keys(be, hp, layer, s_.layer_weights()[static_cast<size_t>(layer)],
                k_base + row * kv_dim, pos_.data(), end - begin);
    }
    if (k_rows_)
      store_kv_rows(be, DType::F16, k_base, kv_dim, all_pos_.data(), total_rows_,
                    s_.k_cache(layer));
  });
  st.rope_ms += ms_since(t1);
  ++st.layers_loaded;
  // Every layer of the recorded chunks is in their entries now: each
  // fetching thread has waited for its copies.
  if (layer == n_layers_ - 1)
    for (const CachedChunkRef& c : chunks_)
      if (staging_ && c.resident) c.resident->ready = true;
  return LoadResult::kOk;
}

void LayerPipeline::loader_main() {
  // A read waiting on a slow store ends when the pipeline stops (a
  // cancelled or failed request), not when the store gives up.
  ScopedCancelCheck cancel([this] { return stop_requested(); });
  for (int64_t l = 0; l < n_layers_; ++l) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || opts_.max_layers_ahead <= 0 || l <= consumer_ + opts_.max_layers_ahead;
      });
      if (stop_) return;
    }
    size_t failed = 0;
    LoadResult r = LoadResult::kStopped;
    std::exception_ptr err;
    try {
      r = load_layer(l, loader_stats_, failed);
    } catch (...) {
      err = std::current_exception();
    }
    if (r == LoadResult::kStopped && !err) return;
    {
      std::lock_guard lock(mu_);
      if (err) {
        error_ = err;
      } else if (r == LoadResult::kFailed) {
        failed_ = true;
        failed_chunk_ = failed;
      } else {
        loaded_ = l + 1;
      }
    }
    cv_.notify_all();
    if (err || r == LoadResult::kFailed) return;
  }
}

bool LayerPipeline::synchronize(int64_t layer) {
  if (finished_) return false;
  if (!threaded_) {
    if (chunks_.empty()) return true;
    // Serial: the compute side loads the layer itself and waits all along.
    const auto t0 = Clock::now();
    const LoadResult r = load_layer(layer, stats_, failed_chunk_);
    stats_.blocked_ms += ms_since(t0);
    return r == LoadResult::kOk;
  }
  const auto t0 = Clock::now();
  std::unique_lock lock(mu_);
  consumer_ = layer;
  cv_.notify_all();  // a bounded loader may go on
  cv_.wait(lock, [&] { return loaded_ > layer || failed_ || error_; });
  stats_.blocked_ms += ms_since(t0);
  if (loaded_ > layer) return true;
  if (error_) std::rethrow_exception(error_);
  // failed_chunk_ was written by the loader under mu_, which we hold.
  return false;
}

void LayerPipeline::finish() {
  if (finished_) return;
  finished_ = true;
  if (threaded_) {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    // The loader's counters are its own until the join.
    stats_.add(loader_stats_);
  }
  fetch_pool_.reset();
  staging_.reset();
}

}  // namespace cb
