// What the fusion tests on the real model share: a three-document RAG
// request whose chunks' KV is precomputed after the prompt head, and a chunk
// source that fails from a given layer on (for the fallback paths).
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/blend/fusor.h"
#include "runtime/blend/rag_request.h"
#include "runtime/session.h"

namespace cb::test {

// Fails (returns false, or throws) from layer fail_at on.
class FailingSource final : public cache::ChunkLayerSource {
 public:
  FailingSource(cache::ChunkLayerSource& inner, int64_t fail_at, bool throws = false)
      : inner_(inner), fail_at_(fail_at), throws_(throws) {}
  bool fetch_layer(int64_t layer, float* k, float* v) override {
    if (layer >= fail_at_) {
      if (throws_) throw std::runtime_error("injected read error");
      return false;
    }
    return inner_.fetch_layer(layer, k, v);
  }
  uint64_t layer_bytes(int64_t layer) const override { return inner_.layer_bytes(layer); }

 private:
  cache::ChunkLayerSource& inner_;
  int64_t fail_at_;
  bool throws_;
};

// Facts spread over three documents, so the question needs two of them.
inline RagPrompt lighthouse_prompt(const Model& model) {
  const std::vector<std::string> texts = {
      "The lighthouse on Kell Island was built in 1862 by the engineer Mara Voss.",
      "Mara Voss was born in the harbour town of Pellwick and trained in Glasgow.",
      "Pellwick lies on the northern coast and is known for its herring fleet."};
  return build_rag_prompt(model.tokenizer(), ChatFormat::kChatML, "Answer from the documents.",
                          texts, "Where was the builder of the Kell Island lighthouse born?");
}

// lighthouse_prompt() with each chunk's KV precomputed on the CPU.
struct LighthouseRequest {
  explicit LighthouseRequest(const Model& model) : prompt(lighthouse_prompt(model)) {
    Session scratch(model, {.n_ctx = 256, .n_threads = 2});
    for (const auto& c : prompt.chunks) kv.push_back(precompute_chunk_kv(scratch, prompt.head, c));
    for (const auto& k : kv) sources.push_back(std::make_unique<cache::MemoryChunkSource>(k));
  }

  // Head, the chunks with their cached KV (the first one an exact prefix),
  // then the question.
  std::vector<Segment> segments() const {
    std::vector<Segment> s = {{prompt.head}};
    for (size_t i = 0; i < prompt.chunks.size(); ++i)
      s.push_back({prompt.chunks[i], sources[i].get(), i == 0});
    s.push_back({prompt.suffix});
    return s;
  }

  RagPrompt prompt;
  std::vector<cache::ChunkKV> kv;
  std::vector<std::unique_ptr<cache::MemoryChunkSource>> sources;
};

}  // namespace cb::test
