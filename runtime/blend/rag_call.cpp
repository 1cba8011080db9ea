#include "runtime/blend/rag_call.h"

#include "platform/error.h"
#include "runtime/sampler.h"

namespace cb {

namespace {

void require(bool ok, const char* message) {
  if (!ok) fail(ErrorCode::kInvalidArgument, message);
}

// The ratio a request ran at: the controller's choice, or the schedule's
// first check, raised when the guard raised it.
float reported_ratio(const RagPrefillOptions& o, const RagPrefillStats& rs) {
  switch (o.blend.mode) {
    case BlendMode::kFull:
      return 1.0f;
    case BlendMode::kBlend:
      if (rs.fusion.guard_raised) return static_cast<float>(rs.fusion.ratio);
      return rs.choice ? static_cast<float>(rs.choice->ratio) : o.blend.schedule.front().ratio;
    default:
      return 0.0f;
  }
}

}  // namespace

RagCallResult run_rag_call(Session& s, ChunkCache* cache, RagCall call) {
  RagPrefillOptions& ro = call.options;
  if (ro.blend.schedule.empty())
    ro.blend.schedule = single_check_schedule(ro.blend.selection, call.ratio);
  require(ro.blend.mode == BlendMode::kFull || cache != nullptr,
          "cache is NULL (only CB_MODE_FULL runs without a chunk cache)");
  if (call.auto_ratio) {
    require(ro.blend.mode == BlendMode::kBlend, "auto_ratio needs CB_MODE_BLEND");
    require(cache != nullptr && cache->store() != nullptr,
            "auto_ratio needs a chunk cache on flash (cb_chunk_cache_open)");
    ro.min_ratio = call.ratio;  // the quality floor
  }
  const Model& model = s.model();
  {
    // Checked before any work, in every mode: a bad ratio is the caller's
    // bug even where it is not used.
    BlendOptions check = ro.blend;
    check.mode = BlendMode::kBlend;
    validate_blend_options(check, model.hparams().n_layer);
  }
  const RagPrompt prompt = build_rag_prompt(model.tokenizer(), model.chat_format(),
                                            call.system_prompt, call.chunk_texts, call.question);
  RagCallResult r;
  try {
    r.logits = cache != nullptr
                   ? cache->prefill(s, prompt, ro, call.auto_ratio, call.n_threads, &r.stats)
                   : rag_prefill(s, prompt, nullptr, ro, &r.stats);
    check_logits(r.logits);  // as generation: NaN logits are an error, not an answer
  } catch (...) {
    s.truncate(0);  // whatever happened, the session is left empty
    throw;
  }
  r.ratio = reported_ratio(ro, r.stats);
  return r;
}

}  // namespace cb
