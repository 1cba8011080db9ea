// cb_bench: the RAG options of ttft and quality, and the chunk cache they share.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "bench.h"
#include "ratio_arg.h"

namespace cbbench {

ChunkCache::~ChunkCache() {
  reset();  // pending writes finish before the directory goes
  if (remove_dir) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
}

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

// Sets the ratio fields of `ro` from a parse_ratios value.
void set_ratio(cb_rag_options& ro, float r) {
  ro.auto_ratio = r == kAutoRatio ? 1 : 0;
  cb_rag_options defaults;  // auto: the library's default floor
  cb_rag_options_init(&defaults);
  ro.ratio = r == kAutoRatio ? defaults.ratio : r;
}

bool parse_on_off(const Args& a, const std::string& name, bool absent) {
  auto it = a.values.find(name);
  if (it == a.values.end()) return absent;
  if (it->second == "on") return true;
  if (it->second == "off") return false;
  usage_error("option " + name + ": '" + it->second + "' is not on or off");
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
    for (int v = CB_SELECT_HKVD; v <= CB_SELECT_ORACLE_KL && !found; ++v)
      if (name == cb_select_name(static_cast<cb_select>(v))) {
        out.push_back(static_cast<cb_select>(v));
        found = true;
      }
    if (!found)
      usage_error(
          "option --select: unknown policy '" + name +
          "' (expected hkvd, hkvd_kv, attention, lookahead, random, oracle, oracle_kl or default)");
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

SelectOptions parse_select_options(const Args& a) {
  SelectOptions o;
  o.selects = parse_selects(a);
  o.sink_tokens = static_cast<int>(parse_int(a, "--sink-tokens", 0, 0, 1024));
  cb_rag_options defaults;  // the library's default chunk shift and probes
  cb_rag_options_init(&defaults);
  o.chunk_shift = parse_on_off(a, "--chunk-shift", defaults.chunk_shift != 0);
  o.shift_probes =
      static_cast<float>(parse_double(a, "--shift-probes", defaults.shift_probes, 0.0, 1.0));
  o.shift_span = static_cast<int>(parse_int(a, "--shift-span", defaults.shift_span, 0, 1 << 20));
  return o;
}

void apply_select_options(const SelectOptions& s, cb_rag_options& o) {
  o.sink_tokens = s.sink_tokens;
  o.chunk_shift = s.chunk_shift ? 1 : 0;
  o.shift_probes = s.shift_probes;
  o.shift_span = s.shift_span;
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
std::string open_chunk_cache(const Args& a, ChunkCache& cache, bool allow_cap_list) {
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

double ratio_value(float r) {
  return std::round(static_cast<double>(r) * 1e6) / 1e6;
}

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

std::string ratio_label(float r) {
  if (r == kAutoRatio) return "auto";
  char buf[16];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(r));
  return buf;
}

}  // namespace cbbench
