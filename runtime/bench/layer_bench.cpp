// cb_layer_bench: where the CPU time of a prefill goes, for kernel work (a
// measuring tool, not a test).
//
//   cb_layer_bench layer  [--tokens 4096] [--ratio 0.15] [--threads 2] [--repeat 5]
//       One forward of N tokens through the fusor's own pass
//       (runtime/blend/fused_forward.h), full (every row at every layer)
//       and blended (a random r of the rows, plus the last, at every layer,
//       the others attended with the KV the full pass left in the cache, as
//       a reused chunk's would be), interleaved, median of --repeat runs:
//       the time per layer and the time in each kind of backend op.
//   cb_layer_bench decode [--tokens 128] [--threads 2] [--rounds 5]
//       Decode tok/s with int8 activations (Session's default) against the
//       f32 path, interleaved rounds, and how far their logits drift apart;
//       then the time of a token spent outside the backend's ops.
//   cb_layer_bench request [--chunks 8] [--tokens 512] [--ratio 0.2] [--threads 2] [--repeat 5]
//                          [--backend cpu|cuda] [--batch N]
//       A RAG request of N cached chunks of T tokens (random ids) and a
//       32-token question, fused in reuse and blend mode (the default
//       policy at --ratio), interleaved, median of --repeat runs: the
//       compute thread's time in each kind of backend op (and the calls),
//       at batch ends, waiting for the layer pipeline's loads, and in the
//       runtime's own work between them (selection, bookkeeping), which a
//       GPU cannot hide behind its kernels.  Loads run on the pipeline's
//       loader thread, as in a RAG request; on CUDA the chunks are kept in
//       GPU memory after the first request, as cb_bench ttft keeps them.
//       --batch: rows per forward chunk (SessionOptions::n_batch; default
//       the backend's, 256 on the CPU and 2048 on CUDA), so that the CPU
//       can issue the calls a GPU session would.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cache/chunk_source.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/forwarding_backend.h"
#include "platform/error.h"
#include "runtime/blend/fused_forward.h"
#include "runtime/blend/fusor.h"
#include "runtime/model.h"
#include "runtime/session.h"

namespace cb {
namespace {

struct Options {
  std::string cmd;
  std::string model;
  int64_t tokens = -1;
  double ratio = -1.0;  // unset: each command's default
  int64_t chunks = 8;
  BackendKind backend = BackendKind::kCpu;
  int64_t batch = 0;  // request: rows per forward chunk, 0 the backend's
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

// The median over runs of one figure of each run.
template <class Run, class Field>
double median_of(const std::vector<Run>& runs, Field field) {
  std::vector<double> x;
  for (const Run& r : runs) x.push_back(field(r));
  return median(std::move(x));
}

// a() then b(), repeat + 1 times, interleaved so that a drift of the machine
// touches both alike; the first round warms up.  The timed rounds' results.
template <class A, class B>
auto interleaved_runs(int repeat, A a, B b) {
  std::pair<std::vector<decltype(a())>, std::vector<decltype(b())>> runs;
  for (int rep = 0; rep <= repeat; ++rep) {
    auto ra = a();
    auto rb = b();
    if (rep == 0) continue;
    runs.first.push_back(ra);
    runs.second.push_back(rb);
  }
  return runs;
}

// A backend timing, on the thread that made it, the host's time in each
// kind of op and at the ends of batches (a loader thread's calls are its
// own time).  The CPU finishes an op before it returns, so there this is the
// op's cost; a GPU returns once the op is queued (or once it finished, where
// the op must wait for the device), and a batch's end waits for its ops.
class OpTimingBackend final : public ForwardingBackend {
 public:
  explicit OpTimingBackend(std::unique_ptr<Backend> inner) : ForwardingBackend(std::move(inner)) {}
  double ms[kBackendOpCount] = {};
  size_t count[kBackendOpCount] = {};
  size_t n_ops = 0;
  double batch_end_ms = 0.0;

  double total_ms() const { return std::accumulate(std::begin(ms), std::end(ms), 0.0); }
  void reset() {
    std::fill(std::begin(ms), std::end(ms), 0.0);
    std::fill(std::begin(count), std::end(count), size_t{0});
    n_ops = 0;
    batch_end_ms = 0.0;
  }
  void end_batch() override {
    if (std::this_thread::get_id() != owner_) return ForwardingBackend::end_batch();
    const double t0 = now_ms();
    ForwardingBackend::end_batch();
    batch_end_ms += now_ms() - t0;
  }

 private:
  void on_op_begin(BackendOp, std::initializer_list<const void*>) override {
    if (std::this_thread::get_id() != owner_) return;
    ++n_ops;
    t0_ = now_ms();
  }
  void on_op_end(BackendOp op) override {
    if (std::this_thread::get_id() != owner_) return;
    ms[static_cast<int>(op)] += now_ms() - t0_;
    ++count[static_cast<int>(op)];
  }
  const std::thread::id owner_ = std::this_thread::get_id();
  double t0_ = 0.0;
};

// One run of the fused pass over `rows`; its times.
struct PassTimes {
  double total_ms = 0.0;
  double layer_ms = 0.0;  // the median layer
  double op_ms[kBackendOpCount] = {};
};

PassTimes run_pass(Session& s, OpTimingBackend& be, const std::vector<int32_t>& tokens,
                   const std::vector<int32_t>& rows) {
  be.reset();
  FusedForward f(s, tokens);
  f.rows = rows;
  const double t0 = now_ms();
  f.run(true);
  PassTimes t;
  t.total_ms = now_ms() - t0;
  t.layer_ms = median(f.layer_ms);
  std::copy(std::begin(be.ms), std::end(be.ms), t.op_ms);
  return t;
}

int cmd_layer(const Options& o) {
  auto model = Model::load(o.model);
  const LlamaHparams& hp = model->hparams();
  const int64_t n = o.tokens > 0 ? o.tokens : 4096;
  const double ratio = o.ratio < 0.0 ? 0.15 : o.ratio;
  if (!(ratio > 0.0 && ratio <= 1.0))
    fail(ErrorCode::kInvalidArgument, "--ratio must be in (0, 1]");
  auto owned = std::make_unique<OpTimingBackend>(make_cpu_backend(o.threads));
  OpTimingBackend& be = *owned;
  Session s(*model, {.n_ctx = n}, std::move(owned));
  // Realistic activations: the embeddings of random token ids.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(hp.n_vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& t : ids) t = tok(rng);
  std::vector<int32_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  // The blended rows: a random r of the positions, plus the last one (the
  // fusor always keeps it), ascending.
  std::vector<int32_t> sel = all;
  std::shuffle(sel.begin(), sel.end() - 1, rng);
  sel.resize(static_cast<size_t>(std::llround(ratio * static_cast<double>(n - 1))));
  sel.push_back(static_cast<int32_t>(n - 1));
  std::sort(sel.begin(), sel.end());

  // The full pass also leaves every position's KV in the cache.
  const auto runs = interleaved_runs(
      o.repeat, [&] { return run_pass(s, be, ids, all); },
      [&] { return run_pass(s, be, ids, sel); });
  const std::vector<PassTimes>& full = runs.first;
  const std::vector<PassTimes>& blend = runs.second;
  std::printf(
      "%s (%s), %lld tokens, %lld layers, blended rows %zu (r = %.3f), %d threads, "
      "median of %d interleaved runs\n",
      model->name().c_str(), s.backend().name(), static_cast<long long>(n),
      static_cast<long long>(hp.n_layer), sel.size(), ratio, o.threads, o.repeat);
  std::printf("%-26s %12s %12s %10s\n", "per forward", "full ms", "blended ms", "blend/full");
  double f_ops = 0.0, b_ops = 0.0;
  for (int op = 0; op < kBackendOpCount; ++op) {
    const double f = median_of(full, [op](const PassTimes& t) { return t.op_ms[op]; });
    const double b = median_of(blend, [op](const PassTimes& t) { return t.op_ms[op]; });
    f_ops += f;
    b_ops += b;
    if (f + b >= 0.005)
      std::printf("%-26s %12.2f %12.2f %10.3f\n", backend_op_name(static_cast<BackendOp>(op)), f, b,
                  b / f);
  }
  const double f_tot = median_of(full, [](const PassTimes& t) { return t.total_ms; });
  const double b_tot = median_of(blend, [](const PassTimes& t) { return t.total_ms; });
  std::printf("%-26s %12.2f %12.2f\n", "host (graphs, rest)", f_tot - f_ops, b_tot - b_ops);
  std::printf("%-26s %12.2f %12.2f %10.3f\n", "forward total", f_tot, b_tot, b_tot / f_tot);
  const double f_layer = median_of(full, [](const PassTimes& t) { return t.layer_ms; });
  const double b_layer = median_of(blend, [](const PassTimes& t) { return t.layer_ms; });
  std::printf("%-26s %12.2f %12.2f %10.3f\n", "median layer", f_layer, b_layer, b_layer / f_layer);
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
  // The runtime's own time per token (building and planning the graph,
  // dispatching its ops), which a GPU backend cannot overlap with its
  // kernels: a decode token's time outside the backend's ops.
  auto owned = std::make_unique<OpTimingBackend>(make_cpu_backend(o.threads));
  OpTimingBackend& be = *owned;
  Session timed(*model, {.n_ctx = 512, .n_threads = o.threads, .int8_decode = true},
                std::move(owned));
  std::vector<double> outside_us;
  size_t n_ops = 0;
  std::span<const float> lt = timed.prefill(prompt);
  for (int64_t i = 0; i < n_tok; ++i) {
    const int32_t next = static_cast<int32_t>(std::max_element(lt.begin(), lt.end()) - lt.begin());
    be.reset();
    const double t0 = now_ms();
    lt = timed.decode(next);
    outside_us.push_back(1000.0 * (now_ms() - t0 - be.total_ms()));
    n_ops += be.n_ops;
  }
  std::printf("outside the backend's ops: median %.1f us per token (%zu ops a token)\n",
              median(outside_us), n_ops / static_cast<size_t>(n_tok));
  return 0;
}

// One RAG request's time on the compute thread, split.
struct RequestTimes {
  double wall_ms = 0.0, batch_end_ms = 0.0, blocked_ms = 0.0, load_ms = 0.0;
  double computed = 0.0;
  double op_ms[kBackendOpCount] = {};
  double op_count[kBackendOpCount] = {};
  double ops_ms() const { return std::accumulate(std::begin(op_ms), std::end(op_ms), 0.0); }
};

int cmd_request(const Options& o) {
  auto model = Model::load(o.model);
  const LlamaHparams& hp = model->hparams();
  const int64_t chunk_tokens = o.tokens > 0 ? o.tokens : 512;
  const int64_t n_chunks = o.chunks, n_query = 32;
  const double ratio = o.ratio < 0.0 ? kDefaultRatio : o.ratio;
  if (!(ratio > 0.0 && ratio <= 1.0))
    fail(ErrorCode::kInvalidArgument, "--ratio must be in (0, 1]");
  if (n_chunks < 1) fail(ErrorCode::kInvalidArgument, "--chunks must be at least 1");
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(hp.n_vocab - 1));
  auto random_ids = [&](int64_t n) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int32_t& t : ids) t = tok(rng);
    return ids;
  };
  std::vector<std::vector<int32_t>> chunks;
  std::vector<cache::ChunkKV> kv;
  {
    Session scratch(*model, {.n_ctx = chunk_tokens, .n_threads = o.threads, .backend = o.backend});
    for (int64_t i = 0; i < n_chunks; ++i) {
      chunks.push_back(random_ids(chunk_tokens));
      kv.push_back(precompute_chunk_kv(scratch, {}, chunks.back()));
    }
  }
  std::vector<std::unique_ptr<cache::MemoryChunkSource>> sources;
  std::vector<Segment> segments;
  for (int64_t i = 0; i < n_chunks; ++i) {
    sources.push_back(std::make_unique<cache::MemoryChunkSource>(kv[static_cast<size_t>(i)]));
    segments.push_back({.tokens = chunks[static_cast<size_t>(i)], .cached = sources.back().get()});
  }
  const std::vector<int32_t> query = random_ids(n_query);
  segments.push_back({.tokens = query});
  const int64_t n = n_chunks * chunk_tokens + n_query;

  auto owned = std::make_unique<OpTimingBackend>(
      o.backend == BackendKind::kCuda ? make_cuda_backend(0) : make_cpu_backend(o.threads));
  OpTimingBackend& be = *owned;
  Session s(*model, {.n_ctx = n, .n_threads = o.threads, .n_batch = o.batch}, std::move(owned));
  BlendOptions reuse, blend;
  reuse.mode = BlendMode::kReuse;
  blend.schedule = single_check_schedule(blend.selection, static_cast<float>(ratio));
  auto run = [&](const BlendOptions& opts) {
    s.truncate(0);
    be.reset();
    // Chunks kept in backend memory where the backend keeps any (as a RAG
    // request does: the first request records them).
    s.resident_chunks().begin_request();
    for (int64_t i = 0; i < n_chunks; ++i)
      segments[static_cast<size_t>(i)].resident =
          s.resident_chunks().acquire("chunk " + std::to_string(i), chunk_tokens);
    FusionStats st;
    const double t0 = now_ms();
    fuse_prefill(s, segments, opts, &st);
    RequestTimes t;
    t.wall_ms = now_ms() - t0;
    t.batch_end_ms = be.batch_end_ms;
    t.blocked_ms = st.blocked_ms;
    t.load_ms = st.load_ms;
    t.computed = st.computed_fraction();
    std::copy(std::begin(be.ms), std::end(be.ms), t.op_ms);
    for (int op = 0; op < kBackendOpCount; ++op) t.op_count[op] = static_cast<double>(be.count[op]);
    return t;
  };
  const auto runs = interleaved_runs(
      o.repeat, [&] { return run(reuse); }, [&] { return run(blend); });
  const std::vector<RequestTimes>& reuses = runs.first;
  const std::vector<RequestTimes>& blends = runs.second;
  std::printf(
      "%s (%s), %lld chunks x %lld tokens + %lld question tokens, %lld layers, %d threads, "
      "median of %d interleaved runs; blend (%s at r = %.2f) computed %.3f\n",
      model->name().c_str(), s.backend().name(), static_cast<long long>(n_chunks),
      static_cast<long long>(chunk_tokens), static_cast<long long>(n_query),
      static_cast<long long>(hp.n_layer), o.threads, o.repeat, selection_name(blend.selection),
      ratio, median_of(blends, [](const RequestTimes& t) { return t.computed; }));
  std::printf("%-26s %12s %8s %12s %8s\n", "per request: ms (calls)", "reuse", "", "blend", "");
  for (int op = 0; op < kBackendOpCount; ++op) {
    const double r = median_of(reuses, [op](const RequestTimes& t) { return t.op_ms[op]; });
    const double b = median_of(blends, [op](const RequestTimes& t) { return t.op_ms[op]; });
    const double rn = median_of(reuses, [op](const RequestTimes& t) { return t.op_count[op]; });
    const double bn = median_of(blends, [op](const RequestTimes& t) { return t.op_count[op]; });
    if (rn + bn > 0)
      std::printf("%-26s %12.2f %8.0f %12.2f %8.0f\n", backend_op_name(static_cast<BackendOp>(op)),
                  r, rn, b, bn);
  }
  auto row = [&](const char* name, auto field) {
    std::printf("%-26s %12.2f %8s %12.2f\n", name, median_of(reuses, field), "",
                median_of(blends, field));
  };
  row("backend ops", [](const RequestTimes& t) { return t.ops_ms(); });
  row("batch ends", [](const RequestTimes& t) { return t.batch_end_ms; });
  row("waiting for loads", [](const RequestTimes& t) { return t.blocked_ms; });
  row("runtime's own work",
      [](const RequestTimes& t) { return t.wall_ms - t.ops_ms() - t.batch_end_ms - t.blocked_ms; });
  row("request", [](const RequestTimes& t) { return t.wall_ms; });
  row("loader (other thread)", [](const RequestTimes& t) { return t.load_ms; });
  return 0;
}

int usage() {
  std::fprintf(stderr,
               "usage: cb_layer_bench layer [--tokens N] [--ratio R] [--threads T] "
               "[--repeat K] [--model PATH]\n"
               "       cb_layer_bench decode [--tokens N] [--threads T] [--repeat K] "
               "[--model PATH]\n"
               "       cb_layer_bench request [--chunks N] [--tokens T] [--ratio R] "
               "[--threads T] [--repeat K] [--backend cpu|cuda] [--batch N] [--model PATH]\n");
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
    } else if (a == "--backend") {
      if (std::strcmp(v, "cpu") == 0) {
        o.backend = BackendKind::kCpu;
      } else if (std::strcmp(v, "cuda") == 0) {
        o.backend = BackendKind::kCuda;
      } else {
        return usage();
      }
    } else if (a == "--batch") {
      o.batch = std::atoll(v);
      if (o.batch < 1) {
        std::fprintf(stderr, "cb_layer_bench: --batch must be at least 1\n");
        return 2;
      }
    } else if (a == "--chunks") {
      o.chunks = std::atoll(v);
    } else if (a == "--ratio") {
      o.ratio = std::max(0.0, std::atof(v));  // <= 0 is refused, not the default
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
  if ((o.backend != BackendKind::kCpu || o.batch != 0) && o.cmd != "request") return usage();
  try {
    if (o.cmd == "layer") return cmd_layer(o);
    if (o.cmd == "decode") return cmd_decode(o);
    if (o.cmd == "request") return cmd_request(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cb_layer_bench: %s\n", e.what());
    return 1;
  }
  return usage();
}
