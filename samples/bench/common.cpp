// cb_bench: errors, the command line, the model and session set-up.
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bench.h"
#include "long_option.h"
#include "model_path.h"
#include "number_arg.h"

namespace cbbench {

// ---------------------------------------------------------------------------
// Errors

[[noreturn]] void usage_error(const std::string& m) {
  throw UsageError{m};
}
[[noreturn]] void runtime_error(const std::string& m) {
  throw RuntimeError{m};
}

void check(cb_status s, const std::string& what) {
  if (s == CB_OK) return;
  const char* detail = cb_last_error();
  runtime_error(what + ": " + (detail[0] ? detail : cb_status_string(s)));
}

// ---------------------------------------------------------------------------
// Command line

Args parse_args(int argc, char** argv) {
  static const std::set<std::string> kCommon = {
      "--model",         "--threads", "--n-ctx",   "--backend",     "--device",
      "--chat-template", "--kv-type", "--n-batch", "--activations", "--resident-kv-mb"};
  static const std::map<std::string, std::set<std::string>> kValueFlags = {
      {"generate",
       {"--prompt", "--system", "--max-tokens", "--temperature", "--top-k", "--top-p", "--min-p",
        "--seed", "--repeat-penalty", "--repeat-last-n", "--stop"}},
      {"prefill", {"--tokens", "--repeat"}},
      {"decode", {"--tokens", "--ctx", "--repeat"}},
      {"ttft", {"--chunks",       "--chunk-tokens",    "--query-tokens",  "--ratio",
                "--modes",        "--repeat",          "--chunk-head",    "--codec",
                "--storage-mbps", "--store",           "--pipeline",      "--plot",
                "--select",       "--sink-tokens",     "--chunk-shift",   "--shift-probes",
                "--shift-span",   "--tiers",           "--ram-budget-mb", "--slow-mbps",
                "--redis",        "--placement-ratio", "--fetch-threads"}},
      {"quality", {"--dataset",         "--limit",         "--max-chunks",
                   "--ratio",           "--modes",         "--chunk-head",
                   "--max-tokens",      "--codec",         "--storage-mbps",
                   "--store",           "--plot",          "--select",
                   "--sink-tokens",     "--chunk-shift",   "--seed",
                   "--schedule",        "--shift-probes",  "--guard-share",
                   "--guard-max-ratio", "--tf-tokens",     "--neighbour-context",
                   "--neighbours",      "--context-scale", "--shift-span"}},
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
    if (arg.rfind("--", 0) != 0) usage_error("unexpected argument '" + arg + "'");
    std::string value;
    const bool has_inline = cbs::split_inline_value(arg, value);
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

Common common_options(const Args& a) {
  Common c;
  c.threads = static_cast<int>(parse_int(a, "--threads", available_cores(), 1, 512));
  c.n_ctx = static_cast<int>(parse_int(a, "--n-ctx", 0, 1, 1 << 30));
  c.n_batch = static_cast<int>(parse_int(a, "--n-batch", 0, 1, 1 << 20));
  c.resident_kv_mb = parse_int(a, "--resident-kv-mb", -1, 0, int64_t{1} << 30);
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
  if (auto it = a.values.find("--kv-type"); it != a.values.end()) {
    if (it->second == "f32")
      c.kv_type = CB_KV_F32;
    else if (it->second != "f16")
      usage_error("option --kv-type: expected f16 or f32, got '" + it->second + "'");
  }
  if (auto it = a.values.find("--activations"); it != a.values.end()) {
    if (it->second == "f32")
      c.activations = CB_ACTIVATIONS_F32;
    else if (it->second != "int8")
      usage_error("option --activations: expected int8 or f32, got '" + it->second + "'");
  }
  if (auto it = a.values.find("--chat-template"); it != a.values.end()) {
    static const std::map<std::string, cb_chat_template> kTemplates = {
        {"auto", CB_CHAT_TEMPLATE_AUTO},
        {"chatml", CB_CHAT_TEMPLATE_CHATML},
        {"llama3", CB_CHAT_TEMPLATE_LLAMA3},
        {"gemma", CB_CHAT_TEMPLATE_GEMMA}};
    auto t = kTemplates.find(it->second);
    if (t == kTemplates.end())
      usage_error("option --chat-template: expected auto, chatml, llama3 or gemma, got '" +
                  it->second + "'");
    c.chat_template = t->second;
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
  mo.chat_template = c.chat_template;
  check(cb_model_load(c.model_path.c_str(), &mo, &model.h),
        "cannot load model '" + c.model_path + "'");
}

void create_session(const Model& model, const Common& c, int n_ctx, Session& s) {
  cb_session_options so;
  cb_session_options_init(&so);
  so.n_threads = c.threads;
  so.n_ctx = n_ctx;
  so.kv_type = c.kv_type;
  so.activations = c.activations;
  so.n_batch = c.n_batch;
  if (c.resident_kv_mb >= 0)
    so.resident_kv_bytes = c.resident_kv_mb == 0 ? -1 : c.resident_kv_mb << 20;
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

std::string compute_label(const Common& c, const Model& model, bool column) {
  if (kernels_name(model) == "cuda") return column ? "GPU" : "the GPU";
  return column ? std::to_string(c.threads) : std::to_string(c.threads) + " threads";
}

cbs::JsonObject header(const char* bench, const Common& c, const Model& model, const char* mode) {
  cbs::JsonObject o;
  o.add("bench", bench)
      .add("mode", mode)
      .add("threads", static_cast<int64_t>(c.threads))
      .add("kv_type", c.kv_type == CB_KV_F32 ? "f32" : "f16")
      .add("activations", c.activations == CB_ACTIVATIONS_F32 ? "f32" : "int8")
      .add("model", c.model_path)
      .add("model_name", model_name(model))
      .add("kernels", kernels_name(model));
  if (c.n_batch > 0) o.add("n_batch", static_cast<int64_t>(c.n_batch));
  if (c.resident_kv_mb >= 0) o.add("resident_kv_mb", c.resident_kv_mb);
  return o;
}

void check_generate(cb_status s, const Session& session, size_t n_prompt) {
  if (s == CB_ERR_CONTEXT_OVERFLOW)
    runtime_error(
        "the prompt (" + std::to_string(n_prompt) + " tokens) does not fit in the context (" +
        std::to_string(cb_session_n_ctx(session.h)) + " tokens); shorten it or raise --n-ctx");
  check(s, "generation failed");
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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace cbbench
