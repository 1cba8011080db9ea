// The C API of models, tokens and text: translation and checks only.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "api.h"
#include "kernels/backend.h"
#include "platform/thread_pool.h"
#include "runtime/chat_format.h"
#include "runtime/tokenizer/tokenizer.h"

using namespace cb::api;

extern "C" {

// ---------------------------------------------------------------------------
// Model

void cb_model_options_init_sized(cb_model_options* opts, size_t struct_size) {
  cb_model_options d;
  std::memset(static_cast<void*>(&d), 0, sizeof(d));
  d.n_threads = 0;
  d.backend = CB_BACKEND_AUTO;
  d.chat_template = CB_CHAT_TEMPLATE_AUTO;
  write_defaults(opts, d, struct_size);
}

// The exported entry point of programs built before *_init became inline:
// their struct has this size.
void cb_model_options_init(cb_model_options* opts) {
  cb_model_options_init_sized(opts, offsetof(cb_model_options, chat_template));
}

cb_status cb_model_load(const char* path, const cb_model_options* opts, cb_model** out_model) {
  return guard("cb_model_load", [&] {
    require(out_model != nullptr, "out_model is NULL");
    require(path != nullptr, "path is NULL");
    require(path[0] != '\0', "path is empty");
    // Callers built before `device` existed pass a smaller struct: still
    // valid, device 0.
    const cb_model_options o = read_options(
        opts, cb_model_options_init_sized, offsetof(cb_model_options, device),
        "cb_model_options.struct_size is not a known size (use cb_model_options_init)");
    require(o.n_threads >= 0 && o.n_threads <= cb::ThreadPool::kMaxThreads,
            "n_threads must be in [0, 512]");
    require(o.device >= 0, "device must be >= 0");
    cb::BackendRequest request = cb::BackendRequest::kAuto;
    switch (enum_value(o.backend)) {
      case CB_BACKEND_AUTO:
        break;
      case CB_BACKEND_CPU:
        request = cb::BackendRequest::kCpu;
        break;
      case CB_BACKEND_CUDA:
        request = cb::BackendRequest::kCuda;
        break;
      default:
        invalid("unknown backend value");
    }
    cb::BackendKind kind;
    try {
      kind = cb::resolve_backend(request, o.device);
    } catch (const cb::Error& e) {
      throw cb::Error(e.code(), std::string("CB_BACKEND_CUDA: ") + e.what() +
                                    "; use CB_BACKEND_CPU or CB_BACKEND_AUTO");
    }
    std::optional<cb::ChatFormat> chat_format;
    switch (enum_value(o.chat_template)) {
      case CB_CHAT_TEMPLATE_AUTO:
        break;
      case CB_CHAT_TEMPLATE_CHATML:
        chat_format = cb::ChatFormat::kChatML;
        break;
      case CB_CHAT_TEMPLATE_LLAMA3:
        chat_format = cb::ChatFormat::kLlama3;
        break;
      case CB_CHAT_TEMPLATE_GEMMA:
        chat_format = cb::ChatFormat::kGemma;
        break;
      default:
        invalid("unknown chat_template value");
    }
    auto state = std::make_shared<ModelState>();
    state->model = cb::Model::load(path, chat_format);
    state->n_threads = o.n_threads;
    state->name = state->model->name().empty() ? basename_of(path) : state->model->name();
    state->architecture =
        state->model->gguf().get_string("general.architecture").value_or(std::string("llama"));
    state->backend_kind = kind;
    state->device = kind == cb::BackendKind::kCuda ? o.device : 0;
    state->backend = kind == cb::BackendKind::kCuda ? "cuda" : "cpu";
    state->kernels = kind == cb::BackendKind::kCuda ? "cuda" : cb::cpu_kernel_level_name();
    auto handle = std::make_unique<cb_model>();
    handle->state = std::move(state);
    live_handles().add(HandleKind::kModel, handle.get());
    *out_model = handle.release();
    return CB_OK;
  });
}

void cb_model_free(cb_model* model) {
  // A handle that is not live (a second free, not a model) is ignored: it
  // must not be touched.  Sessions keep the model's state alive.
  if (model == nullptr || !live_handles().remove(HandleKind::kModel, model)) return;
  delete model;
}

void cb_model_info_init_sized(cb_model_info* info, size_t struct_size) {
  write_zeros(info, struct_size);
}

// The exported entry point of programs built before *_init became inline:
// their struct has this size.
void cb_model_info_init(cb_model_info* info) {
  cb_model_info_init_sized(info, offsetof(cb_model_info, chat_template));
}

cb_status cb_model_get_info(const cb_model* model, cb_model_info* info) {
  return guard("cb_model_get_info", [&] {
    const cb::Model& m = model_of(model);
    const size_t size = output_size(
        info, offsetof(cb_model_info, chat_template),
        "info is NULL or info->struct_size is not a known size (use cb_model_info_init)");
    const cb::LlamaHparams& hp = m.hparams();
    const ModelState& st = *model->state;
    cb_model_info out;
    cb_model_info_init_sized(&out, sizeof(out));
    out.n_layer = clamp_i32(hp.n_layer);
    out.n_embd = clamp_i32(hp.n_embd);
    out.n_head = clamp_i32(hp.n_head);
    out.n_head_kv = clamp_i32(hp.n_head_kv);
    out.head_dim = clamp_i32(hp.head_dim);
    out.n_ff = clamp_i32(hp.n_ff);
    out.n_vocab = clamp_i32(hp.n_vocab);
    out.n_ctx_train = clamp_i32(hp.n_ctx_train);
    out.file_size = static_cast<uint64_t>(m.gguf().size());
    out.name = st.name.c_str();
    out.architecture = st.architecture.c_str();
    out.backend = st.backend.c_str();
    out.kernels = st.kernels.c_str();
    try {
      out.chat_template = cb::chat_format_name(m.chat_format());
    } catch (const cb::Error&) {
      out.chat_template = "";
    }
    std::memcpy(static_cast<void*>(info), &out, size);
    info->struct_size = size;
    return CB_OK;
  });
}

// ---------------------------------------------------------------------------
// Tokens and text

cb_status cb_tokenize(const cb_model* model, const char* text, size_t text_len, int add_special,
                      int parse_special, int32_t* tokens, size_t capacity, size_t* n_tokens) {
  return guard("cb_tokenize", [&] {
    const cb::Model& m = model_of(model);
    require(n_tokens != nullptr, "n_tokens is NULL");
    require(text != nullptr || text_len == 0, "text is NULL");
    if (text_len == CB_NUL_TERMINATED) text_len = std::strlen(text);
    const std::string_view sv =
        text_len == 0 ? std::string_view() : std::string_view(text, text_len);
    const std::vector<int32_t> ids = m.tokenizer().encode(sv, add_special != 0, parse_special != 0);
    *n_tokens = ids.size();
    if (tokens == nullptr && capacity == 0) return CB_OK;
    require(tokens != nullptr, "tokens is NULL but capacity is not 0");
    if (capacity < ids.size())
      throw ApiError{CB_ERR_BUFFER_TOO_SMALL,
                     "token buffer too small (the count needed is in *n_tokens)"};
    std::copy(ids.begin(), ids.end(), tokens);
    return CB_OK;
  });
}

cb_status cb_detokenize(const cb_model* model, const int32_t* tokens, size_t n_tokens,
                        int render_special, char* buf, size_t capacity, size_t* out_len) {
  return guard("cb_detokenize", [&] {
    const cb::Model& m = model_of(model);
    require(out_len != nullptr, "out_len is NULL");
    require(tokens != nullptr || n_tokens == 0, "tokens is NULL");
    const int32_t n_vocab = m.tokenizer().n_vocab();
    for (size_t i = 0; i < n_tokens; ++i)
      if (tokens[i] < 0 || tokens[i] >= n_vocab)
        throw cb::Error(cb::ErrorCode::kInvalidArgument,
                        "token id " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                            " is outside 0.." + std::to_string(n_vocab - 1));
    const std::string text =
        n_tokens == 0
            ? std::string()
            : m.tokenizer().decode(std::span<const int32_t>(tokens, n_tokens), render_special != 0);
    return write_text(text, buf, capacity, out_len);
  });
}

cb_status cb_token_to_piece(const cb_model* model, int32_t token, int render_special, char* buf,
                            size_t capacity, size_t* out_len) {
  return guard("cb_token_to_piece", [&] {
    const cb::Model& m = model_of(model);
    require(out_len != nullptr, "out_len is NULL");
    const int32_t n_vocab = m.tokenizer().n_vocab();
    if (token < 0 || token >= n_vocab)
      throw cb::Error(
          cb::ErrorCode::kInvalidArgument,
          "token id " + std::to_string(token) + " is outside 0.." + std::to_string(n_vocab - 1));
    return write_text(m.tokenizer().token_to_piece(token, render_special != 0), buf, capacity,
                      out_len);
  });
}

int32_t cb_token_bos(const cb_model* model) {
  if (!is_live(model)) return -1;
  return model->state->model->tokenizer().bos_id();
}

int32_t cb_token_eos(const cb_model* model) {
  if (!is_live(model)) return -1;
  return model->state->model->tokenizer().eos_id();
}

int cb_token_is_end_of_generation(const cb_model* model, int32_t token) {
  if (!is_live(model)) return 0;
  try {
    const cb::Tokenizer& t = model->state->model->tokenizer();
    if (token < 0 || token >= t.n_vocab()) return 0;
    return t.is_end_of_generation(token) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

cb_status cb_chat_format(const cb_model* model, const cb_chat_message* messages, size_t n_messages,
                         int add_assistant_header, char* buf, size_t capacity, size_t* out_len) {
  return guard("cb_chat_format", [&] {
    const cb::Model& m = model_of(model);
    const cb::ChatFormat format = m.chat_format();
    require(out_len != nullptr, "out_len is NULL");
    require(messages != nullptr || n_messages == 0, "messages is NULL");
    std::vector<cb::ChatMessage> msgs;
    msgs.reserve(n_messages);
    for (size_t i = 0; i < n_messages; ++i) {
      require(messages[i].role != nullptr, "a message's role is NULL");
      require(messages[i].content != nullptr, "a message's content is NULL");
      msgs.push_back({messages[i].role, messages[i].content});
    }
    return write_text(
        cb::format_chat(format, msgs, add_assistant_header != 0, m.chat_default_system()), buf,
        capacity, out_len);
  });
}

}  // extern "C"
