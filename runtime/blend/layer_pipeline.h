// The layerwise load pipeline: while the fusor computes layer
// i, a loader thread reads and decodes layer i+1 (and further) of every
// cached chunk and RoPE-rotates its K, so storage time hides behind compute.
// With PipelineOptions::fetch_threads above one, the chunks of a layer are
// read by that many threads at once, each taking every n-th chunk.
//
// Where loads go: into the session's KV cache rows of the chunk.  That is
// race-free because the two sides never touch the same layer at once: the
// compute side reads or writes layer l's cache only after synchronize(l) has
// returned, and from then on the loader never writes layer l again (it only
// moves to later layers); the compute side's batches (Graph::execute) touch
// only layers already handed over.  On a backend that writes its buffers
// from the host at full speed (the CPU, an integrated GPU), fetch_layer
// writes the cache rows directly.  On one that wants staged uploads (a
// discrete GPU), it writes one of two host staging slots (one chunk's K and
// V of a layer each; two per fetching thread) and that thread upload()s
// the slot to the rows; the slots alternate so that the thread's next
// chunk's fetch runs while the copy is in flight.  Each fetching thread
// waits for its own copies before the layer's RoPE is issued (a GPU
// backend's copies are ordered per calling thread only).  The loader thread
// issues the RoPE (and the f16 store of K below) as one backend batch, which
// has completed when it ends, before the layer is handed over.
//
// An f16 KV cache (SessionOptions::kv_type) cannot take the sources' f32
// rows directly, nor be rotated in place without a second rounding.  V,
// which is not rotated, is rounded to f16 by the fetching thread as it is
// read (through a chunk-sized f32 buffer of that thread's) and written to
// the cache rows, or to the staging slot that is uploaded to them: half the
// bytes of f32 to copy.  K goes (fetched, or uploaded from staging) into an
// f32 buffer of the pipeline's, in backend memory, holding one layer's K of
// every cached chunk (chunks in request order: 4 bytes per element, 16 MiB
// for 8K cached tokens of a 1B Llama), is rotated there, and is then stored
// into the cache rows by Backend::scatter_rows_f16.  So each element is
// rounded once (after RoPE for K), to nearest even as every backend's f16
// store rounds, exactly as prefill stores it, and a chunk's cache rows are
// bitwise those a full prefill would write given the same f32 K and V.
//
// How far ahead: PipelineOptions::max_layers_ahead bounds the look-ahead
// (1 = classic double buffering).  The default is no bound: the first
// layers compute every row (layer 0 before the first check) and take many
// times longer than later ones, and an unbounded loader uses that time to
// get ahead instead of idling, so TTFT approaches max(load, compute).
//
// RoPE runs on the session's backend (the op the fusor used before the
// pipeline existed), so pipelined and serial fusion are bitwise identical.
// The CPU backend serializes ops issued from different threads on its pool.
//
// Chunks kept in backend memory (runtime/resident_chunks.h; staged loads
// only): a ready one is copied from there within the backend, without a
// fetch or staging; one being recorded is fetched and uploaded as above,
// then copied from the rows it landed in (K before RoPE, V as the cache
// holds it) into its entry by the same thread, and marked ready when the
// last layer has loaded.  Either way the cache rows get the same bytes.
//
// Errors: a chunk whose fetch_layer returns false or throws is reported by
// synchronize() as failed (for the fusor's restart with that chunk
// computed); other loader errors are rethrown by synchronize().  The loader
// thread is always stopped and joined by finish() or the destructor, also
// when the compute side leaves early by an exception.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cache/chunk_source.h"
#include "platform/thread_pool.h"
#include "runtime/resident_chunks.h"
#include "runtime/session.h"

namespace cb {

// How the fusion gets the cached chunks' layers.
struct PipelineOptions {
  // true: a loader thread loads later layers while a layer computes; false:
  // each layer is loaded just before it computes (the serial baseline).
  // Both give bitwise identical results.
  bool enabled = true;
  // How many layers the loader may be ahead of the layer computing; <= 0:
  // no bound (every layer has its place in the KV cache already).
  int64_t max_layers_ahead = 0;
  // Threads that read a layer's chunks at once, each its share of the
  // chunks (at most one per chunk; the loader thread is one of them).
  // Pipelined only: a serial load stays on the compute thread.  0 (auto):
  // one where the host's cores compute, up to 4 (half the hardware threads)
  // on a backend that wants staged uploads (a discrete GPU leaves the cores
  // idle, and its loads wait on the host copying or decoding the chunks
  // into staging memory).  Each source is read by one thread at a time, as
  // ChunkLayerSource allows; the stores are shared by concurrent requests
  // anyway.  The loading controller's load times are per thread, so more
  // threads make its ratio err high, never short of the loads.
  int fetch_threads = 0;
};

// A cached chunk's place in the request.
struct CachedChunkRef {
  cache::ChunkLayerSource* src = nullptr;
  int32_t begin = 0;  // first global position
  int32_t len = 0;    // tokens
  // Staged loads only (null: none): the chunk's copy in backend memory
  // (Session::resident_chunks()), loaded from when ready, else recorded
  // as the chunk is loaded from src.
  ResidentChunk* resident = nullptr;
};

struct PipelineLoadStats {
  uint64_t bytes_read = 0;      // stored bytes, per the sources' layer_bytes()
  uint64_t resident_bytes = 0;  // copied from resident chunks (not read from their sources)
  double fetch_ms = 0.0;   // fetch_layer: read + decode (+ throttle waits; f16 cache: V's rounding)
  double rope_ms = 0.0;    // rotating the loaded K (f16 cache: and storing it)
  double upload_ms = 0.0;  // staged copies, as the backend timed them (wait_uploads)
  double blocked_ms = 0.0;  // the compute side waiting in synchronize()
  int64_t layers_loaded = 0;
  // The loader's busy time (fetch_ms summed over the fetching threads).
  double load_ms() const { return fetch_ms + rope_ms; }
  void add(const PipelineLoadStats& o);
};

class LayerPipeline {
 public:
  // Starts the loader thread when opts.enabled and there are chunks.  The
  // session, the chunks' sources and the session's cache must outlive it.
  // Throws cb::Error(kOutOfMemory) when staging memory cannot be had.
  LayerPipeline(Session& s, std::vector<CachedChunkRef> chunks, const PipelineOptions& opts);
  ~LayerPipeline();
  LayerPipeline(const LayerPipeline&) = delete;
  LayerPipeline& operator=(const LayerPipeline&) = delete;

  // Returns once layer `layer` of every chunk is in the session's KV cache
  // (K rotated to its global position), loading it here when the pipeline
  // is off.  Layers must be asked for in increasing order.  false: chunk
  // failed_chunk() could not be read at this or an earlier layer; the
  // loader has stopped.
  bool synchronize(int64_t layer);
  size_t failed_chunk() const { return failed_chunk_; }

  // Stops and joins the loader; the stats are final afterwards.
  void finish();
  const PipelineLoadStats& stats() const { return stats_; }

 private:
  enum class LoadResult { kOk, kFailed, kStopped };
  LoadResult load_layer(int64_t layer, PipelineLoadStats& st, size_t& failed);
  // Fetches (and stages) chunks task, task + n_tasks, ... of the layer.
  struct FetchResult {
    PipelineLoadStats st;
    size_t failed = SIZE_MAX;  // the first chunk that could not be read
    bool stopped = false;
  };
  FetchResult fetch_chunks(int64_t layer, int64_t task, int64_t n_tasks);
  bool stop_requested();
  float* layer_k_rows(int64_t layer);       // where the layer's K rows land
  int64_t first_k_row(size_t chunk) const;  // the chunk's first row there
  void loader_main();

  Session& s_;
  std::vector<CachedChunkRef> chunks_;
  PipelineOptions opts_;
  int64_t n_layers_;
  // Set before the loader starts (thread_ itself is written by the
  // constructor while the loader may already run, so it is not read there).
  bool threaded_;
  int fetchers_ = 1;                        // fetch threads (PipelineOptions::fetch_threads)
  std::unique_ptr<ThreadPool> fetch_pool_;  // fetchers_ > 1: the loader thread and helpers
  std::vector<int32_t> pos_;                // used by whichever single thread loads
  // Staged loads only: two slots of slot_bytes_ per fetch thread, freed by
  // finish().  Every copy from them has completed when load_layer() returns.
  struct StagingFree {
    Backend* be;
    void operator()(void* p) const { be->free_host_staging(p); }
  };
  std::unique_ptr<void, StagingFree> staging_;
  size_t slot_bytes_ = 0;
  // f16 cache only: the f32 K rows of one layer of every chunk, freed by
  // the destructor; chunk c's rows start at row_offset_[c].  all_pos_: the
  // global positions of those rows.  v_f32_: per fetching thread, where a
  // chunk's V is read before it is rounded to f16.
  struct BufferFree {
    Backend* be;
    void operator()(void* p) const { be->free_buffer(p); }
  };
  std::unique_ptr<void, BufferFree> k_rows_;
  std::vector<int64_t> row_offset_;
  int64_t total_rows_ = 0;
  std::vector<int32_t> all_pos_;
  std::vector<std::vector<float>> v_f32_;

  // Shared with the loader thread, guarded by mu_.
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t loaded_ = 0;     // layers [0, loaded_) are complete
  int64_t consumer_ = -1;  // the last layer synchronize() was asked for
  bool failed_ = false;
  bool stop_ = false;
  std::exception_ptr error_;
  PipelineLoadStats loader_stats_;

  size_t failed_chunk_ = 0;
  PipelineLoadStats stats_;  // compute side's copy (blocked time; the rest at finish)
  bool finished_ = false;
  std::thread thread_;
};

}  // namespace cb
