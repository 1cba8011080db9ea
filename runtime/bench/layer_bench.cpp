// cb_layer_bench: where the CPU time of one transformer layer goes, for
// kernel work (a measuring tool, not a test).
//
//   cb_layer_bench layer  [--tokens 4096] [--ratio 0.15] [--layer 5] [--threads 2] [--repeat 5]
//       Per-phase time of one layer over a full prefill of N tokens and over
//       a blended (CacheBlend) layer that recomputes a fraction r of them,
//       median of --repeat runs, full and blended interleaved.
//   cb_layer_bench decode [--tokens 128] [--threads 2] [--rounds 5]
//       Decode tok/s with int8 activations (Session's default) against the
//       f32 path, interleaved rounds, and how far their logits drift apart.
//
// The layer is built from runtime/llama_layer.h, as the session's and the
// fusor's are, in the fusor's steps: the selected rows (global positions,
// ascending) are projected, their K/V are scattered into a cache that holds
// every position, their queries attend over all N keys with the causal mask
// by global position, and the output projection and FFN run on those rows
// only; everything runs in batches of 512 rows, as the fusor and
// Session::prefill do.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "platform/error.h"
#include "runtime/graph.h"
#include "runtime/llama_layer.h"
#include "runtime/model.h"
#include "runtime/session.h"

namespace cb {
namespace {

struct Options {
  std::string cmd;
  std::string model;
  int64_t tokens = -1;
  double ratio = 0.15;
  int64_t layer = 5;
  int threads = 2;
  int repeat = 5;
};

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

enum Phase { kQkv, kAttention, kOutProj, kFfn, kPhases };
const char* const kPhaseNames[kPhases] = {"norm+QKV proj", "RoPE+KV write+attention",
                                          "output proj+residual", "norm+FFN+residual"};

// One layer over the rows at global positions `rows` (ascending), with the
// cache holding every position < n_kv; adds each phase's time to ms[].
class LayerRunner {
 public:
  LayerRunner(Session& s, int64_t layer) : s_(s), hp_(s.model().hparams()), layer_(layer) {}

  void run(const std::vector<int32_t>& rows, std::vector<float>& x, int64_t n_kv, double* ms) {
    const LayerWeights& w = s_.layer_weights()[static_cast<size_t>(layer_)];
    const int64_t r = static_cast<int64_t>(rows.size());
    const int64_t q_dim = hp_.n_head * hp_.head_dim, kv_dim = hp_.kv_dim();
    q_.resize(static_cast<size_t>(r * q_dim));
    k_.resize(static_cast<size_t>(r * kv_dim));
    v_.resize(static_cast<size_t>(r * kv_dim));
    time(ms[kQkv], [&] {
      for (int64_t r0 = 0; r0 < r; r0 += s_.n_batch()) {
        const int64_t b = std::min(s_.n_batch(), r - r0);
        Graph g;
        LlamaLayer layer(g, hp_, w, layer_);
        TensorId h = layer.attention_input(g.external(x.data() + r0 * hp_.n_embd, b, hp_.n_embd));
        layer.project_q(h, g.external(q_.data() + r0 * q_dim, b, q_dim));
        layer.project_k(h, g.external(k_.data() + r0 * kv_dim, b, kv_dim));
        layer.project_v(h, g.external(v_.data() + r0 * kv_dim, b, kv_dim));
        exec(g);
      }
    });
    a_.resize(static_cast<size_t>(r * q_dim));
    time(ms[kAttention], [&] {
      Graph g;
      LlamaLayer layer(g, hp_, w, layer_);
      TensorId k = g.external(k_.data(), r, kv_dim);
      TensorId v = g.external(v_.data(), r, kv_dim);
      layer.rope_q(g.external(q_.data(), r, q_dim), rows.data());
      layer.rope_k(k, rows.data());
      g.scatter_rows(k, rows.data(),
                     g.external_kv(s_.k_cache(layer_), s_.n_ctx(), kv_dim, s_.kv_dtype()));
      g.scatter_rows(v, rows.data(),
                     g.external_kv(s_.v_cache(layer_), s_.n_ctx(), kv_dim, s_.kv_dtype()));
      exec(g);
      // Straight to the backend, as Graph::execute would, so the output
      // lands in a_ for the next phase.
      for (int64_t r0 = 0; r0 < r; r0 += s_.n_batch()) {
        AttentionArgs args = attention_args(hp_, layer_, q_.data() + r0 * q_dim, rows.data() + r0,
                                            std::min(s_.n_batch(), r - r0), s_.k_cache(layer_),
                                            s_.v_cache(layer_), s_.kv_dtype(), n_kv);
        args.out = a_.data() + r0 * q_dim;
        s_.backend().attention(args);
      }
    });
    time(ms[kOutProj], [&] {
      for (int64_t r0 = 0; r0 < r; r0 += s_.n_batch()) {
        const int64_t b = std::min(s_.n_batch(), r - r0);
        Graph g;
        LlamaLayer(g, hp_, w, layer_)
            .attention_output(g.external(x.data() + r0 * hp_.n_embd, b, hp_.n_embd),
                              g.external(a_.data() + r0 * q_dim, b, q_dim));
        exec(g);
      }
    });
    time(ms[kFfn], [&] {
      for (int64_t r0 = 0; r0 < r; r0 += s_.n_batch()) {
        const int64_t b = std::min(s_.n_batch(), r - r0);
        Graph g;
        LlamaLayer(g, hp_, w, layer_).ffn(g.external(x.data() + r0 * hp_.n_embd, b, hp_.n_embd));
        exec(g);
      }
    });
  }

 private:
  static void time(double& acc, const std::function<void()>& f) {
    const double t0 = now_ms();
    f();
    acc += now_ms() - t0;
  }
  void exec(Graph& g) {
    const size_t need = g.plan();
    if (need > arena_.size()) arena_.resize(need);
    g.execute(s_.backend(), arena_.data());
  }

  Session& s_;
  const LlamaHparams& hp_;
  int64_t layer_;
  std::vector<float> q_, k_, v_, a_;
  std::vector<unsigned char> arena_;
};

int cmd_layer(const Options& o) {
  auto model = Model::load(o.model);
  const LlamaHparams& hp = model->hparams();
  const int64_t n = o.tokens > 0 ? o.tokens : 4096;
  if (o.layer < 0 || o.layer >= hp.n_layer)
    fail(ErrorCode::kInvalidArgument, "--layer out of range");
  Session s(*model, {.n_ctx = n, .n_threads = o.threads});
  // Realistic activations: the embeddings of random token ids.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(hp.n_vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& t : ids) t = tok(rng);
  std::vector<float> x0(static_cast<size_t>(n * hp.n_embd));
  embed_tokens(s.backend(), hp, s.token_embd(), ids.data(), n, x0.data());

  std::vector<int32_t> all(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) all[i] = static_cast<int32_t>(i);
  // The blended rows: a random r of the positions, plus the last one (the
  // fusor always keeps it), ascending.
  std::vector<int32_t> sel = all;
  std::shuffle(sel.begin(), sel.end() - 1, rng);
  sel.resize(static_cast<size_t>(std::llround(o.ratio * static_cast<double>(n - 1))));
  sel.push_back(static_cast<int32_t>(n - 1));
  std::sort(sel.begin(), sel.end());
  std::vector<float> xs(sel.size() * static_cast<size_t>(hp.n_embd));

  LayerRunner runner(s, o.layer);
  std::vector<double> full[kPhases], blend[kPhases], full_tot, blend_tot;
  for (int rep = 0; rep < o.repeat + 1; ++rep) {  // the first round warms up
    double ms_f[kPhases] = {}, ms_b[kPhases] = {};
    std::vector<float> x = x0;
    runner.run(all, x, n, ms_f);  // also leaves every position's K/V in the cache
    for (size_t i = 0; i < sel.size(); ++i)
      std::memcpy(xs.data() + i * hp.n_embd, x0.data() + sel[i] * hp.n_embd,
                  static_cast<size_t>(hp.n_embd) * sizeof(float));
    runner.run(sel, xs, n, ms_b);
    if (rep == 0) continue;
    double tf = 0, tb = 0;
    for (int p = 0; p < kPhases; ++p) {
      full[p].push_back(ms_f[p]);
      blend[p].push_back(ms_b[p]);
      tf += ms_f[p];
      tb += ms_b[p];
    }
    full_tot.push_back(tf);
    blend_tot.push_back(tb);
  }
  std::printf(
      "layer %lld of %s (%s), %lld tokens, blended rows %zu (r = %.3f), %d threads, "
      "median of %d interleaved runs\n",
      static_cast<long long>(o.layer), model->name().c_str(), s.backend().name(),
      static_cast<long long>(n), sel.size(), o.ratio, o.threads, o.repeat);
  std::printf("%-26s %12s %12s %10s\n", "phase", "full ms", "blended ms", "blend/full");
  for (int p = 0; p < kPhases; ++p) {
    const double f = median(full[p]), b = median(blend[p]);
    std::printf("%-26s %12.2f %12.2f %10.3f\n", kPhaseNames[p], f, b, b / f);
  }
  const double f = median(full_tot), b = median(blend_tot);
  std::printf("%-26s %12.2f %12.2f %10.3f\n", "layer total", f, b, b / f);
  return 0;
}

double rel_l2(std::span<const float> a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

int cmd_decode(const Options& o) {
  auto model = Model::load(o.model);
  const int64_t n_tok = o.tokens > 0 ? o.tokens : 128;
  const std::vector<int32_t> prompt =
      model->tokenizer().encode("The quick brown fox jumps over the lazy dog.", true, false);
  Session q8(*model, {.n_ctx = 512, .n_threads = o.threads, .int8_decode = true});
  Session f32(*model, {.n_ctx = 512, .n_threads = o.threads, .int8_decode = false});
  std::vector<double> ts_q8, ts_f32;
  std::vector<double> drift;
  int agree = 0, steps = 0;
  for (int round = 0; round < o.repeat; ++round) {
    for (Session* s : {&q8, &f32}) {
      s->truncate(0);
      std::span<const float> logits = s->prefill(prompt);
      // Timing only: each session follows its own greedy tokens (the
      // drift below feeds both the same ones).
      const double t0 = now_ms();
      for (int64_t i = 0; i < n_tok; ++i) {
        const int32_t next =
            static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        logits = s->decode(next);
      }
      (s == &q8 ? ts_q8 : ts_f32).push_back(static_cast<double>(n_tok) * 1000.0 / (now_ms() - t0));
    }
  }
  // Drift: both sessions fed the same tokens (the f32 path's greedy ones).
  q8.truncate(0);
  f32.truncate(0);
  std::span<const float> lf = f32.prefill(prompt);
  std::span<const float> lq = q8.prefill(prompt);
  for (int64_t i = 0; i < n_tok; ++i) {
    const int32_t next = static_cast<int32_t>(std::max_element(lf.begin(), lf.end()) - lf.begin());
    const int32_t next_q =
        static_cast<int32_t>(std::max_element(lq.begin(), lq.end()) - lq.begin());
    agree += next == next_q;
    ++steps;
    std::vector<float> ref(lf.begin(), lf.end());
    lf = f32.decode(next);
    ref.assign(lf.begin(), lf.end());
    lq = q8.decode(next);
    drift.push_back(rel_l2(lq, ref));
  }
  std::printf("decode %lld tokens, %d threads, %s, median of %d interleaved rounds\n",
              static_cast<long long>(n_tok), o.threads, q8.backend().name(), o.repeat);
  std::printf("int8 activations: %.1f tok/s   f32 activations: %.1f tok/s   ratio %.2f\n",
              median(ts_q8), median(ts_f32), median(ts_q8) / median(ts_f32));
  std::sort(drift.begin(), drift.end());
  std::printf(
      "same tokens fed to both: logits rel L2 median %.2e, p90 %.2e, max %.2e over %d "
      "steps; greedy agreement %d/%d\n",
      median(drift), drift[drift.size() * 9 / 10], drift.back(), steps, agree, steps);
  return 0;
}

int usage() {
  std::fprintf(stderr,
               "usage: cb_layer_bench layer [--tokens N] [--ratio R] [--layer L] [--threads T] "
               "[--repeat K] [--model PATH]\n"
               "       cb_layer_bench decode [--tokens N] [--threads T] [--repeat K] "
               "[--model PATH]\n");
  return 2;
}

}  // namespace
}  // namespace cb

int main(int argc, char** argv) {
  using namespace cb;
  if (argc < 2) return usage();
  Options o;
  o.cmd = argv[1];
  const char* env = std::getenv("CB_MODEL");
  o.model = env ? env : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return usage();
    const char* v = argv[++i];
    if (a == "--tokens") {
      o.tokens = std::atoll(v);
    } else if (a == "--ratio") {
      o.ratio = std::atof(v);
    } else if (a == "--layer") {
      o.layer = std::atoll(v);
    } else if (a == "--threads") {
      o.threads = std::atoi(v);
    } else if (a == "--repeat" || a == "--rounds") {
      o.repeat = std::max(1, std::atoi(v));
    } else if (a == "--model") {
      o.model = v;
    } else {
      return usage();
    }
  }
  try {
    if (o.cmd == "layer") return cmd_layer(o);
    if (o.cmd == "decode") return cmd_decode(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cb_layer_bench: %s\n", e.what());
    return 1;
  }
  return usage();
}
