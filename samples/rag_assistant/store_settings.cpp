#include "store_settings.h"

#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

namespace rag {
namespace {

// Enough to cover a GGUF file's header and metadata (tokenizer included) at
// the start and its last tensor's data at the end.
constexpr std::streamoff kFingerprintSpan = std::streamoff{1} << 20;

constexpr const char* kModelPathKey = "model_path";

}  // namespace

ModelRecord model_identity(const std::string& model_path, const Model& model) {
  ModelRecord r;
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(model_path, ec);
  if (ec) throw Error("cannot read the model file '" + model_path + "': " + ec.message());
  std::ifstream in(model_path, std::ios::binary);
  if (!in) throw Error("cannot read the model file '" + model_path + "': " + std::strerror(errno));
  const auto file_size = static_cast<std::streamoff>(size);
  const std::streamoff head = std::min(file_size, kFingerprintSpan);
  const std::streamoff tail_start = std::max(head, file_size - kFingerprintSpan);
  std::string bytes(static_cast<size_t>(head + (file_size - tail_start)), '\0');
  in.read(bytes.data(), head);
  in.seekg(tail_start);
  in.read(bytes.data() + head, file_size - tail_start);
  if (!in) throw Error("cannot read the model file '" + model_path + "'");
  char buf[40];
  std::snprintf(buf, sizeof buf, "%llx-%016llx", static_cast<unsigned long long>(size),
                static_cast<unsigned long long>(XXH3_64bits(bytes.data(), bytes.size())));
  r.fingerprint = buf;
  r.file_name = std::filesystem::path(model_path).filename().string();
  r.file_size = size;

  cb_model_info info;
  cb_model_info_init(&info);
  check(cb_model_get_info(model.h, &info), "cannot read the model's info");
  r.description = std::string(info.name) + " (" + info.architecture + ", " +
                  std::to_string(info.n_layer) + " layers, " + std::to_string(info.n_embd) +
                  " wide)";
  r.ingested_at = static_cast<int64_t>(std::time(nullptr));
  return r;
}

void record_store_model(CorpusDb& db, const std::string& model_path) {
  db.set_setting(kModelPathKey, std::filesystem::absolute(model_path).lexically_normal().string());
}

std::string recorded_model_path(const std::string& store) {
  std::error_code ec;
  if (!std::filesystem::exists(corpus_db_path(store), ec)) return "";
  CorpusDb db(corpus_db_path(store), false);
  return db.setting(kModelPathKey).value_or("");
}

std::string store_system_prompt(CorpusDb& db) {
  return db.system_prompt().value_or(default_system_prompt());
}

bool has_kv_for(const std::vector<ModelRecord>& kv_models, const ModelRecord& model) {
  for (const ModelRecord& m : kv_models)
    if (m.fingerprint == model.fingerprint) return true;
  return false;
}

std::string model_names(const std::vector<ModelRecord>& kv_models) {
  std::string out;
  for (const ModelRecord& m : kv_models) out += (out.empty() ? "" : ", ") + m.file_name;
  return out;
}

std::optional<std::string> other_model_warning(const std::string& store,
                                               const std::vector<ModelRecord>& kv_models,
                                               const ModelRecord& model,
                                               const std::string& model_path) {
  if (kv_models.empty() || has_kv_for(kv_models, model)) return std::nullopt;
  return "the store's KV was computed with " + model_names(kv_models) + "; " + model.file_name +
         " will recompute every chunk (slow); run `rag_assistant --store " + store + " --model " +
         model_path + " ingest` to precompute for it";
}

std::string shell_quote(const std::string& s) {
  const bool plain = !s.empty() && s.find_first_not_of(
                                       "abcdefghijklmnopqrstuvwxyz"
                                       "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                       "0123456789_-.,/:+=@%") == std::string::npos;
  if (plain) return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string other_system_prompt_warning(const std::string& store, const std::string& stored,
                                        const std::string& given) {
  return "the chunks' KV was computed for another system prompt (\"" + stored +
         "\"): with this --system every chunk is computed again (slow); to make it the store's, "
         "run `rag_assistant --store " +
         shell_quote(store) + " ingest --system " + shell_quote(given) + "`";
}

}  // namespace rag
