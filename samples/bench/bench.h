// cb_bench's shared parts: errors, the command line, the model and session
// set-up, RAG options and the chunk cache, plots.  Each command is in its own
// file (cmd_*.cpp); main() and the usage text are in cb_bench.cpp.
#pragma once

#include <cacheblend/cacheblend.h>
/* cb_bench measures the study-only baselines and oracles too. */
#include <cacheblend/cacheblend_experimental.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "handles.h"
#include "json_writer.h"
#include "printable.h"

namespace cbbench {

// Errors: a usage error exits with 2, a runtime error with 1.
struct UsageError {
  std::string message;
};
struct RuntimeError {
  std::string message;
};
[[noreturn]] void usage_error(const std::string& m);
[[noreturn]] void runtime_error(const std::string& m);
// Throws a RuntimeError naming `what` and the library's message on failure.
void check(cb_status s, const std::string& what);

// The command line.
struct Args {
  std::string command;
  std::map<std::string, std::string> values;  // --flag VALUE
  std::set<std::string> switches;             // --flag
  std::vector<std::string> stops;             // --stop TEXT, each time given
};
Args parse_args(int argc, char** argv);
// A flag's value in [lo, hi], `def` when absent; a usage error otherwise.
long long parse_int(const Args& a, const std::string& flag, long long def, long long lo,
                    long long hi);
unsigned long long parse_u64(const Args& a, const std::string& flag, unsigned long long def);
double parse_double(const Args& a, const std::string& flag, double def, double lo, double hi);
int available_cores();

// The model and sessions.
using Model = cbs::ModelHandle;
using Session = cbs::SessionHandle;
struct Common {
  std::string model_path;
  int threads = 0;
  int n_ctx = 0;
  int n_batch = 0;              // 0: the library's default
  int64_t resident_kv_mb = -1;  // -1: the library's default; 0: none
  cb_backend backend = CB_BACKEND_AUTO;
  int device = 0;
  cb_chat_template chat_template = CB_CHAT_TEMPLATE_AUTO;
  int32_t kv_type = CB_KV_F16;
  int32_t activations = CB_ACTIVATIONS_INT8;
  bool json = false;
};
Common common_options(const Args& a);
void load_model(const Common& c, Model& model);
// A session of n_ctx tokens with c's threads, KV type and activations.
void create_session(const Model& model, const Common& c, int n_ctx, Session& s);
std::vector<int32_t> tokenize(const Model& model, const std::string& text, bool add_special,
                              bool parse_special);
// The model's general.name, as the file says (cbs::printable before printing it as text).
std::string model_name(const Model& model);
std::string kernels_name(const Model& model);
// What computes, for printed headers: "N threads" on the CPU, "the GPU" on
// CUDA, where --threads means nothing.  `column`: the number, or "GPU".
std::string compute_label(const Common& c, const Model& model, bool column = false);
// The fields every JSON line starts with.
cbs::JsonObject header(const char* bench, const Common& c, const Model& model,
                       const char* mode = "full");
// A prompt that does not fit is the caller's mistake: says it plainly.
void check_generate(cb_status s, const Session& session, size_t n_prompt);
double median(std::vector<double> v);
// KL(P || Q) of the softmax distributions of two logit vectors, in double.
double kl_softmax(const std::vector<float>& p_logits, const std::vector<float>& q_logits);

// RAG requests: shared by ttft and quality.
struct ChunkCache : cbs::ChunkCacheHandle {
  std::string dir;          // the store's directory, if on flash
  bool remove_dir = false;  // a temporary directory of ours
  cb_store_options opts{};  // how it was opened, if on flash
  ~ChunkCache();
};
int model_n_ctx_train(const Model& model);
std::vector<cb_mode> parse_modes(const Args& a, const char* def);
// --ratio auto: the loading controller picks the ratio.
constexpr float kAutoRatio = -1.0f;
void set_ratio(cb_rag_options& ro, float r);
std::string ratio_label(float r);
// --NAME on|off; `absent` when not given.
bool parse_on_off(const Args& a, const std::string& name, bool absent);
std::vector<float> parse_ratios(const Args& a, bool allow_list);
cb_chunk_head parse_chunk_head(const Args& a);
std::vector<cb_select> parse_selects(const Args& a);
std::vector<cb_check_layer> parse_schedule(const Args& a);
struct SelectOptions {
  std::vector<cb_select> selects;
  int sink_tokens = 0;
  bool chunk_shift = true;    // --chunk-shift on|off
  float shift_probes = 0.0f;  // --shift-probes X (the library's default when absent)
  int shift_span = 0;         // --shift-span T (likewise)
};
SelectOptions parse_select_options(const Args& a);
// Sets o's sink tokens and chunk shift options to s's.
void apply_select_options(const SelectOptions& s, cb_rag_options& o);
const char* chunk_head_label(cb_chunk_head h);
std::vector<double> parse_storage_caps(const Args& a, bool allow_list);
void reopen_with_cap(ChunkCache& cache, double mbps);
// Opens the chunk cache the options ask for; returns its codec's name.
std::string open_chunk_cache(const Args& a, ChunkCache& cache, bool allow_cap_list = false);
std::string cache_label(const std::string& codec);
// Runs one RAG prefill on the reset session; throws on failure with the
// library's message (context overflow named plainly).
void rag_prefill(const Session& session, const ChunkCache& cache,
                 const std::vector<const char*>& chunks, const std::string& question,
                 const cb_rag_options& ro, cb_rag_stats& st);
// A float option value as the decimal it was given as (0.15, not 0.150000006).
double ratio_value(float r);
using Clock = std::chrono::steady_clock;
double ms_between(Clock::time_point a, Clock::time_point b);

// Plots (--plot FILE.png), drawn by gnuplot.
// The --plot path, checked before any work: a benchmark that runs for
// minutes must not fail at the end for want of gnuplot.
std::string plot_path(const Args& a);
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
void draw_plot(const std::string& png, const PlotSpec& spec);

// The commands; each returns the exit status.
int cmd_generate(const Args& a);
int cmd_prefill(const Args& a);
int cmd_decode(const Args& a);
int cmd_ttft(const Args& a);
// ttft's options (cmd_ttft.cpp), read before the model loads; ttft --tiers
// takes the same.
struct TtftOptions {
  int n_chunks = 0;
  int chunk_tokens = 0;
  int query_tokens = 0;
  int repeat = 0;
  std::vector<float> ratios;
  std::vector<cb_mode> modes;
  cb_chunk_head head{};
  SelectOptions sel;
  std::vector<double> caps;  // --storage-mbps; empty: none
  std::string plot;          // --plot; empty: none
  int fetch_threads = 0;     // --fetch-threads (cb_rag_options.fetch_threads)
};
// The request every ttft run sends: the chunks' texts and the question.
struct TtftRequest {
  std::vector<std::string> chunks;
  std::string question;
  // The chunks as rag_prefill takes them, pointing into `chunks`.
  std::vector<const char*> chunk_ptrs() const;
};
// ttft --tiers (cmd_ttft_tiers.cpp), after cmd_ttft has read the common
// options and made the request and its session.
int ttft_tiers(const Args& a, const Common& c, const TtftOptions& o, const Model& model,
               const Session& session, const TtftRequest& req);
int cmd_quality(const Args& a);

}  // namespace cbbench
