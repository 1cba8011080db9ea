// What a store records about how its chunk KV was computed, and what the
// app says when a command runs with something else: the system prompt (part
// of every chunk's cache key) and the models whose KV an ingest computed
// (the library keys chunk KV by model, so another model misses every chunk).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "app.h"
#include "corpus_db.h"

namespace rag {

// The model file's identity: its name, its size, a fingerprint (the size and
// an XXH3 hash of its first and last MiB: cheap, and no two released model
// files share them) and the model's own description.  Throws an Error when
// the file cannot be read.
ModelRecord model_identity(const std::string& model_path, const Model& model);

// The model file the store's last ingest used, recorded as an absolute
// path; commands without --model or $CB_MODEL load it while it exists.
void record_store_model(CorpusDb& db, const std::string& model_path);
// That path; empty when the store or the record does not exist.
std::string recorded_model_path(const std::string& store);

// The system prompt of the store's chunk KV: the recorded one, else the
// default (a store from before it was recorded used the default).
std::string store_system_prompt(CorpusDb& db);

// Whether `model` is one of the models whose KV an ingest computed.
bool has_kv_for(const std::vector<ModelRecord>& kv_models, const ModelRecord& model);

// The warning for a model that is not among `kv_models` (nothing when it
// is, or when the store records no model: a store from before models were
// recorded).  `model_path` is the path the command was given, for the
// ingest command it suggests.
std::optional<std::string> other_model_warning(const std::string& store,
                                               const std::vector<ModelRecord>& kv_models,
                                               const ModelRecord& model,
                                               const std::string& model_path);

// The warning for ask/chat --system `given`, other than the store's `stored`.
std::string other_system_prompt_warning(const std::string& store, const std::string& stored,
                                        const std::string& given);

// `s` as one word for a POSIX shell (single-quoted where needed), for the
// commands that warnings suggest.
std::string shell_quote(const std::string& s);

// The file names of the models, most recent first, comma-separated.
std::string model_names(const std::vector<ModelRecord>& kv_models);

}  // namespace rag
