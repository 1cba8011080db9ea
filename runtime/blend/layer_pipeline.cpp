#include "runtime/blend/layer_pipeline.h"

#include <chrono>
#include <numeric>

namespace cb {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

LayerPipeline::LayerPipeline(Session& s, std::vector<CachedChunkRef> chunks,
                             const PipelineOptions& opts)
    : s_(s),
      chunks_(std::move(chunks)),
      opts_(opts),
      n_layers_(s.model().hparams().n_layer),
      threaded_(opts.enabled && !chunks_.empty()) {
  if (threaded_) thread_ = std::thread([this] { loader_main(); });
}

LayerPipeline::~LayerPipeline() {
  finish();
}

LayerPipeline::LoadResult LayerPipeline::load_layer(int64_t layer, PipelineLoadStats& st,
                                                    size_t& failed) {
  const auto& hp = s_.model().hparams();
  const int64_t kv_dim = hp.kv_dim();
  float* kc = s_.k_cache(layer);
  float* vc = s_.v_cache(layer);
  for (size_t c = 0; c < chunks_.size(); ++c) {
    if (threaded_) {
      // Between chunks, so a finish() during a long (throttled) layer waits
      // for one chunk's read at most.
      std::lock_guard lock(mu_);
      if (stop_) return LoadResult::kStopped;
    }
    const CachedChunkRef& ch = chunks_[c];
    const auto t0 = Clock::now();
    bool ok = false;
    try {
      ok = ch.src->fetch_layer(layer, kc + static_cast<int64_t>(ch.begin) * kv_dim,
                               vc + static_cast<int64_t>(ch.begin) * kv_dim);
    } catch (...) {
      // A source that throws (I/O error, bad blob) is a chunk that cannot be
      // read, like one that returns false: the request computes it instead.
      ok = false;
    }
    st.fetch_ms += ms_since(t0);
    if (!ok) {
      failed = c;
      return LoadResult::kFailed;
    }
    st.bytes_read += ch.src->layer_bytes(layer);
  }
  // One rotation per run of adjacent chunks (usually the whole run of
  // retrieved chunks): RoPE is row-wise, so this equals rotating chunk by
  // chunk, and each backend call costs the loader a turn on the backend's
  // thread pool, which it shares with the compute side.
  const auto t1 = Clock::now();
  for (size_t c = 0; c < chunks_.size();) {
    const int32_t begin = chunks_[c].begin;
    int32_t end = begin + chunks_[c].len;
    for (++c; c < chunks_.size() && chunks_[c].begin == end; ++c) end += chunks_[c].len;
    pos_.resize(static_cast<size_t>(end - begin));
    std::iota(pos_.begin(), pos_.end(), begin);
    s_.backend().rope(kc + static_cast<int64_t>(begin) * kv_dim, pos_.data(), end - begin,
                      hp.n_head_kv, hp.head_dim, hp.rot_dim, hp.rope_freq_base);
  }
  st.rope_ms += ms_since(t1);
  ++st.layers_loaded;
  return LoadResult::kOk;
}

void LayerPipeline::loader_main() {
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
  if (!threaded_) return;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  // The loader's counters are its own until the join.
  stats_.bytes_read += loader_stats_.bytes_read;
  stats_.fetch_ms += loader_stats_.fetch_ms;
  stats_.rope_ms += loader_stats_.rope_ms;
  stats_.layers_loaded += loader_stats_.layers_loaded;
}

}  // namespace cb
