// `rag_assistant ingest`: documents (see text_extract.h) into the store.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "app.h"
#include "kv_store.h"

namespace rag {

constexpr size_t kDefaultChunkTokens = 512;

struct IngestOptions {
  std::vector<std::string> paths;  // files and folders (walked recursively)
  // Target chunk length; 0: the store's (the one its last ingest used), else
  // kDefaultChunkTokens.
  size_t chunk_tokens = 0;
  // Larger files are skipped with a warning (a bound on memory and time).
  uint64_t max_file_bytes = uint64_t{16} << 20;
  bool prune = false;          // drop stored files that no longer exist
  bool json = false;           // the summary as one JSON object
  KvWhen kv = KvWhen::kEager;  // --kv: when the chunks' KV is computed
  // --kv-codec and --kv-store-mb: recorded as the store's settings; none:
  // the store's (its defaults on a new store).
  std::optional<cb_codec> codec;
  std::optional<uint64_t> capacity_bytes;
  // --kv-neighbours on|off: recorded as the store's setting; none: the
  // store's (off on a new store).
  std::optional<bool> neighbours;
};

// Chunks and indexes every usable file (unchanged files are skipped by
// content hash), then precomputes the KV of every chunk not yet in the chunk
// store.  Unusable files (missing, unreadable, binary, empty, corrupt,
// encrypted) are skipped with a warning; an Error when nothing usable was
// found.  Returns the exit status.
int run_ingest(const CommonOptions& common, const IngestOptions& opts);

}  // namespace rag
