// A retrieval-augmented request as an application makes it (the C API's
// cb_rag_prefill translates to this): the chunks' texts and a question,
// options checked before any work, one path whether or not a chunk cache
// is given, and the ratio the request ran at.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/blend/chunk_cache.h"
#include "runtime/blend/rag_request.h"

namespace cb {

struct RagCall {
  std::span<const std::string> chunk_texts;
  std::string_view question;
  std::string_view system_prompt;  // empty: the chat template's own
  RagPrefillOptions options;       // options.blend.schedule empty: one check at `ratio`
  float ratio = kDefaultRatio;
  // The loading controller picks the ratio (blend mode, a cache on flash);
  // `ratio` is then its floor.
  bool auto_ratio = false;
  int n_threads = 0;  // names the device's controller with the backend
};

struct RagCallResult {
  std::span<const float> logits;  // the last token's, valid until the session's next call
  RagPrefillStats stats;
  float ratio = 0.0f;  // 1 for full prefill, 0 for reuse and prefix, else the blend's
};

// Prefills the empty session `s` with the request (at least one chunk),
// through `cache` (may be null in full mode only).  Throws kInvalidArgument for options that do not
// fit together (checked in every mode, also where unused) and what the
// prefill throws; the session is left empty whenever it throws.
RagCallResult run_rag_call(Session& s, ChunkCache* cache, RagCall call);

}  // namespace cb
