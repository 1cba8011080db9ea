// cb_bench: the on-device benchmark, written against the public C API only.
//
//   cb_bench generate --prompt TEXT [--chat] --max-tokens N   text and speed
//   cb_bench prefill  --tokens N [--repeat K]                  prefill speed
//   cb_bench decode   --tokens N [--ctx N]                     decode speed
//   cb_bench ttft     --chunks N --chunk-tokens T ...          RAG TTFT per mode
//   cb_bench quality  --dataset FILE ...                       RAG answer quality per mode
//
// With --json every subcommand prints one JSON object per line.
// Exit status: 0 success, 1 runtime error, 2 usage error.
#include <cacheblend/cacheblend.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <new>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "handles.h"
#include "json_writer.h"
#include "model_path.h"
#include "number_arg.h"
#include "ratio_arg.h"

namespace {

const char* const kUsage =
    "usage: cb_bench <command> [options]\n"
    "\n"
    "commands:\n"
    "  generate --prompt TEXT [--chat] [--system TEXT] [--max-tokens N]\n"
    "           [--temperature T] [--top-k K] [--top-p P] [--min-p M] [--seed S]\n"
    "           [--repeat-penalty X] [--repeat-last-n N] [--stop TEXT]...\n"
    "      generate text from a prompt (with --chat: formatted as a ChatML user\n"
    "      turn); prints the text, then timings on stderr.  Greedy by default.\n"
    "      --max-tokens defaults to 128.  --repeat-penalty (default 1: none)\n"
    "      damps the tokens of the last N generated (default 64); --stop (may\n"
    "      repeat) ends the text before the first stop string.\n"
    "  prefill --tokens N [--repeat K]\n"
    "      prefill speed over N tokens of a fixed English text; reports the\n"
    "      median (and best) of K runs (default 3) after one warm-up.\n"
    "  decode --tokens N [--ctx C] [--repeat K]\n"
    "      decode speed: N greedy tokens after a prompt of C tokens (default 16);\n"
    "      median of K runs (default 1).\n"
    "  ttft --chunks N --chunk-tokens T [--query-tokens Q] [--ratio R|auto[,R2,...]]\n"
    "       [--modes full,prefix,reuse,blend] [--repeat K] [--chunk-head prompt|none]\n"
    "       [--codec f32|f16|q8|q4] [--store DIR] [--storage-mbps B[,B2,...]]\n"
    "       [--pipeline on|off] [--select P[,P2,...]] [--sink-tokens K] [--plot FILE.png]\n"
    "      time to first token of a RAG request of N distinct chunks of about T\n"
    "      tokens each (cut from a built-in English text) and a question of about\n"
    "      Q tokens (default 32).  The chunk cache is warmed first (one untimed\n"
    "      blend request computes every chunk), so timed runs find their chunks in\n"
    "      RAM, as in deployment.  Each mode (blend: each ratio, default 0.2) runs\n"
    "      K times (default 3) on a reset session, the runs of all modes and\n"
    "      ratios (and, for blend, each --select policy) interleaved; TTFT = the\n"
    "      RAG prefill plus sampling the first\n"
    "      token; the median is reported.  With --ratio auto, one untimed auto\n"
    "      request first lets the loading controller calibrate.  Several read caps\n"
    "      (--storage-mbps 50,200,1000; a chunk store on flash) run every mode and\n"
    "      ratio once per cap.  --plot FILE.png draws TTFT per mode against the\n"
    "      read cap (several caps), else against the ratio (several ratios), else\n"
    "      per mode (needs gnuplot).\n"
    "  quality --dataset FILE [--limit N] [--max-chunks K] [--ratio R|auto[,R2,...]]\n"
    "          [--modes full,prefix,reuse,blend] [--chunk-head prompt|none]\n"
    "          [--max-tokens M] [--codec C] [--store DIR] [--show] [--plot FILE.png]\n"
    "          [--select P[,P2,...]] [--schedule L:R[,L:R...]] [--sink-tokens K]\n"
    "          [--seed S] [--guard-share X] [--guard-max-ratio Y] [--tf-tokens T]\n"
    "      answer quality on a dataset: a JSON list of {question, answers[],\n"
    "      ctxs[{title, text}]} (e.g. a MuSiQue dev split); each ctx is one\n"
    "      chunk (title + newline + text), the first K of them (default all); the\n"
    "      first N examples (default all).  Per example, full prefill runs first\n"
    "      (the reference; always run), then the other modes, on a reset session\n"
    "      and one shared chunk cache.  Greedy answers of at most M tokens\n"
    "      (default 12), stopped at end of generation or a newline.  Per mode:\n"
    "      f1 (SQuAD token F1 against the best gold answer), fidelity_f1 (F1\n"
    "      against full prefill's answer), top1_agree and kl_first (the first\n"
    "      token's argmax and KL(full || mode) against full prefill) and the\n"
    "      median TTFT; teacher-forced fidelity: full prefill's greedy answer of\n"
    "      T tokens (default 32) is fed after each mode's prefill, and kl_tf_mean\n"
    "      (mean KL(full || mode) over its positions) and top1_tf (share of\n"
    "      positions whose argmax agrees) compare every position; exact_answer\n"
    "      is the share of answers identical to full prefill's; gap_closed (and\n"
    "      gap_closed_tf) = 1 - KL(mode) / KL(reuse) on the same examples (reuse\n"
    "      always runs when blend does).  TTFT is always taken on a cached run: a\n"
    "      mode whose run had to compute missing chunks is run again and that run\n"
    "      is measured (and scored; the answer is the same).  Progress goes to\n"
    "      stderr; --show prints every answer there too.\n"
    "      Blend runs once per ratio and --select policy (hkvd, hkvd_kv,\n"
    "      attention, lookahead, random, oracle; default: the library's), or with\n"
    "      --schedule (check layers, e.g. 1:0.3,3:0.15) instead of --ratio.\n"
    "      --sink-tokens K recomputes each chunk's first K tokens too; --seed S\n"
    "      seeds random; --guard-share X with --guard-max-ratio Y raises the\n"
    "      ratio (up to Y) until the selected tokens hold X of the policy's score.\n"
    "      With several blend runs --plot FILE.png draws KL(first token) against\n"
    "      the computed fraction per policy, and FILE_tf.png top1_tf likewise.\n"
    "      --codec f32 (default: chunk KV in RAM) | f16 | q8 | q4 (chunk KV in a\n"
    "      chunk store on flash: --store DIR, else a temporary directory removed at\n"
    "      exit); --storage-mbps B caps the store's reads at B MB/s (slow flash).\n"
    "      With --store or --storage-mbps and no --codec: f16.\n"
    "\n"
    "common options:\n"
    "  --model PATH     GGUF model (default: $CB_MODEL, else\n"
    "                   models/SmolLM2-135M-Instruct.Q4_1.gguf here or in the source tree)\n"
    "  --threads N      compute threads (default: the number of CPU cores available\n"
    "                   to this process)\n"
    "  --backend B      cpu, cuda or auto (default: auto = cuda when the library\n"
    "                   has CUDA and a GPU is present, else cpu)\n"
    "  --device N       the CUDA device for --backend cuda|auto (default 0)\n"
    "  --n-ctx N        session context size in tokens (default: what the command\n"
    "                   needs, at most the model's context; generate: min(model\n"
    "                   context, 4096))\n"
    "  --json           print one JSON object per line instead of text\n"
    "  --help           this text\n"
    "\n"
    "exit status: 0 success, 1 error, 2 usage error\n";

// ---------------------------------------------------------------------------
// Errors

struct UsageError {
  std::string message;
};
struct RuntimeError {
  std::string message;
};

[[noreturn]] void usage_error(const std::string& m) {
  throw UsageError{m};
}
[[noreturn]] void runtime_error(const std::string& m) {
  throw RuntimeError{m};
}

// Throws a RuntimeError naming `what` and the library's message on failure.
void check(cb_status s, const std::string& what) {
  if (s == CB_OK) return;
  const char* detail = cb_last_error();
  runtime_error(what + ": " + (detail[0] ? detail : cb_status_string(s)));
}

// ---------------------------------------------------------------------------
// Command line

struct Args {
  std::string command;
  std::map<std::string, std::string> values;  // --flag VALUE
  std::set<std::string> switches;             // --flag
  std::vector<std::string> stops;             // --stop TEXT, each time given
};

Args parse_args(int argc, char** argv) {
  static const std::set<std::string> kCommon = {"--model", "--threads", "--n-ctx", "--backend",
                                                "--device"};
  static const std::map<std::string, std::set<std::string>> kValueFlags = {
      {"generate",
       {"--prompt", "--system", "--max-tokens", "--temperature", "--top-k", "--top-p", "--min-p",
        "--seed", "--repeat-penalty", "--repeat-last-n", "--stop"}},
      {"prefill", {"--tokens", "--repeat"}},
      {"decode", {"--tokens", "--ctx", "--repeat"}},
      {"ttft",
       {"--chunks", "--chunk-tokens", "--query-tokens", "--ratio", "--modes", "--repeat",
        "--chunk-head", "--codec", "--storage-mbps", "--store", "--pipeline", "--plot", "--select",
        "--sink-tokens"}},
      {"quality",
       {"--dataset", "--limit", "--max-chunks", "--ratio", "--modes", "--chunk-head",
        "--max-tokens", "--codec", "--storage-mbps", "--store", "--plot", "--select",
        "--sink-tokens", "--seed", "--schedule", "--guard-share", "--guard-max-ratio",
        "--tf-tokens"}},
  };
  static const std::map<std::string, std::set<std::string>> kSwitches = {
      {"generate", {"--chat", "--json", "--help"}},
      {"prefill", {"--json", "--help"}},
      {"decode", {"--json", "--help"}},
      {"ttft", {"--json", "--help"}},
      {"quality", {"--json", "--help", "--show"}},
  };
  Args a;
  if (argc < 2) usage_error("no command given (generate, prefill, decode, ttft or quality)");
  a.command = argv[1];
  if (a.command == "--help" || a.command == "-h" || a.command == "help") {
    a.command = "help";
    return a;
  }
  if (!kValueFlags.count(a.command))
    usage_error("unknown command '" + a.command +
                "' (expected generate, prefill, decode, ttft or quality)");
  const auto& values = kValueFlags.at(a.command);
  const auto& switches = kSwitches.at(a.command);
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h") arg = "--help";
    std::string value;
    bool has_inline = false;
    if (arg.rfind("--", 0) == 0) {
      const size_t eq = arg.find('=');
      if (eq != std::string::npos) {
        value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
        has_inline = true;
      }
    } else {
      usage_error("unexpected argument '" + arg + "'");
    }
    if (switches.count(arg)) {
      if (has_inline) usage_error("option " + arg + " takes no value");
      a.switches.insert(arg);
    } else if (values.count(arg) || kCommon.count(arg)) {
      if (!has_inline) {
        if (i + 1 >= argc) usage_error("option " + arg + " needs a value");
        value = argv[++i];
      }
      if (arg == "--stop") a.stops.push_back(value);
      a.values[arg] = value;
    } else {
      usage_error("unknown option '" + arg + "' for '" + a.command + "'");
    }
  }
  return a;
}

long long parse_int(const Args& a, const std::string& flag, long long def, long long lo,
                    long long hi) {
  auto it = a.values.find(flag);
  if (it == a.values.end()) return def;
  const std::string& s = it->second;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE)
    usage_error("option " + flag + ": '" + s + "' is not an integer");
  if (v < lo || v > hi)
    usage_error("option " + flag + ": " + s + " is outside " + std::to_string(lo) + ".." +
                std::to_string(hi));
  return v;
}

unsigned long long parse_u64(const Args& a, const std::string& flag, unsigned long long def) {
  auto it = a.values.find(flag);
  if (it == a.values.end()) return def;
  const std::string& s = it->second;
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || s[0] == '-' || *end != '\0' || errno == ERANGE)
    usage_error("option " + flag + ": '" + s + "' is not a non-negative integer");
  return v;
}

double parse_double(const Args& a, const std::string& flag, double def, double lo, double hi) {
  auto it = a.values.find(flag);
  if (it == a.values.end()) return def;
  double v = 0.0;
  std::string error;
  if (!cbs::parse_number_arg(it->second, lo, hi, v, error))
    usage_error("option " + flag + ": " + error);
  return v;
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

using Model = cbs::ModelHandle;
using Session = cbs::SessionHandle;

struct Common {
  std::string model_path;
  int threads = 0;
  int n_ctx = 0;
  cb_backend backend = CB_BACKEND_AUTO;
  int device = 0;
  bool json = false;
};

Common common_options(const Args& a) {
  Common c;
  c.threads = static_cast<int>(parse_int(a, "--threads", available_cores(), 1, 512));
  c.n_ctx = static_cast<int>(parse_int(a, "--n-ctx", 0, 1, 1 << 30));
  c.device = static_cast<int>(parse_int(a, "--device", 0, 0, 4095));
  c.json = a.switches.count("--json") > 0;
  if (auto it = a.values.find("--backend"); it != a.values.end()) {
    if (it->second == "cpu")
      c.backend = CB_BACKEND_CPU;
    else if (it->second == "cuda")
      c.backend = CB_BACKEND_CUDA;
    else if (it->second != "auto")
      usage_error("option --backend: expected cpu, cuda or auto, got '" + it->second + "'");
  }
  auto model = a.values.find("--model");
  if (model != a.values.end() && model->second.empty()) usage_error("option --model: empty path");
  try {
    c.model_path = cbs::resolve_model_path(model != a.values.end() ? model->second : "");
  } catch (const std::runtime_error& e) {
    runtime_error(e.what());
  }
  return c;
}

void load_model(const Common& c, Model& model) {
  cb_model_options mo;
  cb_model_options_init(&mo);
  mo.n_threads = c.threads;
  mo.backend = c.backend;
  mo.device = c.device;
  check(cb_model_load(c.model_path.c_str(), &mo, &model.h),
        "cannot load model '" + c.model_path + "'");
}

void create_session(const Model& model, int threads, int n_ctx, Session& s) {
  cb_session_options so;
  cb_session_options_init(&so);
  so.n_threads = threads;
  so.n_ctx = n_ctx;
  check(cb_session_create(model.h, &so, &s.h), "cannot create a session");
}

std::vector<int32_t> tokenize(const Model& model, const std::string& text, bool add_special,
                              bool parse_special) {
  size_t n = 0;
  check(cb_tokenize(model.h, text.data(), text.size(), add_special, parse_special, nullptr, 0, &n),
        "cannot tokenize");
  std::vector<int32_t> ids(n);
  if (n > 0)
    check(cb_tokenize(model.h, text.data(), text.size(), add_special, parse_special, ids.data(),
                      ids.size(), &n),
          "cannot tokenize");
  return ids;
}

std::string model_name(const Model& model) {
  cb_model_info info;
  cb_model_info_init(&info);
  check(cb_model_get_info(model.h, &info), "cannot read the model's info");
  return info.name;
}

std::string kernels_name(const Model& model) {
  cb_model_info info;
  cb_model_info_init(&info);
  check(cb_model_get_info(model.h, &info), "cannot read the model's info");
  return info.kernels;
}

cbs::JsonObject header(const char* bench, const Common& c, const Model& model,
                       const char* mode = "full") {
  cbs::JsonObject o;
  o.add("bench", bench)
      .add("mode", mode)
      .add("threads", static_cast<int64_t>(c.threads))
      .add("model", c.model_path)
      .add("model_name", model_name(model))
      .add("kernels", kernels_name(model));
  return o;
}

// A prompt that does not fit is the caller's mistake: say it plainly.
void check_generate(cb_status s, const Session& session, size_t n_prompt) {
  if (s == CB_ERR_CONTEXT_OVERFLOW)
    runtime_error(
        "the prompt (" + std::to_string(n_prompt) + " tokens) does not fit in the context (" +
        std::to_string(cb_session_n_ctx(session.h)) + " tokens); shorten it or raise --n-ctx");
  check(s, "generation failed");
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ---------------------------------------------------------------------------
// generate

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
  create_session(model, c.threads, c.n_ctx, session);

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
                 "\n[%s, %d threads, %s kernels] prompt %d tokens, ttft %.1f ms "
                 "(prefill %.1f ms); %d tokens generated, decode %.1f tok/s\n",
                 model_name(model).c_str(), c.threads, kernels_name(model).c_str(), stats.n_prompt,
                 stats.ttft_ms, stats.prefill_ms, stats.n_generated, stats.tok_s);
  }
  return 0;
}

// ---------------------------------------------------------------------------
// prefill / decode

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

int cmd_prefill(const Args& a) {
  const int n = static_cast<int>(parse_int(a, "--tokens", 512, 1, 1 << 24));
  const int repeat = static_cast<int>(parse_int(a, "--repeat", 3, 1, 1000));
  const Common c = common_options(a);
  Model model;
  load_model(c, model);
  Session session;
  create_session(model, c.threads, c.n_ctx > 0 ? c.n_ctx : n, session);
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
        .add("ms_runs", ms);
    std::printf("%s\n", o.str().c_str());
  } else {
    std::printf("%-8s %7s %7s %10s %11s %11s  %s\n", "bench", "threads", "tokens", "ms(med)",
                "tok/s(med)", "tok/s(best)", "model");
    std::printf("%-8s %7d %7d %10.1f %11.1f %11.1f  %s (%s)\n", "prefill", c.threads, n, med, tok_s,
                best > 0 ? n * 1000.0 / best : 0.0, model_name(model).c_str(),
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
  create_session(model, c.threads, c.n_ctx > 0 ? c.n_ctx : ctx + n + 1, session);
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
    std::printf("%-8s %7d %7d %7d %11.1f %10.2f  %s (%s)\n", "decode", c.threads, ctx, generated,
                tok_s, tok_s > 0 ? 1000.0 / tok_s : 0.0, model_name(model).c_str(),
                kernels_name(model).c_str());
  }
  return 0;
}

// ---------------------------------------------------------------------------
// RAG requests: shared by ttft and quality

struct ChunkCache : cbs::ChunkCacheHandle {
  std::string dir;          // the store's directory, if on flash
  bool remove_dir = false;  // a temporary directory of ours
  cb_store_options opts{};  // how it was opened, if on flash
  ~ChunkCache() {
    reset();  // pending writes finish before the directory goes
    if (remove_dir) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  }
};

int model_n_ctx_train(const Model& model) {
  cb_model_info info;
  cb_model_info_init(&info);
  check(cb_model_get_info(model.h, &info), "cannot read the model's info");
  return info.n_ctx_train;
}

std::vector<cb_mode> parse_modes(const Args& a, const char* def) {
  auto it = a.values.find("--modes");
  const std::string list = it == a.values.end() ? def : it->second;
  std::vector<cb_mode> modes;
  size_t start = 0;
  for (;;) {
    const size_t comma = list.find(',', start);
    const std::string name = list.substr(start, comma == std::string::npos ? comma : comma - start);
    bool found = false;
    for (int m = CB_MODE_FULL; m <= CB_MODE_BLEND; ++m)
      if (name == cb_mode_name(static_cast<cb_mode>(m))) {
        if (std::find(modes.begin(), modes.end(), static_cast<cb_mode>(m)) != modes.end())
          usage_error("option --modes: '" + name + "' is listed twice");
        modes.push_back(static_cast<cb_mode>(m));
        found = true;
      }
    if (!found)
      usage_error("option --modes: unknown mode '" + name +
                  "' (expected a comma-separated list of full, prefix, reuse, blend)");
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return modes;
}

// --ratio auto: the loading controller picks the ratio (needs a store).
constexpr float kAutoRatio = -1.0f;

// Sets the ratio fields of `ro` from a parse_ratios value.
void set_ratio(cb_rag_options& ro, float r) {
  ro.auto_ratio = r == kAutoRatio ? 1 : 0;
  cb_rag_options defaults;  // auto: the library's default floor
  cb_rag_options_init(&defaults);
  ro.ratio = r == kAutoRatio ? defaults.ratio : r;
}

bool parse_pipeline(const Args& a) {
  auto it = a.values.find("--pipeline");
  if (it == a.values.end() || it->second == "on") return true;
  if (it->second == "off") return false;
  usage_error("option --pipeline: '" + it->second + "' is not on or off");
}

std::vector<float> parse_ratios(const Args& a, bool allow_list) {
  auto it = a.values.find("--ratio");
  if (it == a.values.end()) {
    cb_rag_options defaults;  // the library's default ratio
    cb_rag_options_init(&defaults);
    return {defaults.ratio};
  }
  const std::string& list = it->second;
  std::vector<float> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = list.find(',', start);
    const std::string item = list.substr(start, comma == std::string::npos ? comma : comma - start);
    cbs::RatioArg r;
    std::string error;
    if (!cbs::parse_ratio_arg(item, r, error)) usage_error("option --ratio: " + error);
    out.push_back(r.is_auto ? kAutoRatio : r.value);  // auto: the loading controller chooses
    if (comma == std::string::npos) break;
    if (!allow_list) usage_error("option --ratio takes one number here");
    start = comma + 1;
  }
  return out;
}

cb_chunk_head parse_chunk_head(const Args& a) {
  auto it = a.values.find("--chunk-head");
  if (it == a.values.end() || it->second == "prompt") return CB_CHUNK_HEAD_PROMPT;
  if (it->second == "none") return CB_CHUNK_HEAD_NONE;
  usage_error("option --chunk-head: '" + it->second + "' is not prompt or none");
}

// --select P[,P2,...]: blend's selection policies (default: the library's).
std::vector<cb_select> parse_selects(const Args& a) {
  auto it = a.values.find("--select");
  if (it == a.values.end()) return {CB_SELECT_DEFAULT};
  std::vector<cb_select> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = it->second.find(',', start);
    const std::string name =
        it->second.substr(start, comma == std::string::npos ? comma : comma - start);
    bool found = false;
    if (name == "default") {
      out.push_back(CB_SELECT_DEFAULT);
      found = true;
    }
    for (int v = CB_SELECT_HKVD; v <= CB_SELECT_ORACLE && !found; ++v)
      if (name == cb_select_name(static_cast<cb_select>(v))) {
        out.push_back(static_cast<cb_select>(v));
        found = true;
      }
    if (!found)
      usage_error("option --select: unknown policy '" + name +
                  "' (expected hkvd, hkvd_kv, attention, lookahead, random, oracle or default)");
    // Compared by name: default and the policy it stands for are one run.
    const std::string resolved = cb_select_name(out.back());
    if (std::count_if(out.begin(), out.end(),
                      [&](cb_select p) { return resolved == cb_select_name(p); }) > 1)
      usage_error("option --select: '" + name + "' is listed twice (default is " +
                  cb_select_name(CB_SELECT_DEFAULT) + ")");
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// --schedule L:R[,L:R...]: blend's check layers (empty when not given).
std::vector<cb_check_layer> parse_schedule(const Args& a) {
  auto it = a.values.find("--schedule");
  if (it == a.values.end()) return {};
  std::vector<cb_check_layer> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = it->second.find(',', start);
    const std::string item =
        it->second.substr(start, comma == std::string::npos ? comma : comma - start);
    const size_t colon = item.find(':');
    char* end_l = nullptr;
    char* end_r = nullptr;
    errno = 0;
    const long layer = colon == std::string::npos ? -1 : std::strtol(item.c_str(), &end_l, 10);
    const float ratio =
        colon == std::string::npos ? -1.0f : std::strtof(item.c_str() + colon + 1, &end_r);
    if (colon == std::string::npos || colon == 0 || end_l != item.c_str() + colon ||
        end_r == item.c_str() + colon + 1 || *end_r != '\0' || errno == ERANGE || layer < 0 ||
        layer > 100000 || !(ratio >= 0.0f && ratio <= 1.0f))
      usage_error("option --schedule: '" + item +
                  "' is not LAYER:RATIO (a layer number and a ratio in [0, 1])");
    out.push_back({static_cast<int32_t>(layer), ratio});
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// A blend run's selection options, shared by ttft and quality.
struct SelectOptions {
  std::vector<cb_select> selects;
  int sink_tokens = 0;
};

SelectOptions parse_select_options(const Args& a) {
  SelectOptions o;
  o.selects = parse_selects(a);
  o.sink_tokens = static_cast<int>(parse_int(a, "--sink-tokens", 0, 0, 1024));
  return o;
}

const char* chunk_head_label(cb_chunk_head h) {
  return h == CB_CHUNK_HEAD_NONE ? "none" : "prompt";
}

// --storage-mbps B[,B2,...]: read caps in MB/s (empty when not given).
std::vector<double> parse_storage_caps(const Args& a, bool allow_list) {
  auto it = a.values.find("--storage-mbps");
  if (it == a.values.end()) return {};
  std::vector<double> out;
  const std::string& list = it->second;
  size_t start = 0;
  for (;;) {
    const size_t comma = list.find(',', start);
    const std::string item = list.substr(start, comma == std::string::npos ? comma : comma - start);
    errno = 0;
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
      usage_error("option --storage-mbps: '" + item + "' is not a number");
    if (v < 0.001 || v > 1e6)
      usage_error("option --storage-mbps: " + item + " is outside 0.001..1000000");
    if (std::find(out.begin(), out.end(), v) != out.end())
      usage_error("option --storage-mbps: " + item + " is listed twice");
    out.push_back(v);
    if (comma == std::string::npos) break;
    if (!allow_list) usage_error("option --storage-mbps takes one value here");
    start = comma + 1;
  }
  return out;
}

// Reopens a chunk store on flash with another read cap (MB/s); the chunks
// already stored stay.
void reopen_with_cap(ChunkCache& cache, double mbps) {
  cache.reset();
  cache.opts.read_bytes_per_sec = static_cast<uint64_t>(mbps * 1e6);
  check(cb_chunk_cache_open(cache.dir.c_str(), &cache.opts, &cache.h),
        "cannot open the chunk store in '" + cache.dir + "'");
}

// Where chunk KV lives: RAM (f32, the default) or a chunk store on flash
// (--codec f16|q8|q4, f16 if left out; --store DIR or a temporary directory
// removed at exit, --storage-mbps capping its read throughput to emulate
// slow flash; with a list of caps, the first).
std::string open_chunk_cache(const Args& a, ChunkCache& cache, bool allow_cap_list = false) {
  const std::vector<double> caps = parse_storage_caps(a, allow_cap_list);
  const bool throttled = !caps.empty();
  const bool on_flash = throttled || a.values.count("--store") > 0;
  auto it = a.values.find("--codec");
  const std::string codec = it != a.values.end() ? it->second : on_flash ? "f16" : "f32";
  if (codec == "f32" && on_flash) {
    usage_error(
        "option --codec f32 keeps chunk KV in RAM, which --store and --storage-mbps do not use: "
        "pass f16, q8 or q4 (f16 when --codec is left out)");
  }
  if (codec == "f32") {
    check(cb_chunk_cache_create(&cache.h), "cannot create the chunk cache");
    return "f32";
  }
  cb_store_options so;
  cb_store_options_init(&so);
  if (codec == "f16") {
    so.codec = CB_CODEC_F16;
  } else if (codec == "q8") {
    so.codec = CB_CODEC_Q8;
  } else if (codec == "q4") {
    so.codec = CB_CODEC_Q4;
  } else {
    usage_error("option --codec: '" + codec + "' is not one of f32 (RAM), f16, q8, q4");
  }
  if (throttled) so.read_bytes_per_sec = static_cast<uint64_t>(caps.front() * 1e6);
  auto dir = a.values.find("--store");
  if (dir != a.values.end()) {
    cache.dir = dir->second;
  } else {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/cb_bench_store.XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr)
      runtime_error("cannot create a temporary store directory in " + templ);
    cache.dir = templ;
    cache.remove_dir = true;
  }
  cache.opts = so;
  check(cb_chunk_cache_open(cache.dir.c_str(), &so, &cache.h),
        "cannot open the chunk store in '" + cache.dir + "'");
  return codec;
}

std::string cache_label(const std::string& codec) {
  return codec == "f32" ? "chunk KV in RAM (f32)" : "chunk KV on flash (" + codec + ")";
}

// Runs one RAG prefill on the reset session; throws on failure with the
// library's message (context overflow named plainly).
void rag_prefill(const Session& session, const ChunkCache& cache,
                 const std::vector<const char*>& chunks, const std::string& question,
                 const cb_rag_options& ro, cb_rag_stats& st) {
  check(cb_session_reset(session.h), "cannot reset the session");
  cb_rag_stats_init(&st);
  const cb_status s =
      cb_rag_prefill(session.h, cache.h, chunks.data(), chunks.size(), question.c_str(), &ro, &st);
  if (s == CB_ERR_CONTEXT_OVERFLOW)
    runtime_error(std::string("the request does not fit the context: ") + cb_last_error() +
                  " (raise --n-ctx or use fewer/shorter chunks)");
  check(s, std::string("RAG prefill (") + cb_mode_name(ro.mode) + ") failed");
}

// A float option value as the decimal it was given as (0.15, not 0.150000006).
double ratio_value(float r) {
  return std::round(static_cast<double>(r) * 1e6) / 1e6;
}

using Clock = std::chrono::steady_clock;
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// ---------------------------------------------------------------------------
// Plots (--plot FILE.png), drawn by gnuplot

// The --plot path, checked before any work: a benchmark that runs for
// minutes must not fail at the end for want of gnuplot.
std::string plot_path(const Args& a) {
  auto it = a.values.find("--plot");
  if (it == a.values.end()) return "";
  const std::string& path = it->second;
  if (path.size() < 5 || path.substr(path.size() - 4) != ".png")
    usage_error("option --plot: '" + path + "' is not a .png file name");
  // The directory must take the file (and quality's FILE_tf.png beside it).
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const bool exists = ::access(path.c_str(), F_OK) == 0;
  if (::access(exists ? path.c_str() : dir.c_str(), W_OK) != 0)
    runtime_error("option --plot: cannot write '" + path + "': " + std::strerror(errno));
  bool found = false;
  if (const char* env = std::getenv("PATH")) {
    const std::string dirs = env;
    size_t start = 0;
    while (!found) {
      const size_t colon = dirs.find(':', start);
      const std::string dir =
          dirs.substr(start, colon == std::string::npos ? colon : colon - start);
      found = ::access(((dir.empty() ? "." : dir) + "/gnuplot").c_str(), X_OK) == 0;
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
  }
  if (!found)
    runtime_error(
        "--plot needs gnuplot, which is not on the PATH (Debian: apt-get install gnuplot-nox; "
        "scripts/setup.sh installs it)");
  return path;
}

struct PlotSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y)
  bool dashed = false;
};

struct PlotSpec {
  std::string title, xlabel, ylabel;
  bool logx = false;
  double ymax = 0.0;                    // 0: gnuplot's choice
  std::vector<std::string> categories;  // x = 0, 1, ... labelled with these
  std::vector<PlotSeries> series;
};

// gnuplot string literal (single quotes; a quote is doubled).
std::string gp_quote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("''") : std::string(1, ch);
  return out + "'";
}

void draw_plot(const std::string& png, const PlotSpec& spec) {
  std::string script = "set terminal pngcairo size 960,600 font 'sans,11'\n";
  script += "set output " + gp_quote(png) + "\n";
  script += "set title " + gp_quote(spec.title) + " noenhanced\n";
  script += "set xlabel " + gp_quote(spec.xlabel) + "\nset ylabel " + gp_quote(spec.ylabel) + "\n";
  script += "set grid\nset key outside right top noenhanced\n";
  script += spec.ymax > 0 ? "set yrange [0:" + cbs::json_number(spec.ymax) + "]\n"
                          : std::string("set yrange [0:*]\n");
  if (spec.logx) script += "set logscale x\n";
  if (!spec.categories.empty()) {
    script += "set xrange [-0.5:" + std::to_string(spec.categories.size() - 0.5) + "]\nset xtics (";
    for (size_t i = 0; i < spec.categories.size(); ++i)
      script += (i ? ", " : "") + gp_quote(spec.categories[i]) + " " + std::to_string(i);
    script += ") noenhanced\n";
  }
  // Inline data blocks: no temporary files to clean up.
  for (size_t i = 0; i < spec.series.size(); ++i) {
    script += "$d" + std::to_string(i) + " << EOD\n";
    for (const auto& [x, y] : spec.series[i].points)
      script += cbs::json_number(x) + " " + cbs::json_number(y) + "\n";
    script += "EOD\n";
  }
  script += "plot ";
  for (size_t i = 0; i < spec.series.size(); ++i)
    script += std::string(i ? ", " : "") + "$d" + std::to_string(i) +
              " using 1:2 with linespoints lw 2 pt 7" + (spec.series[i].dashed ? " dt 2" : "") +
              " title " + gp_quote(spec.series[i].name);
  script += "\n";
  // gnuplot writes the image to stdout when it cannot open the file: never
  // to ours, which carries the JSON lines.
  FILE* gp = ::popen("gnuplot >/dev/null", "w");
  if (gp == nullptr) runtime_error(std::string("cannot run gnuplot: ") + std::strerror(errno));
  std::fwrite(script.data(), 1, script.size(), gp);
  const int status = ::pclose(gp);
  if (status != 0)
    runtime_error("gnuplot failed (status " + std::to_string(status) + ") drawing " + png);
  if (::access(png.c_str(), F_OK) != 0) runtime_error("gnuplot did not write " + png);
  std::fprintf(stderr, "plot written to %s\n", png.c_str());
}

// ---------------------------------------------------------------------------
// ttft

// Varied English prose: the pool chunks are cut from.
const char* const kPool[] = {
    "The old lighthouse stood at the edge of the harbor for more than a century. Every evening "
    "the keeper climbed the spiral stairs, trimmed the wick and polished the great lens until it "
    "shone. Ships coming home through the fog counted the seconds between flashes and knew where "
    "they were.",
    "Sourdough bread depends on a culture of wild yeast and lactic acid bacteria. Bakers feed the "
    "starter with flour and water, wait until it doubles, and mix a small portion into the dough. "
    "A long, cool fermentation gives the crumb its open texture and the crust its slight sourness.",
    "In 1859 a solar storm lit up the night sky so brightly that gold miners in the Rocky "
    "Mountains woke and began making breakfast. Telegraph lines sparked, some operators received "
    "shocks, and a few stations kept sending messages with their batteries disconnected.",
    "The committee met on a rainy Tuesday to review the budget for the new library wing. The "
    "architect presented three designs: one in glass and steel, one in brick to match the town "
    "hall, and a cheaper timber frame that could be finished before the winter.",
    "Octopuses have three hearts and blue blood. Two of the hearts pump blood through the gills, "
    "while the third circulates it to the rest of the body. Most of their neurons are in their "
    "arms, which can taste and touch and react even when separated from the brain.",
    "The railway reached the valley in the spring of 1887. Within ten years the village had a "
    "post office, two hotels and a school, and farmers could send fresh milk to the city every "
    "morning. The old coaching road was soon overgrown with nettles and wild roses.",
    "A compiler translates source code into machine instructions in several stages. The parser "
    "builds a syntax tree, the optimizer rewrites it into faster but equivalent forms, and the "
    "code generator assigns registers and emits the instructions the processor will execute.",
    "During the long drought the river dropped so low that the ruins of a drowned village "
    "appeared: stone walls, a church tower and the arches of a bridge that had been under water "
    "for forty years. Families who had once lived there came back to walk its streets again.",
    "Chess players use opening books, but the middle game rewards imagination. A knight on an "
    "outpost, a pawn that cramps the enemy position or an open file for a rook can decide a game "
    "long before any piece is captured.",
    "The volunteers counted birds along the coast every January. They recorded ducks, geese, "
    "gulls and waders, noted the weather and the tide, and sent their sheets to the society, "
    "which has kept the same survey going without a break since 1952.",
};
constexpr size_t kPoolSize = sizeof(kPool) / sizeof(kPool[0]);

const char* const kQueryPool =
    "Using the documents above, explain what the keeper of the lighthouse did every evening, "
    "how sourdough bread gets its texture, what happened during the solar storm of 1859, which "
    "designs the architect presented, why octopuses have three hearts, and how the railway "
    "changed the village in the valley";

// `text` (repeated as needed) cut to n tokens and turned back into text.
std::string text_of_tokens(const Model& model, const std::string& text, size_t n) {
  std::vector<int32_t> ids = tokenize(model, text, false, false);
  if (ids.empty()) runtime_error("the benchmark text tokenizes to nothing");
  const std::vector<int32_t> unit = ids;
  while (ids.size() < n) ids.insert(ids.end(), unit.begin(), unit.end());
  ids.resize(n);
  size_t len = 0;
  check(cb_detokenize(model.h, ids.data(), ids.size(), 0, nullptr, 0, &len), "cannot detokenize");
  std::vector<char> buf(len + 1);
  check(cb_detokenize(model.h, ids.data(), ids.size(), 0, buf.data(), buf.size(), &len),
        "cannot detokenize");
  return std::string(buf.data(), len);
}

// Chunk i: "Document i." then the pool's paragraphs from paragraph i on.
std::string bench_chunk(const Model& model, size_t i, size_t n_tokens) {
  std::string text = "Document " + std::to_string(i + 1) + ". ";
  for (size_t k = 0; k < kPoolSize; ++k) {
    text += kPool[(i + k) % kPoolSize];
    text += ' ';
  }
  return text_of_tokens(model, text, n_tokens);
}

struct TtftRow {
  cb_mode mode;
  float ratio_opt;                       // the ratio asked for (blend)
  cb_select select = CB_SELECT_DEFAULT;  // blend's policy
  double storage_mbps = 0.0;             // the store's read cap; 0: none
  double ttft_ms, compute_ms;
  std::vector<double> runs;
  cb_rag_stats st;  // of the last run
  double load_ms = 0.0, blocked_ms = 0.0, upload_ms = 0.0;
};

std::string ratio_label(float r) {
  if (r == kAutoRatio) return "auto";
  char buf[16];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(r));
  return buf;
}

// TTFT per mode against the read cap (several --storage-mbps), else against
// the ratio (several --ratio; modes without a ratio are flat lines), else
// one point per mode.
void plot_ttft(const std::string& png, const std::vector<TtftRow>& rows,
               const std::vector<double>& caps, const std::vector<float>& ratios, int n_chunks,
               int chunk_tokens, int threads) {
  PlotSpec spec;
  spec.title = "TTFT, " + std::to_string(n_chunks) + " chunks x " + std::to_string(chunk_tokens) +
               " tokens, " + std::to_string(threads) + " threads";
  spec.ylabel = "TTFT (ms, median)";
  auto series_name = [](const TtftRow& r) {
    return r.mode == CB_MODE_BLEND ? "blend r=" + ratio_label(r.ratio_opt)
                                   : std::string(cb_mode_name(r.mode));
  };
  auto series_for = [&](const std::string& name) -> PlotSeries& {
    for (auto& s : spec.series)
      if (s.name == name) return s;
    spec.series.push_back({name, {}, false});
    return spec.series.back();
  };
  if (caps.size() > 1) {
    spec.xlabel = "chunk store read cap (MB/s)";
    spec.logx = true;
    for (const auto& r : rows)
      series_for(series_name(r)).points.push_back({r.storage_mbps, r.ttft_ms});
  } else if (ratios.size() > 1) {
    spec.xlabel = "recompute ratio r (blend)";
    std::vector<double> xs;
    for (const auto& r : rows)
      if (r.mode == CB_MODE_BLEND) xs.push_back(static_cast<double>(r.st.ratio));
    const double lo = xs.empty() ? 0.0 : *std::min_element(xs.begin(), xs.end());
    const double hi = xs.empty() ? 1.0 : *std::max_element(xs.begin(), xs.end());
    PlotSeries blend{"blend", {}, false};
    for (const auto& r : rows) {
      if (r.mode == CB_MODE_BLEND && r.ratio_opt != kAutoRatio) {
        blend.points.push_back({static_cast<double>(r.st.ratio), r.ttft_ms});
      } else if (r.mode == CB_MODE_BLEND) {
        // The controller's pick, at the ratio it chose.
        spec.series.push_back(
            {"blend auto", {{static_cast<double>(r.st.ratio), r.ttft_ms}}, false});
      } else {
        spec.series.push_back({cb_mode_name(r.mode), {{lo, r.ttft_ms}, {hi, r.ttft_ms}}, true});
      }
    }
    std::sort(blend.points.begin(), blend.points.end());
    if (!blend.points.empty()) spec.series.insert(spec.series.begin(), blend);
  } else {
    spec.xlabel = "mode";
    PlotSeries s{"TTFT", {}, false};
    for (const auto& r : rows) {
      s.points.push_back({static_cast<double>(spec.categories.size()), r.ttft_ms});
      spec.categories.push_back(series_name(r));
    }
    spec.series.push_back(s);
  }
  draw_plot(png, spec);
}

int cmd_ttft(const Args& a) {
  if (!a.values.count("--chunks")) usage_error("ttft needs --chunks N");
  if (!a.values.count("--chunk-tokens")) usage_error("ttft needs --chunk-tokens T");
  const int n_chunks = static_cast<int>(parse_int(a, "--chunks", 0, 1, 4096));
  const int chunk_tokens = static_cast<int>(parse_int(a, "--chunk-tokens", 0, 1, 1 << 20));
  const int query_tokens = static_cast<int>(parse_int(a, "--query-tokens", 32, 1, 1 << 20));
  const int repeat = static_cast<int>(parse_int(a, "--repeat", 3, 1, 1000));
  const std::vector<float> ratios = parse_ratios(a, true);
  const std::vector<cb_mode> modes = parse_modes(a, "full,prefix,reuse,blend");
  const cb_chunk_head head = parse_chunk_head(a);
  const SelectOptions sel = parse_select_options(a);
  const std::vector<double> caps = parse_storage_caps(a, true);
  const std::string plot = plot_path(a);
  const Common c = common_options(a);

  Model model;
  load_model(c, model);
  const int n_ctx_train = model_n_ctx_train(model);
  const long long need_min = static_cast<long long>(n_chunks) * chunk_tokens + query_tokens;
  if (need_min > n_ctx_train)
    runtime_error("the request needs at least " + std::to_string(need_min) +
                  " tokens, more than the model's context of " + std::to_string(n_ctx_train));

  std::vector<std::string> texts;
  for (int i = 0; i < n_chunks; ++i)
    texts.push_back(bench_chunk(model, static_cast<size_t>(i), static_cast<size_t>(chunk_tokens)));
  std::vector<const char*> chunks;
  for (const auto& t : texts) chunks.push_back(t.c_str());
  const std::string question =
      text_of_tokens(model, kQueryPool, static_cast<size_t>(std::max(1, query_tokens - 1))) + "?";

  // Room for the request: the chunks as tokenized, the question, and the
  // prompt's fixed parts (system turn, separators, assistant header).
  long long need = static_cast<long long>(tokenize(model, question, false, false).size()) + 96;
  for (const auto& t : texts)
    need += static_cast<long long>(tokenize(model, t, false, false).size()) + 4;
  const int n_ctx =
      c.n_ctx > 0 ? c.n_ctx : static_cast<int>(std::min<long long>(need, n_ctx_train));

  Session session;
  create_session(model, c.threads, n_ctx, session);
  ChunkCache cache;
  const std::string codec = open_chunk_cache(a, cache, true);

  cb_rag_options ro;
  cb_rag_options_init(&ro);
  ro.chunk_head = head;
  ro.sink_tokens = sel.sink_tokens;
  cb_rag_stats st;
  ro.pipeline = parse_pipeline(a) ? 1 : 0;
  cb_generate_options go;
  cb_generate_options_init(&go);
  go.max_tokens = 1;
  std::vector<TtftRow> rows;
  // Every mode and ratio once per read cap (one pass when none is set).
  const size_t n_caps = std::max<size_t>(1, caps.size());
  for (size_t ci = 0; ci < n_caps; ++ci) {
    if (ci > 0) reopen_with_cap(cache, caps[ci]);
    // Warm the cache (and every page of the weights): untimed.
    ro.mode = CB_MODE_BLEND;
    set_ratio(ro, 0.15f);
    rag_prefill(session, cache, chunks, question, ro, st);
    check(cb_chunk_cache_flush(cache.h), "cannot flush the chunk cache");
    if (std::find(ratios.begin(), ratios.end(), kAutoRatio) != ratios.end()) {
      // The controller's first-use probe (and a first refresh) stay untimed.
      set_ratio(ro, kAutoRatio);
      rag_prefill(session, cache, chunks, question, ro, st);
    }
    // Repeats are interleaved (every mode and ratio once, then again), so
    // that a burst of load on a shared machine hits them all alike.
    const size_t first = rows.size();
    for (cb_mode mode : modes) {
      const std::vector<float> rs = mode == CB_MODE_BLEND ? ratios : std::vector<float>{0.15f};
      const std::vector<cb_select> ss =
          mode == CB_MODE_BLEND ? sel.selects : std::vector<cb_select>{CB_SELECT_DEFAULT};
      for (cb_select p : ss)
        for (float r : rs) {
          TtftRow row{};
          row.mode = mode;
          row.ratio_opt = r;
          row.select = p;
          row.storage_mbps = caps.empty() ? 0.0 : caps[ci];
          rows.push_back(row);
        }
    }
    std::vector<std::vector<double>> compute(rows.size()), load(rows.size()), blocked(rows.size()),
        upload(rows.size());
    for (int k = 0; k < repeat; ++k) {
      for (size_t i = first; i < rows.size(); ++i) {
        TtftRow& row = rows[i];
        ro.mode = row.mode;
        ro.select = row.select;
        set_ratio(ro, row.ratio_opt);
        check(cb_session_reset(session.h), "cannot reset the session");
        const auto t0 = Clock::now();
        rag_prefill(session, cache, chunks, question, ro, st);
        check(cb_generate(session.h, nullptr, 0, &go, nullptr, nullptr, nullptr),
              "cannot sample the first token");
        const auto t1 = Clock::now();
        row.runs.push_back(ms_between(t0, t1));
        compute[i].push_back(st.recompute_ms);
        load[i].push_back(st.load_ms);
        blocked[i].push_back(st.blocked_ms);
        upload[i].push_back(st.upload_ms);
        row.st = st;
      }
    }
    for (size_t i = first; i < rows.size(); ++i) {
      rows[i].ttft_ms = median(rows[i].runs);
      rows[i].compute_ms = median(compute[i]);
      rows[i].load_ms = median(load[i]);
      rows[i].blocked_ms = median(blocked[i]);
      rows[i].upload_ms = median(upload[i]);
    }
  }

  // Full prefill's TTFT under the same read cap (0 when not run).
  auto full_ms_at = [&](double cap) {
    for (const auto& r : rows)
      if (r.mode == CB_MODE_FULL && r.storage_mbps == cap) return r.ttft_ms;
    return 0.0;
  };
  if (c.json) {
    for (const auto& r : rows) {
      const double full_ms = full_ms_at(r.storage_mbps);
      cbs::JsonObject o = header("ttft", c, model, cb_mode_name(r.mode));
      o.add("ttft_ms", r.ttft_ms)
          .add("load_ms", r.load_ms)
          .add("compute_ms", r.compute_ms)
          .add("blocked_ms", r.blocked_ms)
          .add("upload_ms", r.upload_ms)
          .add("ratio", ratio_value(r.st.ratio))
          .add("ratio_mode", r.ratio_opt == kAutoRatio ? "auto" : "fixed")
          .add("select", r.mode == CB_MODE_BLEND ? cb_select_name(r.select) : "none")
          .add("sink_tokens", static_cast<int64_t>(sel.sink_tokens))
          .add("pipeline", r.st.pipelined != 0)
          .add("bytes_read", static_cast<int64_t>(r.st.bytes_read))
          .add("n_ctx", r.st.n_tokens)
          .add("computed_fraction", r.st.computed_fraction)
          .add("cache_hits", r.st.cache_hits)
          .add("cache_misses", r.st.cache_misses)
          .add("n_reused", r.st.n_reused)
          .add("chunks", static_cast<int64_t>(n_chunks))
          .add("chunk_tokens", static_cast<int64_t>(chunk_tokens))
          .add("query_tokens", static_cast<int64_t>(query_tokens))
          .add("chunk_head", chunk_head_label(head))
          .add("codec", codec)
          .add("repeat", static_cast<int64_t>(repeat))
          .add("stat", "median")
          .add("ttft_ms_runs", r.runs);
      if (r.storage_mbps > 0.0)
        o.add("storage_mbps", r.storage_mbps);
      else
        o.add_null("storage_mbps");
      if (full_ms > 0.0)
        o.add("ttft_vs_full", r.ttft_ms / full_ms);
      else
        o.add_null("ttft_vs_full");
      std::printf("%s\n", o.str().c_str());
    }
  } else {
    std::printf(
        "ttft: %d chunks x %d tokens, question %d tokens, request %d tokens; %s (%s), "
        "%d threads; chunk head %s, %s; median of %d\n",
        n_chunks, chunk_tokens, query_tokens, rows.empty() ? 0 : rows[0].st.n_tokens,
        model_name(model).c_str(), kernels_name(model).c_str(), c.threads, chunk_head_label(head),
        cache_label(codec).c_str(), repeat);
    if (!caps.empty()) std::printf("%8s ", "MB/s");
    std::printf("%-7s %-9s %6s %10s %11s %9s %10s %9s %5s %7s %8s\n", "mode", "select", "ratio",
                "ttft_ms", "compute_ms", "load_ms", "blocked_ms", "computed", "hits", "misses",
                "vs_full");
    for (const auto& r : rows) {
      const double full_ms = full_ms_at(r.storage_mbps);
      if (!caps.empty()) std::printf("%8g ", r.storage_mbps);
      char vs[32] = "-";
      if (full_ms > 0.0) std::snprintf(vs, sizeof vs, "%.3f", r.ttft_ms / full_ms);
      char ratio[16];
      std::snprintf(ratio, sizeof ratio, r.ratio_opt == kAutoRatio ? "a%.2f" : "%.2f",
                    static_cast<double>(r.st.ratio));
      std::printf("%-7s %-9s %6s %10.1f %11.1f %9.1f %10.1f %9.3f %5d %7d %8s\n",
                  cb_mode_name(r.mode), r.mode == CB_MODE_BLEND ? cb_select_name(r.select) : "-",
                  ratio, r.ttft_ms, r.compute_ms, r.load_ms, r.blocked_ms, r.st.computed_fraction,
                  r.st.cache_hits, r.st.cache_misses, vs);
    }
  }
  if (!plot.empty()) plot_ttft(plot, rows, caps, ratios, n_chunks, chunk_tokens, c.threads);
  return 0;
}

// ---------------------------------------------------------------------------
// quality

struct Example {
  std::string question;
  std::vector<std::string> answers;
  std::vector<std::string> chunks;  // title + "\n" + text
};

std::vector<Example> load_dataset(const std::string& path, size_t limit, size_t max_chunks) {
  std::ifstream in(path, std::ios::binary);
  if (!in) runtime_error("cannot open dataset '" + path + "': " + std::strerror(errno));
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    runtime_error("dataset '" + path + "' is not valid JSON: " + e.what());
  }
  auto bad = [&](size_t i, const std::string& what) {
    runtime_error("dataset '" + path + "': example " + std::to_string(i) + ": " + what +
                  " (expected {question, answers[], ctxs[{title, text}]})");
  };
  if (!doc.is_array()) runtime_error("dataset '" + path + "': the top level is not a list");
  std::vector<Example> out;
  for (size_t i = 0; i < doc.size() && out.size() < limit; ++i) {
    const nlohmann::json& e = doc[i];
    if (!e.is_object()) bad(i, "not an object");
    Example ex;
    if (!e.contains("question") || !e["question"].is_string()) bad(i, "'question' is not a string");
    // The short-answer instruction goes right after the question, where a
    // small model follows it (in the system prompt alone it mostly restates
    // the question).
    ex.question = e["question"].get<std::string>() + "\nAnswer in at most five words.";
    if (!e.contains("answers") || !e["answers"].is_array() || e["answers"].empty())
      bad(i, "'answers' is not a non-empty list");
    for (const auto& ans : e["answers"]) {
      if (!ans.is_string()) bad(i, "an answer is not a string");
      ex.answers.push_back(ans.get<std::string>());
    }
    if (!e.contains("ctxs") || !e["ctxs"].is_array() || e["ctxs"].empty())
      bad(i, "'ctxs' is not a non-empty list");
    for (const auto& ctx : e["ctxs"]) {
      if (ex.chunks.size() >= max_chunks) break;
      if (!ctx.is_object() || !ctx.contains("text") || !ctx["text"].is_string())
        bad(i, "a ctx has no 'text' string");
      std::string title;
      if (ctx.contains("title")) {
        if (!ctx["title"].is_string()) bad(i, "a ctx's 'title' is not a string");
        title = ctx["title"].get<std::string>();
      }
      ex.chunks.push_back(title.empty() ? ctx["text"].get<std::string>()
                                        : title + "\n" + ctx["text"].get<std::string>());
    }
    out.push_back(std::move(ex));
  }
  if (out.empty()) runtime_error("dataset '" + path + "' has no examples");
  return out;
}

// SQuAD answer normalization: lowercase, no punctuation, no articles
// (a, an, the), whitespace collapsed; returned as its words.
std::vector<std::string> normalized_words(const std::string& s) {
  std::string t;
  for (unsigned char ch : s) {
    if (ch < 0x80 && std::ispunct(ch)) continue;
    t += ch < 0x80 ? static_cast<char>(std::tolower(ch)) : static_cast<char>(ch);
  }
  std::vector<std::string> words;
  size_t i = 0;
  while (i < t.size()) {
    while (i < t.size() && std::isspace(static_cast<unsigned char>(t[i]))) ++i;
    size_t j = i;
    while (j < t.size() && !std::isspace(static_cast<unsigned char>(t[j]))) ++j;
    if (j > i) {
      std::string w = t.substr(i, j - i);
      if (w != "a" && w != "an" && w != "the") words.push_back(std::move(w));
    }
    i = j;
  }
  return words;
}

// Token-overlap F1 of two answers (SQuAD); 1 when both normalize to nothing.
double answer_f1(const std::string& prediction, const std::string& reference) {
  const std::vector<std::string> p = normalized_words(prediction);
  const std::vector<std::string> r = normalized_words(reference);
  if (p.empty() || r.empty()) return p.empty() && r.empty() ? 1.0 : 0.0;
  std::map<std::string, int> count;
  for (const auto& w : r) ++count[w];
  int same = 0;
  for (const auto& w : p) {
    auto it = count.find(w);
    if (it != count.end() && it->second > 0) {
      --it->second;
      ++same;
    }
  }
  if (same == 0) return 0.0;
  const double precision = static_cast<double>(same) / static_cast<double>(p.size());
  const double recall = static_cast<double>(same) / static_cast<double>(r.size());
  return 2.0 * precision * recall / (precision + recall);
}

// KL(P || Q) of the softmax distributions of two logit vectors, in double.
double kl_softmax(const std::vector<float>& p_logits, const std::vector<float>& q_logits) {
  auto log_sum_exp = [](const std::vector<float>& v) {
    double mx = -INFINITY;
    for (float x : v) mx = std::max(mx, static_cast<double>(x));
    double sum = 0.0;
    for (float x : v) sum += std::exp(static_cast<double>(x) - mx);
    return mx + std::log(sum);
  };
  const double lp = log_sum_exp(p_logits), lq = log_sum_exp(q_logits);
  double kl = 0.0;
  for (size_t i = 0; i < p_logits.size(); ++i) {
    const double a = static_cast<double>(p_logits[i]) - lp;
    const double b = static_cast<double>(q_logits[i]) - lq;
    kl += std::exp(a) * (a - b);
  }
  return std::max(0.0, kl);
}

int32_t argmax_of(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Collects an answer; stops at the first newline (keeping the text before it).
struct AnswerState {
  std::string text;
};

int on_answer_token(int32_t, const char* piece, size_t len, void* user) {
  auto* st = static_cast<AnswerState*>(user);
  const std::string_view p(piece, len);
  const size_t nl = p.find('\n');
  st->text.append(p.substr(0, nl));
  return nl != std::string_view::npos;
}

struct ModeResult {
  std::string answer;
  std::vector<float> logits;  // first token's
  double ttft_ms = 0.0;
  cb_rag_stats st{};
};

std::vector<float> session_logits(const Session& session) {
  const float* logits = nullptr;
  size_t n_vocab = 0;
  check(cb_session_logits(session.h, &logits, &n_vocab), "cannot read the logits");
  return {logits, logits + n_vocab};
}

// One mode on one example: RAG prefill (again if it had to compute chunks,
// so that the measured run is a cached one), first-token logits, answer.
ModeResult run_mode(const Session& session, const ChunkCache& cache, const Example& ex,
                    const cb_rag_options& ro, int max_tokens) {
  std::vector<const char*> chunks;
  for (const auto& c : ex.chunks) chunks.push_back(c.c_str());
  ModeResult r;
  rag_prefill(session, cache, chunks, ex.question, ro, r.st);
  if (ro.mode != CB_MODE_FULL && r.st.cache_misses > 0) {
    // A store writes new chunks back asynchronously: wait for them.
    check(cb_chunk_cache_flush(cache.h), "cannot flush the chunk cache");
    rag_prefill(session, cache, chunks, ex.question, ro, r.st);
    if (r.st.cache_misses > 0) runtime_error("chunks computed in one run were missing in the next");
  }
  r.logits = session_logits(session);

  cb_generate_options go;
  cb_generate_options_init(&go);
  go.max_tokens = max_tokens;
  cb_generate_stats gs;
  cb_generate_stats_init(&gs);
  AnswerState ans;
  const cb_status s = cb_generate(session.h, nullptr, 0, &go, on_answer_token, &ans, &gs);
  if (s != CB_ERR_CANCELLED) check(s, "generation failed");
  r.answer = ans.text;
  // TTFT: the RAG prefill plus choosing the first token (a generation that
  // continues a prefill counts it in gs.ttft_ms).
  r.ttft_ms = gs.ttft_ms;
  return r;
}

// Teacher forcing: full prefill's greedy answer and the logits that predict
// each of its tokens, then every mode's logits on the same tokens.
struct ForcedAnswer {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // logits[t] predicts tokens[t]
};

// Greedy continuation of the prefilled session: up to n tokens, ending
// after an end-of-generation token.
ForcedAnswer greedy_answer(const Model& model, const Session& session, int n) {
  ForcedAnswer f;
  std::vector<float> logits = session_logits(session);
  for (int t = 0; t < n; ++t) {
    const int32_t tok = argmax_of(logits);
    f.tokens.push_back(tok);
    f.logits.push_back(std::move(logits));
    if (cb_token_is_end_of_generation(model.h, tok) || t + 1 == n) break;
    check(cb_session_prefill(session.h, &tok, 1), "cannot feed an answer token");
    logits = session_logits(session);
  }
  return f;
}

struct ForcedScore {
  double kl_mean = 0.0;  // over the answer's positions
  int agree = 0;         // positions whose argmax is full's
  int positions = 0;
};

// Feeds `ref`'s tokens after the prefilled session and compares the logits.
ForcedScore score_forced(const Session& session, const ForcedAnswer& ref) {
  ForcedScore sc;
  std::vector<float> logits = session_logits(session);
  for (size_t t = 0; t < ref.tokens.size(); ++t) {
    sc.kl_mean += kl_softmax(ref.logits[t], logits);
    sc.agree += argmax_of(logits) == argmax_of(ref.logits[t]);
    ++sc.positions;
    if (t + 1 == ref.tokens.size()) break;
    check(cb_session_prefill(session.h, &ref.tokens[t], 1), "cannot feed an answer token");
    logits = session_logits(session);
  }
  if (sc.positions > 0) sc.kl_mean /= sc.positions;
  return sc;
}

// One line of the report: a mode, and for blend one policy and ratio.
struct QualityRun {
  cb_mode mode;
  size_t select = 0;  // index into the --select list (blend)
  size_t ratio = 0;   // index into the --ratio list (blend)
  auto operator<=>(const QualityRun&) const = default;
};

struct ModeTotals {
  std::vector<double> f1, fidelity, ttft, compute, computed_fraction, kl_tf, share;
  int agree = 0, agree_tf = 0, positions_tf = 0, exact = 0, raised = 0;
  double kl_sum = 0.0;
  float ratio = 0.0f;
};

double mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// 1 - mode / reuse, or none when reuse has no gap to close.
std::optional<double> gap_closed(double mode, double reuse) {
  if (!(reuse > 0.0)) return std::nullopt;
  return 1.0 - mode / reuse;
}

int cmd_quality(const Args& a) {
  auto it = a.values.find("--dataset");
  if (it == a.values.end() || it->second.empty()) usage_error("quality needs --dataset FILE");
  const std::string path = it->second;
  const long long limit = parse_int(a, "--limit", 0, 1, 1LL << 40);
  const long long max_chunks = parse_int(a, "--max-chunks", 0, 1, 1LL << 20);
  const std::vector<cb_check_layer> schedule = parse_schedule(a);
  if (!schedule.empty() && a.values.count("--ratio"))
    usage_error("option --schedule sets the ratios itself: give it or --ratio, not both");
  const std::vector<float> ratios =
      schedule.empty() ? parse_ratios(a, true) : std::vector<float>{schedule.back().ratio};
  const std::vector<cb_mode> modes = parse_modes(a, "full,prefix,reuse,blend");
  const std::string plot = plot_path(a);
  const cb_chunk_head head = parse_chunk_head(a);
  const int max_tokens = static_cast<int>(parse_int(a, "--max-tokens", 12, 1, 4096));
  const int tf_tokens = static_cast<int>(parse_int(a, "--tf-tokens", 32, 1, 4096));
  const SelectOptions sel = parse_select_options(a);
  const uint64_t seed = parse_u64(a, "--seed", 0);
  const double guard_share = parse_double(a, "--guard-share", 0.0, 0.0, 1.0);
  const double guard_max_ratio = parse_double(a, "--guard-max-ratio", 0.5, 0.0, 1.0);
  const bool show = a.switches.count("--show") > 0;
  const Common c = common_options(a);

  const std::vector<Example> examples =
      load_dataset(path, limit > 0 ? static_cast<size_t>(limit) : SIZE_MAX,
                   max_chunks > 0 ? static_cast<size_t>(max_chunks) : SIZE_MAX);
  Model model;
  load_model(c, model);
  const int n_ctx_train = model_n_ctx_train(model);

  // Context for the longest request: chunks and question as tokenized, the
  // prompt's fixed parts, and the answer (free or teacher-forced).
  long long need = 0;
  for (size_t i = 0; i < examples.size(); ++i) {
    long long n =
        static_cast<long long>(tokenize(model, examples[i].question, false, false).size()) + 128 +
        std::max(max_tokens, tf_tokens);
    for (const auto& ch : examples[i].chunks)
      n += static_cast<long long>(tokenize(model, ch, false, false).size()) + 4;
    if (c.n_ctx == 0 && n > n_ctx_train)
      runtime_error("example " + std::to_string(i) + " needs about " + std::to_string(n) +
                    " tokens, more than the model's context of " + std::to_string(n_ctx_train) +
                    " (use --max-chunks)");
    need = std::max(need, n);
  }
  const int n_ctx =
      c.n_ctx > 0 ? c.n_ctx : static_cast<int>(std::min<long long>(need, n_ctx_train));
  Session session;
  create_session(model, c.threads, n_ctx, session);
  ChunkCache cache;
  const std::string codec = open_chunk_cache(a, cache);

  // Full prefill first (the reference), then the other modes, blend once
  // per policy and ratio; reuse always, as the gap blend closes.
  std::vector<QualityRun> reported;
  for (cb_mode m : modes) {
    if (m != CB_MODE_BLEND) {
      reported.push_back({m, 0, 0});
      continue;
    }
    for (size_t p = 0; p < sel.selects.size(); ++p)
      for (size_t k = 0; k < ratios.size(); ++k) reported.push_back({m, p, k});
  }
  const bool has_blend = std::find(modes.begin(), modes.end(), CB_MODE_BLEND) != modes.end();
  const bool has_reuse = std::find(modes.begin(), modes.end(), CB_MODE_REUSE) != modes.end();
  if (has_blend && !has_reuse) reported.push_back({CB_MODE_REUSE, 0, 0});
  std::vector<QualityRun> run_order = {{CB_MODE_FULL, 0, 0}};
  for (const QualityRun& r : reported)
    if (r.mode != CB_MODE_FULL) run_order.push_back(r);
  std::map<QualityRun, ModeTotals> totals;

  cb_rag_options ro;
  cb_rag_options_init(&ro);
  ro.chunk_head = head;
  ro.system_prompt =
      "Answer the question using the documents. Reply with only the answer, at most five words.";
  ro.sink_tokens = sel.sink_tokens;
  ro.seed = seed;
  ro.guard_share = static_cast<float>(guard_share);
  ro.guard_max_ratio = static_cast<float>(guard_max_ratio);
  if (!schedule.empty()) {
    ro.schedule = schedule.data();
    ro.n_schedule = schedule.size();
  }
  const auto start = Clock::now();
  std::vector<const char*> chunk_ptrs;
  for (size_t i = 0; i < examples.size(); ++i) {
    const Example& ex = examples[i];
    chunk_ptrs.clear();
    for (const auto& ch : ex.chunks) chunk_ptrs.push_back(ch.c_str());
    ModeResult full;
    ForcedAnswer forced;
    for (const QualityRun& run : run_order) {
      const cb_mode m = run.mode;
      ro.mode = m;
      ro.select = m == CB_MODE_BLEND ? sel.selects[run.select] : CB_SELECT_DEFAULT;
      set_ratio(ro, m == CB_MODE_BLEND ? ratios[run.ratio] : 0.15f);
      ModeResult r = run_mode(session, cache, ex, ro, max_tokens);
      // The teacher-forced pass prefills the (cached) request again.
      check(cb_session_reset(session.h), "cannot reset the session");
      cb_rag_stats again;
      rag_prefill(session, cache, chunk_ptrs, ex.question, ro, again);
      ModeTotals& t = totals[run];
      ForcedScore fs;
      if (m == CB_MODE_FULL) {
        // The reference: its own answer agrees everywhere by definition.
        full = r;
        forced = greedy_answer(model, session, tf_tokens);
        fs.positions = fs.agree = static_cast<int>(forced.tokens.size());
      } else {
        fs = score_forced(session, forced);
      }
      double f1 = 0.0;
      for (const auto& gold : ex.answers) f1 = std::max(f1, answer_f1(r.answer, gold));
      t.f1.push_back(f1);
      t.fidelity.push_back(answer_f1(r.answer, full.answer));
      t.agree += argmax_of(r.logits) == argmax_of(full.logits);
      t.kl_sum += kl_softmax(full.logits, r.logits);
      t.kl_tf.push_back(fs.kl_mean);
      t.agree_tf += fs.agree;
      t.positions_tf += fs.positions;
      t.exact += r.answer == full.answer;
      t.ttft.push_back(r.ttft_ms);
      t.compute.push_back(r.st.fuse_ms);
      t.computed_fraction.push_back(r.st.computed_fraction);
      t.share.push_back(r.st.selected_share);
      t.raised += r.st.guard_raised != 0;
      t.ratio = r.st.ratio;
      if (show)
        std::fprintf(stderr, "  %-6s %-9s f1 %.2f  kl %.4f  ttft %7.1f ms  answer: %s\n",
                     cb_mode_name(m), m == CB_MODE_BLEND ? cb_select_name(ro.select) : "", f1,
                     kl_softmax(full.logits, r.logits), r.ttft_ms, r.answer.c_str());
    }
    const double elapsed = ms_between(start, Clock::now()) / 1000.0;
    const double eta =
        elapsed / static_cast<double>(i + 1) * static_cast<double>(examples.size() - i - 1);
    std::fprintf(stderr, "quality: example %zu/%zu done, %.1f s elapsed, ETA %.0f s%s%s\n", i + 1,
                 examples.size(), elapsed, eta, show ? "; gold: " : "",
                 show ? ex.answers.front().c_str() : "");
    std::fflush(stderr);
  }

  const double n = static_cast<double>(examples.size());
  const ModeTotals* reuse = nullptr;
  for (const auto& [run, t] : totals)
    if (run.mode == CB_MODE_REUSE) reuse = &t;
  auto label = [&](const QualityRun& run) {
    return run.mode == CB_MODE_BLEND ? std::string(cb_select_name(sel.selects[run.select])) + " " +
                                           ratio_label(ratios[run.ratio])
                                     : std::string(cb_mode_name(run.mode));
  };
  if (c.json) {
    for (const QualityRun& run : reported) {
      const cb_mode m = run.mode;
      const ModeTotals& t = totals[run];
      cbs::JsonObject o = header("quality", c, model, cb_mode_name(m));
      o.add("n", static_cast<int64_t>(examples.size()))
          .add("f1", mean(t.f1))
          .add("fidelity_f1", mean(t.fidelity))
          .add("top1_agree", t.agree / n)
          .add("kl_first", t.kl_sum / n)
          .add("kl_tf_mean", mean(t.kl_tf))
          .add("top1_tf",
               t.positions_tf > 0 ? static_cast<double>(t.agree_tf) / t.positions_tf : 0.0)
          .add("exact_answer", t.exact / n)
          .add("tf_tokens", static_cast<int64_t>(tf_tokens))
          .add("ttft_ms_median", median(t.ttft))
          .add("compute_ms_median", median(t.compute))
          .add("computed_fraction", mean(t.computed_fraction))
          .add("ratio", ratio_value(t.ratio))
          .add("ratio_mode",
               m == CB_MODE_BLEND && ratios[run.ratio] == kAutoRatio ? "auto" : "fixed")
          .add("chunk_head", chunk_head_label(head))
          .add("codec", codec)
          .add("max_tokens", static_cast<int64_t>(max_tokens))
          .add("dataset", path);
      // Every line has the same keys; the selection's are null outside blend.
      if (m == CB_MODE_BLEND) {
        o.add("select", cb_select_name(sel.selects[run.select]))
            .add("sink_tokens", static_cast<int64_t>(sel.sink_tokens))
            .add("selected_share_mean", mean(t.share))
            .add("guard_raised", t.raised / n);
      } else {
        o.add_null("select")
            .add_null("sink_tokens")
            .add_null("selected_share_mean")
            .add_null("guard_raised");
      }
      if (m == CB_MODE_BLEND && !schedule.empty()) {
        std::string text;
        for (const cb_check_layer& cl : schedule)
          text +=
              (text.empty() ? "" : ",") + std::to_string(cl.layer) + ":" + ratio_label(cl.ratio);
        o.add("schedule", text);
      } else {
        o.add_null("schedule");
      }
      const std::optional<double> gap =
          reuse ? gap_closed(t.kl_sum / n, reuse->kl_sum / n) : std::nullopt;
      const std::optional<double> gap_tf =
          reuse ? gap_closed(mean(t.kl_tf), mean(reuse->kl_tf)) : std::nullopt;
      if (gap)
        o.add("gap_closed", *gap);
      else
        o.add_null("gap_closed");
      if (gap_tf)
        o.add("gap_closed_tf", *gap_tf);
      else
        o.add_null("gap_closed_tf");
      if (max_chunks > 0)
        o.add("max_chunks", static_cast<int64_t>(max_chunks));
      else
        o.add_null("max_chunks");
      std::printf("%s\n", o.str().c_str());
    }
  } else {
    std::printf(
        "quality: %zu examples of %s, %s chunks each; %s (%s), %d threads; chunk head "
        "%s, %s; TTFT on cached runs; teacher forcing over %d tokens\n",
        examples.size(), path.c_str(),
        max_chunks > 0 ? ("at most " + std::to_string(max_chunks)).c_str() : "all",
        model_name(model).c_str(), kernels_name(model).c_str(), c.threads, chunk_head_label(head),
        cache_label(codec).c_str(), tf_tokens);
    std::printf("%-16s %6s %6s %8s %9s %8s %8s %6s %10s %12s %9s\n", "run", "ratio", "f1", "fid_f1",
                "kl_first", "kl_tf", "top1_tf", "exact", "gap_closed", "ttft_ms(med)", "computed");
    for (const QualityRun& run : reported) {
      const ModeTotals& t = totals[run];
      const std::optional<double> gap =
          reuse ? gap_closed(t.kl_sum / n, reuse->kl_sum / n) : std::nullopt;
      char gap_text[16] = "-";
      if (gap) std::snprintf(gap_text, sizeof gap_text, "%.3f", *gap);
      std::printf("%-16s %6.2f %6.3f %8.3f %9.4f %8.4f %8.3f %6.2f %10s %12.1f %9.3f\n",
                  label(run).c_str(), static_cast<double>(t.ratio), mean(t.f1), mean(t.fidelity),
                  t.kl_sum / n, mean(t.kl_tf),
                  t.positions_tf > 0 ? static_cast<double>(t.agree_tf) / t.positions_tf : 0.0,
                  t.exact / n, gap_text, median(t.ttft), mean(t.computed_fraction));
    }
  }
  if (!plot.empty()) {
    // Fidelity against cost: one line per policy through its ratios, the
    // other modes as single points.
    auto draw = [&](const std::string& png, const std::string& ylabel, auto value) {
      PlotSpec spec;
      spec.title = "fidelity against cost, " + std::to_string(examples.size()) + " examples of " +
                   path + (max_chunks > 0 ? ", " + std::to_string(max_chunks) + " chunks" : "");
      spec.xlabel = "computed fraction of a full prefill";
      spec.ylabel = ylabel;
      for (size_t p = 0; p < sel.selects.size(); ++p) {
        PlotSeries line{cb_select_name(sel.selects[p]), {}, false};
        for (const QualityRun& run : reported)
          if (run.mode == CB_MODE_BLEND && run.select == p) {
            const ModeTotals& t = totals[run];
            line.points.push_back({mean(t.computed_fraction), value(t)});
          }
        std::sort(line.points.begin(), line.points.end());
        if (!line.points.empty()) spec.series.push_back(line);
      }
      for (const QualityRun& run : reported)
        if (run.mode != CB_MODE_BLEND) {
          const ModeTotals& t = totals[run];
          const double x = mean(t.computed_fraction), y = value(t);
          spec.series.push_back({cb_mode_name(run.mode), {{x, y}, {x, y}}, true});
        }
      draw_plot(png, spec);
    };
    draw(plot, "KL(full || run), first token", [&](const ModeTotals& t) { return t.kl_sum / n; });
    const size_t dot = plot.rfind('.');
    const std::string tf_png = dot == std::string::npos || dot < plot.rfind('/') + 1
                                   ? plot + "_tf"
                                   : plot.substr(0, dot) + "_tf" + plot.substr(dot);
    draw(tf_png, "top-1 agreement, teacher-forced answer", [&](const ModeTotals& t) {
      return t.positions_tf > 0 ? static_cast<double>(t.agree_tf) / t.positions_tf : 0.0;
    });
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse_args(argc, argv);
    if (a.command == "help" || a.switches.count("--help")) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a.command == "generate") return cmd_generate(a);
    if (a.command == "prefill") return cmd_prefill(a);
    if (a.command == "ttft") return cmd_ttft(a);
    if (a.command == "quality") return cmd_quality(a);
    return cmd_decode(a);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "cb_bench: error: %s (see cb_bench --help)\n", e.message.c_str());
    return 2;
  } catch (const RuntimeError& e) {
    std::fprintf(stderr, "cb_bench: error: %s\n", e.message.c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "cb_bench: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cb_bench: error: %s\n", e.what());
    return 1;
  }
}
