// cb_bench generate, prefill and decode: text and speed of one session.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench.h"

namespace cbbench {

namespace {

struct GenerateState {
  bool stream = false;
  std::vector<int32_t> ids;
  std::string text;
};

int on_token(int32_t token, const char* piece, size_t len, void* user) {
  auto* st = static_cast<GenerateState*>(user);
  st->ids.push_back(token);
  st->text.append(piece, len);
  if (st->stream) {
    std::fwrite(piece, 1, len, stdout);
    std::fflush(stdout);
  }
  return 0;
}

const char* stop_reason_name(cb_stop_reason r) {
  switch (r) {
    case CB_STOP_MAX_TOKENS:
      return "max_tokens";
    case CB_STOP_END_OF_GENERATION:
      return "end_of_generation";
    case CB_STOP_CONTEXT_FULL:
      return "context_full";
    case CB_STOP_CANCELLED:
      return "cancelled";
    case CB_STOP_STRING:
      return "stop_string";
    case CB_STOP_NONE:
      break;
  }
  return "none";
}

}  // namespace

int cmd_generate(const Args& a) {
  auto it = a.values.find("--prompt");
  if (it == a.values.end()) usage_error("generate needs --prompt TEXT");
  const std::string prompt = it->second;
  const bool chat = a.switches.count("--chat") > 0;
  const int max_tokens = static_cast<int>(parse_int(a, "--max-tokens", 128, 0, 1 << 30));
  cb_sampling_options so;
  cb_sampling_options_init(&so);
  so.temperature = static_cast<float>(parse_double(a, "--temperature", 0.0, 0.0, 100.0));
  so.top_k = static_cast<int32_t>(parse_int(a, "--top-k", 0, 0, 1 << 30));
  so.top_p = static_cast<float>(parse_double(a, "--top-p", 1.0, 1e-6, 1.0));
  so.min_p = static_cast<float>(parse_double(a, "--min-p", 0.0, 0.0, 0.999));
  so.repeat_penalty = static_cast<float>(parse_double(a, "--repeat-penalty", 1.0, 0.01, 100.0));
  so.repeat_last_n = static_cast<int32_t>(parse_int(a, "--repeat-last-n", 64, 0, 1 << 20));
  so.seed = parse_u64(a, "--seed", 0);
  for (const std::string& s : a.stops)
    if (s.empty()) usage_error("--stop needs a non-empty text");
  std::vector<const char*> stops;
  for (const std::string& s : a.stops) stops.push_back(s.c_str());
  const Common c = common_options(a);

  Model model;
  load_model(c, model);
  std::string text = prompt;
  if (chat) {
    std::vector<cb_chat_message> msgs;
    auto sys = a.values.find("--system");
    if (sys != a.values.end()) msgs.push_back({"system", sys->second.c_str()});
    msgs.push_back({"user", prompt.c_str()});
    size_t len = 0;
    check(cb_chat_format(model.h, msgs.data(), msgs.size(), 1, nullptr, 0, &len),
          "cannot format the chat");
    std::vector<char> buf(len + 1);
    check(cb_chat_format(model.h, msgs.data(), msgs.size(), 1, buf.data(), buf.size(), &len),
          "cannot format the chat");
    text.assign(buf.data(), len);
  }
  const std::vector<int32_t> ids = tokenize(model, text, true, true);
  if (ids.empty()) usage_error("the prompt is empty");

  Session session;
  create_session(model, c, c.n_ctx, session);

  cb_generate_options go;
  cb_generate_options_init(&go);
  go.max_tokens = max_tokens;
  go.sampling = &so;
  go.stop_strings = stops.data();
  go.n_stop_strings = stops.size();
  cb_generate_stats stats;
  cb_generate_stats_init(&stats);
  GenerateState st;
  st.stream = !c.json;
  check_generate(cb_generate(session.h, ids.data(), ids.size(), &go, on_token, &st, &stats),
                 session, ids.size());

  if (c.json) {
    cbs::JsonObject o = header("generate", c, model);
    o.add("text", st.text)
        .add("tokens", st.ids)
        .add("n_prompt", stats.n_prompt)
        .add("n_generated", stats.n_generated)
        .add("stop_reason", stop_reason_name(stats.stop_reason))
        .add("ttft_ms", stats.ttft_ms)
        .add("prefill_ms", stats.prefill_ms)
        .add("decode_ms", stats.decode_ms)
        .add("tok_s", stats.tok_s);
    std::printf("%s\n", o.str().c_str());
  } else {
    std::printf("\n");
    std::fprintf(stderr,
                 "\n[%s, %s, %s kernels] prompt %d tokens, ttft %.1f ms "
                 "(prefill %.1f ms); %d tokens generated, decode %.1f tok/s\n",
                 cbs::printable(model_name(model)).c_str(), compute_label(c, model).c_str(),
                 kernels_name(model).c_str(), stats.n_prompt, stats.ttft_ms, stats.prefill_ms,
                 stats.n_generated, stats.tok_s);
  }
  return 0;
}

// ---------------------------------------------------------------------------
// prefill / decode

namespace {

// Plain English prose, tokenized and repeated to the length a benchmark
// needs, so the token mix resembles real input (not random ids).
const char* const kBenchText =
    "The old lighthouse stood at the edge of the harbor for more than a century. Every evening "
    "the keeper climbed the spiral stairs, trimmed the wick and polished the great lens until "
    "it shone. Ships coming home through the fog looked for its beam, counted the seconds "
    "between flashes and knew where they were. When the town council voted to replace the "
    "lamp with an automatic light, people gathered on the pier to argue about it. Some said "
    "that machines never sleep and never forget; others said that a lighthouse without a "
    "keeper is only a tower. In the end the new light was installed in the spring, and the "
    "keeper moved into a small house near the market, where he repaired clocks and told "
    "children about storms, shipwrecks and the winter the harbor froze solid.\n\n";

std::vector<int32_t> bench_tokens(const Model& model, size_t n) {
  std::vector<int32_t> ids;
  const int32_t bos = cb_token_bos(model.h);
  if (bos >= 0) ids.push_back(bos);
  const std::vector<int32_t> unit = tokenize(model, kBenchText, false, false);
  if (unit.empty()) runtime_error("the benchmark text tokenizes to nothing");
  while (ids.size() < n) ids.insert(ids.end(), unit.begin(), unit.end());
  ids.resize(n);
  return ids;
}

// Runs a prefill of `ids` on an empty session; returns its time in ms.
double timed_prefill(const Session& session, const std::vector<int32_t>& ids) {
  check(cb_session_reset(session.h), "cannot reset the session");
  cb_generate_options go;
  cb_generate_options_init(&go);
  go.max_tokens = 0;
  cb_generate_stats stats;
  cb_generate_stats_init(&stats);
  check_generate(cb_generate(session.h, ids.data(), ids.size(), &go, nullptr, nullptr, &stats),
                 session, ids.size());
  return stats.prefill_ms;
}

}  // namespace

int cmd_prefill(const Args& a) {
  const int n = static_cast<int>(parse_int(a, "--tokens", 512, 1, 1 << 24));
  const int repeat = static_cast<int>(parse_int(a, "--repeat", 3, 1, 1000));
  const Common c = common_options(a);
  Model model;
  load_model(c, model);
  Session session;
  create_session(model, c, c.n_ctx > 0 ? c.n_ctx : n, session);
  const std::vector<int32_t> ids = bench_tokens(model, static_cast<size_t>(n));

  // Warm-up: touches every weight page and the session's buffers.
  timed_prefill(session, std::vector<int32_t>(ids.begin(), ids.begin() + std::min(n, 16)));
  std::vector<double> ms;
  for (int r = 0; r < repeat; ++r) ms.push_back(timed_prefill(session, ids));
  const double med = median(ms);
  const double best = *std::min_element(ms.begin(), ms.end());
  const double tok_s = med > 0 ? n * 1000.0 / med : 0.0;
  if (c.json) {
    cbs::JsonObject o = header("prefill", c, model);
    o.add("n_tokens", static_cast<int64_t>(n))
        .add("repeat", static_cast<int64_t>(repeat))
        .add("stat", "median")
        .add("ms", med)
        .add("tok_s", tok_s)
        .add("ms_best", best)
        .add("tok_s_best", best > 0 ? n * 1000.0 / best : 0.0)
        .add("ms_runs", ms)
        .add("kv_bytes", static_cast<int64_t>(cb_session_kv_bytes(session.h)));
    std::printf("%s\n", o.str().c_str());
  } else {
    std::printf("%-8s %7s %7s %10s %11s %11s  %s\n", "bench", "threads", "tokens", "ms(med)",
                "tok/s(med)", "tok/s(best)", "model");
    std::printf("%-8s %7s %7d %10.1f %11.1f %11.1f  %s (%s)\n", "prefill",
                compute_label(c, model, true).c_str(), n, med, tok_s,
                best > 0 ? n * 1000.0 / best : 0.0, cbs::printable(model_name(model)).c_str(),
                kernels_name(model).c_str());
  }
  return 0;
}

int cmd_decode(const Args& a) {
  const int n = static_cast<int>(parse_int(a, "--tokens", 128, 1, 1 << 24));
  const int ctx = static_cast<int>(parse_int(a, "--ctx", 16, 1, 1 << 24));
  const int repeat = static_cast<int>(parse_int(a, "--repeat", 1, 1, 1000));
  const Common c = common_options(a);
  Model model;
  load_model(c, model);
  Session session;
  create_session(model, c, c.n_ctx > 0 ? c.n_ctx : ctx + n + 1, session);
  const std::vector<int32_t> prompt = bench_tokens(model, static_cast<size_t>(ctx));

  // Warm-up.
  timed_prefill(session, std::vector<int32_t>(prompt.begin(), prompt.begin() + std::min(ctx, 16)));
  std::vector<double> rates;
  int generated = 0;
  for (int r = 0; r < repeat; ++r) {
    check(cb_session_reset(session.h), "cannot reset the session");
    cb_generate_options go;
    cb_generate_options_init(&go);
    go.max_tokens = n + 1;  // n forward passes over generated tokens
    go.stop_at_end_of_generation = 0;
    cb_generate_stats stats;
    cb_generate_stats_init(&stats);
    check_generate(
        cb_generate(session.h, prompt.data(), prompt.size(), &go, nullptr, nullptr, &stats),
        session, prompt.size());
    rates.push_back(stats.tok_s);
    generated = stats.n_generated - 1;
  }
  const double tok_s = median(rates);
  if (c.json) {
    cbs::JsonObject o = header("decode", c, model);
    o.add("n_tokens", static_cast<int64_t>(generated))
        .add("ctx", static_cast<int64_t>(ctx))
        .add("repeat", static_cast<int64_t>(repeat))
        .add("stat", "median")
        .add("tok_s", tok_s)
        .add("ms_per_token", tok_s > 0 ? 1000.0 / tok_s : 0.0)
        .add("tok_s_runs", rates);
    std::printf("%s\n", o.str().c_str());
  } else {
    std::printf("%-8s %7s %7s %7s %11s %10s  %s\n", "bench", "threads", "ctx", "tokens",
                "tok/s(med)", "ms/token", "model");
    std::printf("%-8s %7s %7d %7d %11.1f %10.2f  %s (%s)\n", "decode",
                compute_label(c, model, true).c_str(), ctx, generated, tok_s,
                tok_s > 0 ? 1000.0 / tok_s : 0.0, cbs::printable(model_name(model)).c_str(),
                kernels_name(model).c_str());
  }
  return 0;
}

}  // namespace cbbench
