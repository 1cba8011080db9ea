// cb_bench quality: how close each mode stays to full prefill on a dataset.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bench.h"

namespace cbbench {

namespace {

struct Example {
  std::string question;
  std::vector<std::string> answers;
  std::vector<std::string> chunks;  // title + "\n" + text
  std::vector<std::string> pool;    // every ctx of the example, chunks first
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
      if (!ctx.is_object() || !ctx.contains("text") || !ctx["text"].is_string())
        bad(i, "a ctx has no 'text' string");
      std::string title;
      if (ctx.contains("title")) {
        if (!ctx["title"].is_string()) bad(i, "a ctx's 'title' is not a string");
        title = ctx["title"].get<std::string>();
      }
      ex.pool.push_back(title.empty() ? ctx["text"].get<std::string>()
                                      : title + "\n" + ctx["text"].get<std::string>());
      if (ex.chunks.size() < max_chunks) ex.chunks.push_back(ex.pool.back());
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
  std::vector<double> request_tokens;  // head + chunks + question, per example
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

// quality's options; the common ones are read after them.
struct QualityOptions {
  std::string path;  // the dataset
  long long limit = 0;
  long long max_chunks = 0;
  std::vector<cb_check_layer> schedule;
  std::vector<float> ratios;
  std::vector<cb_mode> modes;
  std::string plot;
  cb_chunk_head head{};
  int max_tokens = 0;
  int tf_tokens = 0;
  SelectOptions sel;
  uint64_t seed = 0;
  double guard_share = 0.0;
  double guard_max_ratio = 0.0;
  bool show = false;
  // --neighbour-context: what each chunk but the first is computed after.
  enum class Neighbour {
    kNone,
    kSimilar,
    kOutside,
    kStore,
    kUnrelated
  } neighbour = Neighbour::kNone;
  size_t neighbour_count = 1;  // --neighbours: store passages a chunk is computed after
  double context_scale = 1.0;
};

// --neighbour-context's names; the first, the default, is not an option value.
constexpr std::pair<QualityOptions::Neighbour, const char*> kNeighbourNames[] = {
    {QualityOptions::Neighbour::kNone, "none"},
    {QualityOptions::Neighbour::kSimilar, "similar"},
    {QualityOptions::Neighbour::kOutside, "outside"},
    {QualityOptions::Neighbour::kStore, "store"},
    {QualityOptions::Neighbour::kUnrelated, "unrelated"}};

const char* neighbour_context_name(QualityOptions::Neighbour n) {
  for (const auto& [value, name] : kNeighbourNames)
    if (value == n) return name;
  return "?";
}

QualityOptions parse_quality_options(const Args& a) {
  QualityOptions o;
  auto it = a.values.find("--dataset");
  const char* env = std::getenv("CB_DEV_DATA");
  o.path = it != a.values.end() ? it->second : env != nullptr ? env : "";
  if (o.path.empty())
    usage_error(
        "quality needs --dataset FILE (or $CB_DEV_DATA; scripts/musique_dataset.py writes one)");
  o.limit = parse_int(a, "--limit", 0, 1, 1LL << 40);
  o.max_chunks = parse_int(a, "--max-chunks", 0, 1, 1LL << 20);
  o.schedule = parse_schedule(a);
  if (!o.schedule.empty() && a.values.count("--ratio"))
    usage_error("option --schedule sets the ratios itself: give it or --ratio, not both");
  o.ratios =
      o.schedule.empty() ? parse_ratios(a, true) : std::vector<float>{o.schedule.back().ratio};
  o.modes = parse_modes(a, "full,prefix,reuse,blend");
  o.plot = plot_path(a);
  o.head = parse_chunk_head(a);
  o.max_tokens = static_cast<int>(parse_int(a, "--max-tokens", 12, 1, 4096));
  o.tf_tokens = static_cast<int>(parse_int(a, "--tf-tokens", 32, 1, 4096));
  o.sel = parse_select_options(a);
  o.seed = parse_u64(a, "--seed", 0);
  o.guard_share = parse_double(a, "--guard-share", 0.0, 0.0, 1.0);
  o.guard_max_ratio = parse_double(a, "--guard-max-ratio", 0.5, 0.0, 1.0);
  o.show = a.switches.count("--show") > 0;
  o.context_scale = parse_double(a, "--context-scale", 1.0, 0.01, 100.0);
  if (auto n = a.values.find("--neighbour-context"); n != a.values.end()) {
    const auto* it = std::find_if(std::begin(kNeighbourNames) + 1, std::end(kNeighbourNames),
                                  [&](const auto& e) { return n->second == e.second; });
    if (it == std::end(kNeighbourNames))
      usage_error("--neighbour-context must be similar, outside, store or unrelated (got '" +
                  n->second + "')");
    o.neighbour = it->first;
  }
  o.neighbour_count = static_cast<size_t>(parse_int(a, "--neighbours", 1, 1, 8));
  if (o.neighbour_count > 1 && o.neighbour != QualityOptions::Neighbour::kStore)
    usage_error("--neighbours goes with --neighbour-context store");
  return o;
}

// Context for the longest request: chunks and question as tokenized, the
// prompt's fixed parts, and the answer (free or teacher-forced).
int quality_n_ctx(const Model& model, const Common& c, const QualityOptions& o,
                  const std::vector<Example>& examples) {
  const int n_ctx_train = model_n_ctx_train(model);
  long long need = 0;
  for (size_t i = 0; i < examples.size(); ++i) {
    long long n =
        static_cast<long long>(tokenize(model, examples[i].question, false, false).size()) + 128 +
        std::max(o.max_tokens, o.tf_tokens);
    for (const auto& ch : examples[i].chunks)
      n += static_cast<long long>(tokenize(model, ch, false, false).size()) + 4;
    if (c.n_ctx == 0 && n > n_ctx_train)
      runtime_error("example " + std::to_string(i) + " needs about " + std::to_string(n) +
                    " tokens, more than the model's context of " + std::to_string(n_ctx_train) +
                    " (use --max-chunks)");
    need = std::max(need, n);
  }
  return c.n_ctx > 0 ? c.n_ctx : static_cast<int>(std::min<long long>(need, n_ctx_train));
}

// The runs reported, and the order they run in on each example: full
// prefill first (the reference), then the other modes, blend once per
// policy and ratio; reuse always, as the gap blend closes.
struct QualityPlan {
  std::vector<QualityRun> reported;
  std::vector<QualityRun> run_order;
};

QualityPlan plan_runs(const QualityOptions& o) {
  QualityPlan plan;
  for (cb_mode m : o.modes) {
    if (m != CB_MODE_BLEND) {
      plan.reported.push_back({m, 0, 0});
      continue;
    }
    for (size_t p = 0; p < o.sel.selects.size(); ++p)
      for (size_t k = 0; k < o.ratios.size(); ++k) plan.reported.push_back({m, p, k});
  }
  const bool has_blend = std::find(o.modes.begin(), o.modes.end(), CB_MODE_BLEND) != o.modes.end();
  const bool has_reuse = std::find(o.modes.begin(), o.modes.end(), CB_MODE_REUSE) != o.modes.end();
  if (has_blend && !has_reuse) plan.reported.push_back({CB_MODE_REUSE, 0, 0});
  plan.run_order = {{CB_MODE_FULL, 0, 0}};
  for (const QualityRun& r : plan.reported)
    if (r.mode != CB_MODE_FULL) plan.run_order.push_back(r);
  return plan;
}

// The request options every run shares; mode, policy and ratio are each
// run's.  Points into o.schedule.
cb_rag_options quality_rag_options(const QualityOptions& o) {
  cb_rag_options ro;
  cb_rag_options_init(&ro);
  ro.chunk_head = o.head;
  ro.system_prompt =
      "Answer the question using the documents. Reply with only the answer, at most five words.";
  apply_select_options(o.sel, ro);
  ro.seed = o.seed;
  ro.guard_share = static_cast<float>(o.guard_share);
  ro.guard_max_ratio = static_cast<float>(o.guard_max_ratio);
  if (!o.schedule.empty()) {
    ro.schedule = o.schedule.data();
    ro.n_schedule = o.schedule.size();
  }
  return ro;
}

using Totals = std::map<QualityRun, ModeTotals>;

// What every run on every example uses.
struct QualityBench {
  const QualityOptions& o;
  const Model& model;
  const Session& session;
  const ChunkCache& cache;
};

// Adds one run's scores against full prefill's; returns its answer's F1.
double add_scores(ModeTotals& t, const Example& ex, const ModeResult& r, const ModeResult& full,
                  const ForcedScore& fs) {
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
  t.request_tokens.push_back(static_cast<double>(r.st.n_tokens));
  t.compute.push_back(r.st.fuse_ms);
  t.computed_fraction.push_back(r.st.computed_fraction);
  t.share.push_back(r.st.selected_share);
  t.raised += r.st.guard_raised != 0;
  t.ratio = r.st.ratio;
  return f1;
}

// The lowercased words of 4 or more letters or digits in `text`, in order,
// repeats kept.
std::vector<std::string> long_word_list(const std::string& text) {
  std::vector<std::string> out;
  std::string w;
  for (size_t i = 0; i <= text.size(); ++i) {
    const unsigned char c = i < text.size() ? static_cast<unsigned char>(text[i]) : ' ';
    if (std::isalnum(c) || c >= 0x80) {
      w += static_cast<char>(std::tolower(c));
    } else {
      if (w.size() >= 4) out.push_back(w);
      w.clear();
    }
  }
  return out;
}

// The same, each once.
std::set<std::string> long_words(const std::string& text) {
  const std::vector<std::string> list = long_word_list(text);
  return {list.begin(), list.end()};
}

// The ctx of ex.pool (other than chunk j; with `outside`, none of the
// request's chunks) sharing most long words with it; null when there is
// none.
const std::string* most_similar_ctx(const Example& ex, size_t j, bool outside) {
  const std::set<std::string> mine = long_words(ex.chunks[j]);
  size_t best = j, best_shared = 0;
  for (size_t k = outside ? ex.chunks.size() : 0; k < ex.pool.size(); ++k) {
    if (k == j || ex.pool[k] == ex.chunks[j]) continue;
    size_t shared = 0;
    for (const std::string& w : long_words(ex.pool[k])) shared += mine.count(w);
    if (best == j || shared > best_shared) {
      best = k;
      best_shared = shared;
    }
  }
  return best == j ? nullptr : &ex.pool[best];
}

// Where the contexts of neighbour-aware precompute came from.
struct NeighbourPicks {
  size_t chunks = 0;      // chunks computed after a context
  size_t of_request = 0;  // ... that holds another chunk of the request
  size_t of_example = 0;  // ... that holds another ctx of the same example
};

// Every distinct ctx of the loaded examples as one store of passages, ranked
// the way a store's full-text index ranks them: BM25 (k1 = 1.2, b = 0.75,
// SQLite FTS5's) with a text's distinct words of 4+ letters as the query.
class PassageStore {
 public:
  explicit PassageStore(const std::vector<Example>& examples) {
    std::set<std::string> seen;
    double total = 0.0;
    for (const Example& ex : examples)
      for (const std::string& p : ex.pool) {
        if (!seen.insert(p).second) continue;
        std::map<std::string, int> tf;
        size_t len = 0;
        for (const std::string& w : long_word_list(p)) {
          ++tf[w];
          ++len;
        }
        for (const auto& [w, n] : tf) ++df_[w];
        docs_.push_back({&p, std::move(tf), len});
        total += static_cast<double>(len);
      }
    avg_len_ = docs_.empty() ? 1.0 : total / static_cast<double>(docs_.size());
  }

  // The `k` best-ranked passages other than `text` itself, best first.
  std::vector<const std::string*> nearest(const std::string& text, size_t k) const {
    const std::set<std::string> query = long_words(text);
    std::vector<std::pair<double, const std::string*>> ranked;
    const double n = static_cast<double>(docs_.size());
    for (const Doc& d : docs_) {
      if (*d.text == text) continue;
      double score = 0.0;
      for (const std::string& w : query) {
        const auto f = d.tf.find(w);
        if (f == d.tf.end()) continue;
        const double df = df_.at(w), tf = f->second;
        const double idf = std::max(std::log((n - df + 0.5) / (df + 0.5)), 1e-6);
        const double norm = 1.2 * (0.25 + 0.75 * static_cast<double>(d.len) / avg_len_);
        score += idf * tf * 2.2 / (tf + norm);
      }
      ranked.emplace_back(score, d.text);
    }
    k = std::min(k, ranked.size());
    std::partial_sort(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(k), ranked.end(),
                      [](const auto& x, const auto& y) { return x.first > y.first; });
    std::vector<const std::string*> out;
    for (size_t i = 0; i < k; ++i) out.push_back(ranked[i].second);
    return out;
  }

 private:
  struct Doc {
    const std::string* text;
    std::map<std::string, int> tf;
    size_t len;
  };
  std::vector<Doc> docs_;
  std::map<std::string, int> df_;
  double avg_len_ = 1.0;
};

// Neighbour-aware precompute: every chunk but the first (which follows the
// prompt head in the request, so its KV is taken as exact) computed after
// its most similar ctx (of the example's, or of those outside the request),
// its nearest passage in a store of every loaded example's ctxs, or after a
// ctx of the next example (unrelated text, a control), in a namespace of
// this example's (the same chunk in another example's request has its
// neighbour there).  Without such a ctx, alone.  Counts in `picks` how
// often the context is another chunk of the request and how often another
// ctx of the example.
void add_with_neighbours(const QualityBench& b, const std::vector<Example>& examples,
                         const PassageStore& store, size_t i, cb_rag_options& ro, std::string& ns,
                         NeighbourPicks& picks) {
  using Neighbour = QualityOptions::Neighbour;
  const Example& ex = examples[i];
  ns = "neighbour-context/" + std::to_string(i);
  ro.cache_namespace = ns.c_str();
  check(cb_session_reset(b.session.h), "cannot reset the session");
  for (size_t j = 1; j < ex.chunks.size(); ++j) {
    std::vector<const std::string*> contexts;
    if (b.o.neighbour == Neighbour::kUnrelated) {
      const Example& next = examples[(i + 1) % examples.size()];
      if (&next != &ex) contexts.push_back(&next.pool[j % next.pool.size()]);
    } else if (b.o.neighbour == Neighbour::kStore) {
      contexts = store.nearest(ex.chunks[j], b.o.neighbour_count);
    } else if (const std::string* c =
                   most_similar_ctx(ex, j, b.o.neighbour == Neighbour::kOutside)) {
      contexts.push_back(c);
    }
    // The nearest passage last, right before the chunk.
    std::string joined;
    for (auto c = contexts.rbegin(); c != contexts.rend(); ++c)
      joined += (joined.empty() ? "" : "\n\n") + **c;
    const std::string* context = contexts.empty() ? nullptr : &joined;
    if (context != nullptr) {
      ++picks.chunks;
      const auto in = [&](const std::vector<std::string>& v) {
        for (const std::string* c : contexts)
          if (std::find(v.begin(), v.end(), *c) != v.end()) return true;
        return false;
      };
      picks.of_request += in(ex.chunks);
      picks.of_example += in(ex.pool);
    }
    check(context != nullptr
              ? cb_chunk_cache_add_after(b.session.h, b.cache.h, ex.chunks[j].c_str(),
                                         context->c_str(), &ro, nullptr)
              : cb_chunk_cache_add(b.session.h, b.cache.h, ex.chunks[j].c_str(), &ro, nullptr,
                                   nullptr),
          "cannot add a chunk after its neighbour");
    check(cb_session_reset(b.session.h), "cannot reset the session");
  }
}

// Every run on one example, full prefill first.
void run_example(const QualityBench& b, const std::vector<QualityRun>& run_order, const Example& ex,
                 cb_rag_options& ro, Totals& totals) {
  std::vector<const char*> chunk_ptrs;
  for (const auto& ch : ex.chunks) chunk_ptrs.push_back(ch.c_str());
  ModeResult full;
  ForcedAnswer forced;
  for (const QualityRun& run : run_order) {
    const cb_mode m = run.mode;
    ro.mode = m;
    ro.select = m == CB_MODE_BLEND ? b.o.sel.selects[run.select] : CB_SELECT_DEFAULT;
    set_ratio(ro, m == CB_MODE_BLEND ? b.o.ratios[run.ratio] : 0.15f);
    ModeResult r = run_mode(b.session, b.cache, ex, ro, b.o.max_tokens);
    // The teacher-forced pass prefills the (cached) request again.
    check(cb_session_reset(b.session.h), "cannot reset the session");
    cb_rag_stats again;
    rag_prefill(b.session, b.cache, chunk_ptrs, ex.question, ro, again);
    ModeTotals& t = totals[run];
    ForcedScore fs;
    if (m == CB_MODE_FULL) {
      // The reference: its own answer agrees everywhere by definition.
      full = r;
      forced = greedy_answer(b.model, b.session, b.o.tf_tokens);
      fs.positions = fs.agree = static_cast<int>(forced.tokens.size());
    } else {
      fs = score_forced(b.session, forced);
    }
    const double f1 = add_scores(t, ex, r, full, fs);
    if (b.o.show)
      std::fprintf(stderr,
                   "  %-6s %-9s f1 %.2f  kl %.4f  kl tf %.4f (%d/%d agree)  ttft %7.1f ms  "
                   "answer: %s\n",
                   cb_mode_name(m), m == CB_MODE_BLEND ? cb_select_name(ro.select) : "", f1,
                   kl_softmax(full.logits, r.logits), fs.kl_mean, fs.agree, fs.positions, r.ttft_ms,
                   r.answer.c_str());
  }
}

// Every example, with progress on stderr; `picks` counts where the
// neighbour contexts came from.
Totals run_examples(const QualityBench& b, const std::vector<QualityRun>& run_order,
                    const std::vector<Example>& examples, NeighbourPicks& picks) {
  Totals totals;
  cb_rag_options ro = quality_rag_options(b.o);
  const auto start = Clock::now();
  std::string ns;
  static const std::vector<Example> kNoExamples;
  const PassageStore store(b.o.neighbour == QualityOptions::Neighbour::kStore ? examples
                                                                              : kNoExamples);
  for (size_t i = 0; i < examples.size(); ++i) {
    const Example& ex = examples[i];
    if (b.o.neighbour != QualityOptions::Neighbour::kNone)
      add_with_neighbours(b, examples, store, i, ro, ns, picks);
    run_example(b, run_order, ex, ro, totals);
    const double elapsed = ms_between(start, Clock::now()) / 1000.0;
    const double eta =
        elapsed / static_cast<double>(i + 1) * static_cast<double>(examples.size() - i - 1);
    std::fprintf(stderr, "quality: example %zu/%zu done, %.1f s elapsed, ETA %.0f s%s%s\n", i + 1,
                 examples.size(), elapsed, eta, b.o.show ? "; gold: " : "",
                 b.o.show ? ex.answers.front().c_str() : "");
    std::fflush(stderr);
  }
  if (picks.chunks > 0)
    std::fprintf(stderr,
                 "quality: %zu chunk(s) computed after a context: %zu holding another chunk of "
                 "the request, %zu another ctx of the example\n",
                 picks.chunks, picks.of_request, picks.of_example);
  return totals;
}

// What quality reports, and from what.
struct QualityReport {
  const Common& c;
  const QualityOptions& o;
  const Model& model;
  const std::string& codec;
  size_t n_examples;
  const std::vector<QualityRun>& reported;
  const Totals& totals;
  const NeighbourPicks& picks;
};

const ModeTotals* reuse_totals(const Totals& totals) {
  const ModeTotals* reuse = nullptr;
  for (const auto& [run, t] : totals)
    if (run.mode == CB_MODE_REUSE) reuse = &t;
  return reuse;
}

double top1_tf(const ModeTotals& t) {
  return t.positions_tf > 0 ? static_cast<double>(t.agree_tf) / t.positions_tf : 0.0;
}

std::string run_label(const QualityRun& run, const QualityOptions& o) {
  return run.mode == CB_MODE_BLEND ? std::string(cb_select_name(o.sel.selects[run.select])) + " " +
                                         ratio_label(o.ratios[run.ratio])
                                   : std::string(cb_mode_name(run.mode));
}

std::string schedule_text(const std::vector<cb_check_layer>& schedule) {
  std::string text;
  for (const cb_check_layer& cl : schedule) {
    if (!text.empty()) text += ',';
    text += std::to_string(cl.layer) + ":" + ratio_label(cl.ratio);
  }
  return text;
}

// Blend's selection and schedule.  Every line has the same keys: these are
// null outside blend.
void add_blend_fields(cbs::JsonObject& j, const QualityRun& run, const ModeTotals& t,
                      const QualityOptions& o, double n) {
  if (run.mode == CB_MODE_BLEND) {
    j.add("select", cb_select_name(o.sel.selects[run.select]))
        .add("sink_tokens", static_cast<int64_t>(o.sel.sink_tokens))
        .add("chunk_shift", o.sel.chunk_shift)
        .add("shift_probes", o.sel.chunk_shift ? static_cast<double>(o.sel.shift_probes) : 0.0)
        .add("shift_span", static_cast<int64_t>(o.sel.chunk_shift ? o.sel.shift_span : 0))
        .add("selected_share_mean", mean(t.share))
        .add("guard_raised", t.raised / n);
  } else {
    j.add_null("select")
        .add_null("sink_tokens")
        .add_null("chunk_shift")
        .add_null("shift_probes")
        .add_null("shift_span")
        .add_null("selected_share_mean")
        .add_null("guard_raised");
  }
  if (run.mode == CB_MODE_BLEND && !o.schedule.empty())
    j.add("schedule", schedule_text(o.schedule));
  else
    j.add_null("schedule");
}

// How the reused chunks' KV was computed: alone, or after what context
// (--neighbour-context), and where those contexts came from.
void add_neighbour_fields(cbs::JsonObject& j, const QualityReport& p) {
  const bool after = p.o.neighbour != QualityOptions::Neighbour::kNone;
  j.add("neighbour_context", neighbour_context_name(p.o.neighbour));
  if (after)
    j.add("neighbours", static_cast<int64_t>(p.o.neighbour_count))
        .add("neighbour_chunks", static_cast<int64_t>(p.picks.chunks))
        .add("neighbour_of_request", static_cast<int64_t>(p.picks.of_request))
        .add("neighbour_of_example", static_cast<int64_t>(p.picks.of_example));
  else
    j.add_null("neighbours")
        .add_null("neighbour_chunks")
        .add_null("neighbour_of_request")
        .add_null("neighbour_of_example");
}

void print_quality_json(const QualityReport& p) {
  const double n = static_cast<double>(p.n_examples);
  const ModeTotals* reuse = reuse_totals(p.totals);
  for (const QualityRun& run : p.reported) {
    const cb_mode m = run.mode;
    const ModeTotals& t = p.totals.at(run);
    cbs::JsonObject j = header("quality", p.c, p.model, cb_mode_name(m));
    j.add("n", static_cast<int64_t>(p.n_examples))
        .add("f1", mean(t.f1))
        .add("fidelity_f1", mean(t.fidelity))
        .add("top1_agree", t.agree / n)
        .add("kl_first", t.kl_sum / n)
        .add("kl_tf_mean", mean(t.kl_tf))
        .add("top1_tf", top1_tf(t))
        .add("exact_answer", t.exact / n)
        .add("tf_tokens", static_cast<int64_t>(p.o.tf_tokens))
        .add("ttft_ms_median", median(t.ttft))
        .add("compute_ms_median", median(t.compute))
        .add("request_tokens_median", median(t.request_tokens))
        .add("computed_fraction", mean(t.computed_fraction))
        .add("ratio", ratio_value(t.ratio))
        .add("ratio_mode",
             m == CB_MODE_BLEND && p.o.ratios[run.ratio] == kAutoRatio ? "auto" : "fixed")
        .add("chunk_head", chunk_head_label(p.o.head))
        .add("codec", p.codec)
        .add("context_scale", p.o.context_scale)
        .add("max_tokens", static_cast<int64_t>(p.o.max_tokens))
        .add("dataset", p.o.path);
    add_blend_fields(j, run, t, p.o, n);
    const std::optional<double> gap =
        reuse ? gap_closed(t.kl_sum / n, reuse->kl_sum / n) : std::nullopt;
    const std::optional<double> gap_tf =
        reuse ? gap_closed(mean(t.kl_tf), mean(reuse->kl_tf)) : std::nullopt;
    if (gap)
      j.add("gap_closed", *gap);
    else
      j.add_null("gap_closed");
    if (gap_tf)
      j.add("gap_closed_tf", *gap_tf);
    else
      j.add_null("gap_closed_tf");
    if (p.o.max_chunks > 0)
      j.add("max_chunks", static_cast<int64_t>(p.o.max_chunks));
    else
      j.add_null("max_chunks");
    add_neighbour_fields(j, p);
    std::printf("%s\n", j.str().c_str());
  }
}

std::string neighbour_label(const QualityOptions& o) {
  if (o.neighbour == QualityOptions::Neighbour::kNone) return "alone";
  std::string label = std::string("after neighbour context ") + neighbour_context_name(o.neighbour);
  if (o.neighbour_count > 1) label += " (" + std::to_string(o.neighbour_count) + " passages)";
  return label;
}

void print_quality_table(const QualityReport& p) {
  const double n = static_cast<double>(p.n_examples);
  const ModeTotals* reuse = reuse_totals(p.totals);
  char shift[64];
  std::snprintf(shift, sizeof shift, p.o.sel.chunk_shift ? "on, probes %g, span %d" : "off",
                static_cast<double>(p.o.sel.shift_probes), p.o.sel.shift_span);
  std::printf(
      "quality: %zu examples of %s, %s chunks each; %s (%s), %s; chunk head "
      "%s, %s; context scale %g; chunk shift %s; chunk KV computed %s; TTFT on cached runs; "
      "teacher forcing over %d tokens\n",
      p.n_examples, p.o.path.c_str(),
      p.o.max_chunks > 0 ? ("at most " + std::to_string(p.o.max_chunks)).c_str() : "all",
      cbs::printable(model_name(p.model)).c_str(), kernels_name(p.model).c_str(),
      compute_label(p.c, p.model).c_str(), chunk_head_label(p.o.head), cache_label(p.codec).c_str(),
      p.o.context_scale, shift, neighbour_label(p.o).c_str(), p.o.tf_tokens);
  std::printf("%-16s %6s %6s %8s %9s %8s %8s %6s %10s %12s %9s\n", "run", "ratio", "f1", "fid_f1",
              "kl_first", "kl_tf", "top1_tf", "exact", "gap_closed", "ttft_ms(med)", "computed");
  for (const QualityRun& run : p.reported) {
    const ModeTotals& t = p.totals.at(run);
    const std::optional<double> gap =
        reuse ? gap_closed(t.kl_sum / n, reuse->kl_sum / n) : std::nullopt;
    char gap_text[16] = "-";
    if (gap) std::snprintf(gap_text, sizeof gap_text, "%.3f", *gap);
    std::printf("%-16s %6.2f %6.3f %8.3f %9.4f %8.4f %8.3f %6.2f %10s %12.1f %9.3f\n",
                run_label(run, p.o).c_str(), static_cast<double>(t.ratio), mean(t.f1),
                mean(t.fidelity), t.kl_sum / n, mean(t.kl_tf), top1_tf(t), t.exact / n, gap_text,
                median(t.ttft), mean(t.computed_fraction));
  }
}

// Fidelity (`value`) against cost: one line per policy through its
// ratios, the other modes as single points.
template <typename Value>
void plot_fidelity(const QualityReport& p, const std::string& png, const std::string& ylabel,
                   Value value) {
  PlotSpec spec;
  spec.title = "fidelity against cost, " + std::to_string(p.n_examples) + " examples of " +
               p.o.path +
               (p.o.max_chunks > 0 ? ", " + std::to_string(p.o.max_chunks) + " chunks" : "");
  spec.xlabel = "computed fraction of a full prefill";
  spec.ylabel = ylabel;
  for (size_t s = 0; s < p.o.sel.selects.size(); ++s) {
    PlotSeries line{cb_select_name(p.o.sel.selects[s]), {}, false};
    for (const QualityRun& run : p.reported)
      if (run.mode == CB_MODE_BLEND && run.select == s) {
        const ModeTotals& t = p.totals.at(run);
        line.points.push_back({mean(t.computed_fraction), value(t)});
      }
    std::sort(line.points.begin(), line.points.end());
    if (!line.points.empty()) spec.series.push_back(line);
  }
  for (const QualityRun& run : p.reported)
    if (run.mode != CB_MODE_BLEND) {
      const ModeTotals& t = p.totals.at(run);
      const double x = mean(t.computed_fraction), y = value(t);
      spec.series.push_back({cb_mode_name(run.mode), {{x, y}, {x, y}}, true});
    }
  draw_plot(png, spec);
}

// The first token's KL in --plot FILE, the teacher-forced agreement in
// FILE with "_tf" before its extension.
void plot_quality(const QualityReport& p) {
  const std::string& plot = p.o.plot;
  const double n = static_cast<double>(p.n_examples);
  plot_fidelity(p, plot, "KL(full || run), first token",
                [&](const ModeTotals& t) { return t.kl_sum / n; });
  const size_t dot = plot.rfind('.');
  const std::string tf_png = dot == std::string::npos || dot < plot.rfind('/') + 1
                                 ? plot + "_tf"
                                 : plot.substr(0, dot) + "_tf" + plot.substr(dot);
  plot_fidelity(p, tf_png, "top-1 agreement, teacher-forced answer", top1_tf);
}

}  // namespace

int cmd_quality(const Args& a) {
  const QualityOptions o = parse_quality_options(a);
  const Common c = common_options(a);

  const std::vector<Example> examples =
      load_dataset(o.path, o.limit > 0 ? static_cast<size_t>(o.limit) : SIZE_MAX,
                   o.max_chunks > 0 ? static_cast<size_t>(o.max_chunks) : SIZE_MAX);
  Model model;
  load_model(c, model);
  Session session;
  create_session(model, c, quality_n_ctx(model, c, o, examples), session);
  ChunkCache cache;
  const std::string codec = open_chunk_cache(a, cache);
  check(cb_chunk_cache_set_context_scale(cache.h, static_cast<float>(o.context_scale)),
        "cannot set the context scale");

  const QualityPlan plan = plan_runs(o);
  NeighbourPicks picks;
  const Totals totals = run_examples({o, model, session, cache}, plan.run_order, examples, picks);
  const QualityReport report{c, o, model, codec, examples.size(), plan.reported, totals, picks};
  if (c.json)
    print_quality_json(report);
  else
    print_quality_table(report);
  if (!o.plot.empty()) plot_quality(report);
  return 0;
}

}  // namespace cbbench
