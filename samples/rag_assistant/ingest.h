// `rag_assistant ingest`: text and Markdown files into the store.
#pragma once

#include <string>
#include <vector>

#include "app.h"

namespace rag {

struct IngestOptions {
  std::vector<std::string> paths;  // files and folders (walked recursively)
  size_t chunk_tokens = 512;       // target chunk length
  bool prune = false;              // drop stored files that no longer exist
  bool json = false;               // the summary as one JSON object
};

// Chunks and indexes every usable file (unchanged files are skipped by
// content hash), then precomputes the KV of every chunk not yet in the chunk
// store.  Unusable files (missing, unreadable, binary, empty) are skipped
// with a warning; an Error when nothing usable was found.  Returns the exit
// status.
int run_ingest(const CommonOptions& common, const IngestOptions& opts);

}  // namespace rag
