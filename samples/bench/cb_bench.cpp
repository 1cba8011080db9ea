// cb_bench: the on-device benchmark, written against the public C API only.
//
//   cb_bench generate --prompt TEXT [--chat] --max-tokens N   text and speed
//   cb_bench prefill  --tokens N [--repeat K]                  prefill speed
//   cb_bench decode   --tokens N [--ctx N]                     decode speed
//
// With --json every subcommand prints one JSON object per line (DESIGN.md §6).
// Exit status: 0 success, 1 runtime error, 2 usage error.
#include <cacheblend/cacheblend.h>
#include <sched.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <new>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "json_writer.h"

namespace {

constexpr const char* kDefaultModel = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

const char* const kUsage =
    "usage: cb_bench <command> [options]\n"
    "\n"
    "commands:\n"
    "  generate --prompt TEXT [--chat] [--system TEXT] [--max-tokens N]\n"
    "           [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
    "      generate text from a prompt (with --chat: formatted as a ChatML user\n"
    "      turn); prints the text, then timings on stderr.  Greedy by default.\n"
    "      --max-tokens defaults to 128.\n"
    "  prefill --tokens N [--repeat K]\n"
    "      prefill speed over N tokens of a fixed English text; reports the\n"
    "      median (and best) of K runs (default 3) after one warm-up.\n"
    "  decode --tokens N [--ctx C] [--repeat K]\n"
    "      decode speed: N greedy tokens after a prompt of C tokens (default 16);\n"
    "      median of K runs (default 1).\n"
    "\n"
    "common options:\n"
    "  --model PATH     GGUF model (default: $CB_MODEL, else\n"
    "                   models/SmolLM2-135M-Instruct.Q4_1.gguf in the current directory)\n"
    "  --threads N      compute threads (default: the number of CPU cores available\n"
    "                   to this process)\n"
    "  --n-ctx N        session context size in tokens (default: what the command\n"
    "                   needs; generate: min(model context, 4096))\n"
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
};

Args parse_args(int argc, char** argv) {
  static const std::set<std::string> kCommon = {"--model", "--threads", "--n-ctx"};
  static const std::map<std::string, std::set<std::string>> kValueFlags = {
      {"generate",
       {"--prompt", "--system", "--max-tokens", "--temperature", "--top-k", "--top-p", "--seed"}},
      {"prefill", {"--tokens", "--repeat"}},
      {"decode", {"--tokens", "--ctx", "--repeat"}},
  };
  static const std::map<std::string, std::set<std::string>> kSwitches = {
      {"generate", {"--chat", "--json", "--help"}},
      {"prefill", {"--json", "--help"}},
      {"decode", {"--json", "--help"}},
  };
  Args a;
  if (argc < 2) usage_error("no command given (generate, prefill or decode)");
  a.command = argv[1];
  if (a.command == "--help" || a.command == "-h" || a.command == "help") {
    a.command = "help";
    return a;
  }
  if (!kValueFlags.count(a.command))
    usage_error("unknown command '" + a.command + "' (expected generate, prefill or decode)");
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
  const std::string& s = it->second;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
    usage_error("option " + flag + ": '" + s + "' is not a number");
  if (v < lo || v > hi)
    usage_error("option " + flag + ": " + s + " is outside " + cbs::json_number(lo) + ".." +
                cbs::json_number(hi));
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

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// ---------------------------------------------------------------------------
// Model and session handles with automatic cleanup

struct Model {
  cb_model* m = nullptr;
  std::string path;
  ~Model() { cb_model_free(m); }
};

struct Session {
  cb_session* s = nullptr;
  ~Session() { cb_session_free(s); }
};

struct Common {
  std::string model_path;
  int threads = 0;
  int n_ctx = 0;
  bool json = false;
};

Common common_options(const Args& a) {
  Common c;
  c.threads = static_cast<int>(parse_int(a, "--threads", available_cores(), 1, 4096));
  c.n_ctx = static_cast<int>(parse_int(a, "--n-ctx", 0, 1, 1 << 30));
  c.json = a.switches.count("--json") > 0;
  if (auto it = a.values.find("--model"); it != a.values.end()) {
    c.model_path = it->second;
    if (c.model_path.empty()) usage_error("option --model: empty path");
    if (!file_exists(c.model_path)) runtime_error("model file not found: " + c.model_path);
  } else if (const char* env = std::getenv("CB_MODEL"); env != nullptr && env[0] != '\0') {
    c.model_path = env;
    if (!file_exists(c.model_path))
      runtime_error("model file not found: " + c.model_path + " (from CB_MODEL)");
  } else {
    c.model_path = kDefaultModel;
    if (!file_exists(c.model_path))
      runtime_error(std::string("no model: CB_MODEL is not set and the default ") + kDefaultModel +
                    " does not exist in the current directory (pass --model PATH or set "
                    "CB_MODEL)");
  }
  return c;
}

void load_model(const Common& c, Model& model) {
  cb_model_options mo;
  cb_model_options_init(&mo);
  mo.n_threads = c.threads;
  model.path = c.model_path;
  check(cb_model_load(c.model_path.c_str(), &mo, &model.m),
        "cannot load model '" + c.model_path + "'");
}

void create_session(const Model& model, int threads, int n_ctx, Session& s) {
  cb_session_options so;
  cb_session_options_init(&so);
  so.n_threads = threads;
  so.n_ctx = n_ctx;
  check(cb_session_create(model.m, &so, &s.s), "cannot create a session");
}

std::vector<int32_t> tokenize(const Model& model, const std::string& text, bool add_special,
                              bool parse_special) {
  size_t n = 0;
  check(cb_tokenize(model.m, text.data(), text.size(), add_special, parse_special, nullptr, 0, &n),
        "cannot tokenize");
  std::vector<int32_t> ids(n);
  if (n > 0)
    check(cb_tokenize(model.m, text.data(), text.size(), add_special, parse_special, ids.data(),
                      ids.size(), &n),
          "cannot tokenize");
  return ids;
}

std::string model_name(const Model& model) {
  cb_model_info info;
  cb_model_info_init(&info);
  check(cb_model_get_info(model.m, &info), "cannot read the model's info");
  return info.name;
}

std::string kernels_name(const Model& model) {
  cb_model_info info;
  cb_model_info_init(&info);
  check(cb_model_get_info(model.m, &info), "cannot read the model's info");
  return info.kernels;
}

cbs::JsonObject header(const char* bench, const Common& c, const Model& model) {
  cbs::JsonObject o;
  o.add("bench", bench)
      .add("mode", "full")
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
        std::to_string(cb_session_n_ctx(session.s)) + " tokens); shorten it or raise --n-ctx");
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
  so.seed = parse_u64(a, "--seed", 0);
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
    check(cb_chat_format(model.m, msgs.data(), msgs.size(), 1, nullptr, 0, &len),
          "cannot format the chat");
    std::vector<char> buf(len + 1);
    check(cb_chat_format(model.m, msgs.data(), msgs.size(), 1, buf.data(), buf.size(), &len),
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
  cb_generate_stats stats;
  cb_generate_stats_init(&stats);
  GenerateState st;
  st.stream = !c.json;
  check_generate(cb_generate(session.s, ids.data(), ids.size(), &go, on_token, &st, &stats),
                 session, ids.size());

  if (c.json) {
    cbs::JsonObject o = header("generate", c, model);
    o.add("text", st.text)
        .add("tokens", st.ids)
        .add("n_prompt", stats.n_prompt)
        .add("n_generated", stats.n_generated)
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
  const int32_t bos = cb_token_bos(model.m);
  if (bos >= 0) ids.push_back(bos);
  const std::vector<int32_t> unit = tokenize(model, kBenchText, false, false);
  if (unit.empty()) runtime_error("the benchmark text tokenizes to nothing");
  while (ids.size() < n) ids.insert(ids.end(), unit.begin(), unit.end());
  ids.resize(n);
  return ids;
}

// Runs a prefill of `ids` on an empty session; returns its time in ms.
double timed_prefill(const Session& session, const std::vector<int32_t>& ids) {
  check(cb_session_reset(session.s), "cannot reset the session");
  cb_generate_options go;
  cb_generate_options_init(&go);
  go.max_tokens = 0;
  cb_generate_stats stats;
  cb_generate_stats_init(&stats);
  check_generate(cb_generate(session.s, ids.data(), ids.size(), &go, nullptr, nullptr, &stats),
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
    check(cb_session_reset(session.s), "cannot reset the session");
    cb_generate_options go;
    cb_generate_options_init(&go);
    go.max_tokens = n + 1;  // n forward passes over generated tokens
    go.stop_at_end_of_generation = 0;
    cb_generate_stats stats;
    cb_generate_stats_init(&stats);
    check_generate(
        cb_generate(session.s, prompt.data(), prompt.size(), &go, nullptr, nullptr, &stats),
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
