// Looking after a store: `list` its files, `remove` some, `status`, and
// `--version`.
#pragma once

#include <string>
#include <vector>

#include "app.h"
#include "corpus_db.h"

namespace rag {

// Every stored file (name, path, chunks, tokens, whether its chunks' KV is
// cached for the model), then the totals and the models the KV was computed
// with.  Returns the exit status.
int run_list(const CommonOptions& common, bool json);

// Drops the files `args` name from the corpus and their chunks' KV (for the
// model) from the chunk KV store.  Every argument must name a stored file
// (else an Error, and nothing is removed).  Returns the exit status.
int run_remove(const CommonOptions& common, const std::vector<std::string>& args, bool json);

// The store's state: its files, chunks and tokens, the KV store's size and
// capacity, the model and whether its KV is there, tiers, read-only state,
// the settings.  Returns the exit status.
int run_status(const CommonOptions& common, bool json);

// rag_assistant's version and the library's (cb_version); exit status 0.
int run_version();

// The stored files that `args` name, each argument either a path (resolved
// as ingest resolves it: absolute, symbolic links followed), a folder (every
// stored file under it) or a file's display name as `list` shows it.
// Throws an Error naming every argument that names no stored file, and one
// display name that fits several files (give the path).  No file appears
// twice in the result.
std::vector<FileRecord> resolve_stored_files(const std::vector<FileRecord>& stored,
                                             const std::vector<std::string>& args);

}  // namespace rag
