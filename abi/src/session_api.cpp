// The C API of sessions and generation: translation and checks only.
#include <algorithm>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "api.h"
#include "platform/thread_pool.h"
#include "runtime/sampler.h"
#include "runtime/stop_strings.h"

using namespace cb::api;

namespace {

cb_stop_reason stop_reason_of(cb::StopReason r) {
  switch (r) {
    case cb::StopReason::kNone:
      return CB_STOP_NONE;
    case cb::StopReason::kEndOfGeneration:
      return CB_STOP_END_OF_GENERATION;
    case cb::StopReason::kMaxTokens:
      return CB_STOP_MAX_TOKENS;
    case cb::StopReason::kContextFull:
      return CB_STOP_CONTEXT_FULL;
    case cb::StopReason::kStopString:
      return CB_STOP_STRING;
    case cb::StopReason::kCancelled:
      return CB_STOP_CANCELLED;
  }
  return CB_STOP_NONE;
}

cb_progress_stage progress_stage_of(cb::ProgressStage s) {
  switch (s) {
    case cb::ProgressStage::kPrefill:
      return CB_PROGRESS_PREFILL;
    case cb::ProgressStage::kChunk:
      return CB_PROGRESS_CHUNK;
    case cb::ProgressStage::kBlend:
      return CB_PROGRESS_BLEND;
  }
  return CB_PROGRESS_PREFILL;
}

}  // namespace

extern "C" {

// ---------------------------------------------------------------------------
// Session

void cb_session_options_init_sized(cb_session_options* opts, size_t struct_size) {
  write_zeros(opts, struct_size);
}

// The exported entry point of programs built before *_init became inline:
// their struct has this size.
void cb_session_options_init(cb_session_options* opts) {
  cb_session_options_init_sized(opts, offsetof(cb_session_options, kv_type));
}

cb_status cb_session_create(cb_model* model, const cb_session_options* opts,
                            cb_session** out_session) {
  return guard("cb_session_create", [&] {
    (void)model_of(model);
    require(out_session != nullptr, "out_session is NULL");
    const cb_session_options o = read_options(
        opts, cb_session_options_init_sized, offsetof(cb_session_options, kv_type),
        "cb_session_options.struct_size is not a known size (use cb_session_options_init)");
    require(o.n_ctx >= 0, "n_ctx must be >= 0 (0: the default)");
    require(o.n_threads >= 0 && o.n_threads <= cb::ThreadPool::kMaxThreads,
            "n_threads must be in [0, 512] (0: the model's default)");
    require(o.n_batch >= 0, "n_batch must be >= 0 (0: the default)");
    if (o.kv_type != CB_KV_F16 && o.kv_type != CB_KV_F32)
      cb::fail(cb::ErrorCode::kInvalidArgument,
               "kv_type must be CB_KV_F16 (0) or CB_KV_F32 (1), got " + std::to_string(o.kv_type));
    if (o.activations != CB_ACTIVATIONS_INT8 && o.activations != CB_ACTIVATIONS_F32)
      cb::fail(cb::ErrorCode::kInvalidArgument,
               "activations must be CB_ACTIVATIONS_INT8 (0) or CB_ACTIVATIONS_F32 (1), got " +
                   std::to_string(o.activations));
    require(o.resident_kv_bytes >= -1,
            "resident_kv_bytes must be >= -1 (0: the backend's choice, -1: none)");
    cb::SessionOptions so;
    so.n_ctx = o.n_ctx;
    so.n_threads = o.n_threads > 0 ? o.n_threads : model->state->n_threads;
    so.n_batch = o.n_batch;
    so.backend = model->state->backend_kind;
    so.device = model->state->device;
    so.kv_type = o.kv_type == CB_KV_F32 ? cb::KvType::kF32 : cb::KvType::kF16;
    so.int8_decode = so.int8_prefill = o.activations == CB_ACTIVATIONS_INT8;
    // The C API's zero is the default (the backend's choice), the
    // runtime's -1; the C API's -1 (none) is the runtime's 0.
    so.resident_kv_bytes = o.resident_kv_bytes == 0  ? -1
                           : o.resident_kv_bytes < 0 ? 0
                                                     : o.resident_kv_bytes;
    auto handle = std::make_unique<cb_session>();
    handle->state = model->state;
    handle->n_threads = so.n_threads;
    handle->session = std::make_unique<cb::Session>(*model->state->model, so);
    handle->generator = std::make_unique<cb::Generator>(*handle->session);
    live_handles().add(HandleKind::kSession, handle.get());
    *out_session = handle.release();
    return CB_OK;
  });
}

void cb_session_free(cb_session* session) {
  if (session == nullptr || !live_handles().remove(HandleKind::kSession, session)) return;
  // Called from a callback of a C API call on this session (its token or
  // abort callback, on this thread): that call is still using it and
  // deletes it when it returns.
  if (session->user.load(std::memory_order_acquire) == std::this_thread::get_id()) {
    session->free_requested = true;
    return;
  }
  delete session;
}

cb_status cb_session_prefill(cb_session* session, const int32_t* tokens, size_t n_tokens) {
  return guard("cb_session_prefill", [&] {
    SessionUse use(session);
    require(tokens != nullptr, "tokens is NULL");
    require(n_tokens > 0, "n_tokens is 0");
    session->generator->prefill(std::span<const int32_t>(tokens, n_tokens));
    return CB_OK;
  });
}

int32_t cb_session_n_past(const cb_session* session) {
  return is_live(session) ? clamp_i32(session->generator->n_past()) : 0;
}

int32_t cb_session_n_ctx(const cb_session* session) {
  return is_live(session) ? clamp_i32(session->session->n_ctx()) : 0;
}

uint64_t cb_session_kv_bytes(const cb_session* session) {
  return is_live(session) ? session->session->kv_cache_bytes() : 0;
}

cb_status cb_session_logits(const cb_session* session, const float** logits, size_t* n_vocab) {
  return guard("cb_session_logits", [&] {
    SessionUse use(session);
    require(logits != nullptr, "logits is NULL");
    require(n_vocab != nullptr, "n_vocab is NULL");
    const std::span<const float> kept = session->generator->logits();
    require(!kept.empty(),
            "the session has no logits to give: prefill it first (after generation the last "
            "token is pending until the next call)");
    *logits = kept.data();
    *n_vocab = kept.size();
    return CB_OK;
  });
}

cb_status cb_session_set_abort_callback(cb_session* session, cb_abort_callback callback,
                                        void* user_data) {
  return guard("cb_session_set_abort_callback", [&] {
    SessionUse use(session);
    if (callback == nullptr) {
      session->session->set_stop_check({});
    } else {
      // A callback that freed the session stops the call it runs in.
      session->session->set_stop_check([callback, user_data, session] {
        return callback(user_data) != 0 || session->free_requested;
      });
    }
    return CB_OK;
  });
}

cb_status cb_session_set_progress_callback(cb_session* session, cb_progress_callback callback,
                                           void* user_data) {
  return guard("cb_session_set_progress_callback", [&] {
    SessionUse use(session);
    if (callback == nullptr) {
      session->session->set_progress_report({});
    } else {
      session->session->set_progress_report([callback, user_data, session](cb::ProgressStage stage,
                                                                           int64_t done,
                                                                           int64_t total) {
        if (callback(progress_stage_of(stage), clamp_i32(done), clamp_i32(total), user_data) != 0)
          cb::fail(cb::ErrorCode::kCancelled, "cancelled by the progress callback");
        if (session->free_requested)
          cb::fail(cb::ErrorCode::kCancelled, "a callback freed the session; the call stopped");
      });
    }
    return CB_OK;
  });
}

cb_status cb_session_embed(cb_session* session, const int32_t* tokens, size_t n_tokens, float* out,
                           size_t capacity) {
  return guard("cb_session_embed", [&] {
    SessionUse use(session);
    require(tokens != nullptr, "tokens is NULL");
    require(n_tokens > 0, "n_tokens is 0");
    require(out != nullptr, "out is NULL");
    const size_t n_embd = static_cast<size_t>(session->session->model().hparams().n_embd);
    if (capacity < n_embd)
      throw ApiError{CB_ERR_BUFFER_TOO_SMALL,
                     "out holds fewer floats than the embedding (cb_model_info.n_embd)"};
    session->generator->reset();
    const std::vector<float> e =
        session->session->embed(std::span<const int32_t>(tokens, n_tokens));
    std::copy(e.begin(), e.end(), out);
    return CB_OK;
  });
}

cb_status cb_session_reset(cb_session* session) {
  return guard("cb_session_reset", [&] {
    SessionUse use(session);
    session->generator->reset();
    return CB_OK;
  });
}

// ---------------------------------------------------------------------------
// Sampling and generation

void cb_sampling_options_init_sized(cb_sampling_options* opts, size_t struct_size) {
  cb_sampling_options d;
  std::memset(static_cast<void*>(&d), 0, sizeof(d));
  d.temperature = 0.0f;
  d.top_k = 0;
  d.top_p = 1.0f;
  d.seed = 0;
  d.min_p = 0.0f;
  d.repeat_penalty = 1.0f;
  d.repeat_last_n = 64;
  write_defaults(opts, d, struct_size);
}

// The exported entry point of programs built before *_init became inline:
// their struct has this size.
void cb_sampling_options_init(cb_sampling_options* opts) {
  cb_sampling_options_init_sized(opts, sizeof(cb_sampling_options));
}

void cb_generate_options_init_sized(cb_generate_options* opts, size_t struct_size) {
  cb_generate_options d;
  std::memset(static_cast<void*>(&d), 0, sizeof(d));
  d.max_tokens = 256;
  d.stop_at_end_of_generation = 1;
  d.sampling = nullptr;
  write_defaults(opts, d, struct_size);
}

// The exported entry point of programs built before *_init became inline:
// their struct has this size.
void cb_generate_options_init(cb_generate_options* opts) {
  cb_generate_options_init_sized(opts, sizeof(cb_generate_options));
}

void cb_generate_stats_init_sized(cb_generate_stats* stats, size_t struct_size) {
  write_zeros(stats, struct_size);
}

// The exported entry point of programs built before *_init became inline:
// their struct has this size.
void cb_generate_stats_init(cb_generate_stats* stats) {
  cb_generate_stats_init_sized(stats, sizeof(cb_generate_stats));
}

cb_status cb_generate(cb_session* session, const int32_t* prompt, size_t n_prompt,
                      const cb_generate_options* opts, cb_token_callback callback, void* user_data,
                      cb_generate_stats* stats) {
  return guard("cb_generate", [&] {
    const auto t0 = std::chrono::steady_clock::now();
    SessionUse use(session);
    require(prompt != nullptr || n_prompt == 0, "prompt is NULL");
    const size_t stats_size =
        stats == nullptr
            ? 0
            : output_size(stats, sizeof(cb_generate_stats),
                          "stats->struct_size is not a known size (use cb_generate_stats_init)");
    const cb_generate_options o = read_options(
        opts, cb_generate_options_init_sized, offsetof(cb_generate_options, stop_strings),
        "cb_generate_options.struct_size is not a known size (use cb_generate_options_init)");
    require(o.stop_strings != nullptr || o.n_stop_strings == 0,
            "stop_strings is NULL but n_stop_strings is not 0");
    std::vector<std::string> stop_texts;
    for (size_t i = 0; i < o.n_stop_strings; ++i) {
      if (o.stop_strings[i] == nullptr)
        throw cb::Error(cb::ErrorCode::kInvalidArgument,
                        "stop_strings[" + std::to_string(i) + "] is NULL");
      stop_texts.emplace_back(o.stop_strings[i]);
    }
    const cb::StopStrings stops(std::move(stop_texts));  // refuses empty strings
    const cb_sampling_options so = read_options(
        o.sampling, cb_sampling_options_init_sized, offsetof(cb_sampling_options, min_p),
        "cb_sampling_options.struct_size is not a known size (use cb_sampling_options_init)");
    cb::SamplerOptions sopt;
    sopt.temperature = so.temperature;
    sopt.top_k = so.top_k;
    sopt.top_p = so.top_p;
    sopt.min_p = so.min_p;
    sopt.repeat_penalty = so.repeat_penalty;
    sopt.repeat_last_n = so.repeat_last_n;
    sopt.seed = so.seed;
    cb::Sampler sampler(sopt);  // validates the values

    cb_generate_stats st;
    cb_generate_stats_init_sized(&st, sizeof(st));
    auto publish = [&] {
      if (stats != nullptr) {
        std::memcpy(static_cast<void*>(stats), &st, stats_size);
        stats->struct_size = stats_size;
      }
    };

    // The token callback runs inside this call: meanwhile the session refuses
    // other calls (SessionUse), and a cb_session_free from the callback is
    // carried out when `use` ends, once nothing uses the session.
    const cb::TokenSink sink = [&](int32_t t, const std::string& piece) {
      // The piece ends with a NUL for the callback (std::string's).
      return callback == nullptr ||
             (callback(t, piece.c_str(), piece.size(), user_data) == 0 && !session->free_requested);
    };
    const cb::GenerationStats g = session->generator->generate(
        std::span<const int32_t>(prompt, n_prompt),
        {.max_tokens = o.max_tokens, .stop_at_end_of_generation = o.stop_at_end_of_generation != 0},
        sampler, stops, sink, t0);
    st.n_prompt = g.n_prompt;
    st.n_generated = g.n_generated;
    st.ttft_ms = g.ttft_ms;
    st.prefill_ms = g.prefill_ms;
    st.decode_ms = g.decode_ms;
    st.tok_s = g.tok_s;
    st.stop_reason = stop_reason_of(g.stop);
    const bool by_abort_callback = g.aborted;
    const cb_status result = g.stop == cb::StopReason::kCancelled ? CB_ERR_CANCELLED : CB_OK;
    publish();
    if (result == CB_ERR_CANCELLED)
      return fail_with(
          CB_ERR_CANCELLED, "cb_generate",
          (session->free_requested ? "a callback freed the session; generation stopped after "
           : by_abort_callback     ? "generation cancelled by the abort callback after "
                                   : "generation cancelled by the token callback after ") +
              std::to_string(st.n_generated) + " tokens");
    return result;
  });
}

}  // extern "C"
