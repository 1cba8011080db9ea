// The chunk cache of a RAG app: where its chunks' KV lives (in RAM, or in the
// chunk-KV store on flash) and, on flash, what the loading controller has
// learnt per device and model, persisted beside the store.  The C API's
// cb_chunk_cache is one of these.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "cache/flash_store.h"
#include "cache/write_back_queue.h"
#include "runtime/blend/calibration.h"
#include "runtime/blend/chunk_store.h"
#include "runtime/blend/flash_chunk_store.h"
#include "runtime/blend/loading_controller.h"
#include "runtime/blend/rag_request.h"
#include "runtime/session.h"

namespace cb {

class ChunkCache {
 public:
  // In RAM.
  ChunkCache();
  // In the chunk-KV store at `dir` (created if missing).  A positive
  // assumed_read_bytes_per_sec pins the store's read speed for the loading
  // controller; 0 lets it be measured.
  ChunkCache(const std::string& dir, const cache::StoreOptions& opts,
             double assumed_read_bytes_per_sec);
  // Pending store writes and calibration saves finish first; a failure
  // then has nowhere to go, and what it concerns is simply absent.
  ~ChunkCache();
  ChunkCache(const ChunkCache&) = delete;
  ChunkCache& operator=(const ChunkCache&) = delete;

  ChunkStore& kv() { return flash_ ? static_cast<ChunkStore&>(*flash_) : table_; }
  // The store on flash; null in RAM.
  cache::FlashStore* store() { return flash_ ? &flash_->store() : nullptr; }
  const cache::FlashStore* store() const { return flash_ ? &flash_->store() : nullptr; }
  // Entries and bytes; on flash the store's whole statistics.
  cache::StoreStats stats() const;
  void clear();
  // Returns once queued store writes and calibration saves are done.
  void flush();

  // A RAG prefill of `prompt` into the empty session `s` (runtime/blend/
  // rag_request.h), after checking every chunk and the whole request
  // against the context (kContextOverflow saying which).  With
  // `auto_ratio` (flash only) the loading controller of this device (named
  // from the backend and `n_threads`) and model picks the ratio, with
  // opts.min_ratio as its floor; it is calibrated by a short probe in `s` at
  // first use, and what it learns is saved beside the store off the path to
  // the first token.  Whatever fails, the session is left empty.
  std::span<const float> prefill(Session& s, const RagPrompt& prompt, RagPrefillOptions opts,
                                 bool auto_ratio, int n_threads, RagPrefillStats* stats);

 private:
  LoadingController& controller_for(Session& s, const std::string& device);

  RamChunkStore table_;
  std::unique_ptr<FlashChunkStore> flash_;
  double assumed_read_bytes_per_sec_ = 0.0;
  std::mutex auto_mu_;  // serializes auto-ratio requests: the controller learns from each
  std::unique_ptr<CalibrationDb> calibration_db_;
  std::map<std::string, std::unique_ptr<LoadingController>> controllers_;
  // Calibration saves, one worker; declared last so that it finishes (and
  // stops) before the database closes.
  std::unique_ptr<cache::WriteBackQueue> saves_;
};

}  // namespace cb
