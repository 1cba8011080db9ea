// Replayed batches (Backend::begin_replay): a session's decode tokens are
// one batch the backend may record once and replay, as a GPU backend does
// with a launch graph.  ReplayingBackend replays its recordings on the CPU,
// so a token whose ops or arguments differ from the recorded ones, or a
// recording kept past the memory it names, shows up here as wrong logits
// or a failure.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "platform/error.h"
#include "runtime/session.h"
#include "tests/runtime/counting_backends.h"
#include "tests/runtime/model_path.h"

namespace cb {
namespace {

const Model& model() {
  return test::shared_model();
}

// Records the ops of a batch opened by begin_replay() under a new key
// (closures holding their arguments, and the memory they name), runs them
// only when the batch ends, as a captured graph runs, and under a key
// recorded before runs them again instead of taking new ones.  Only the
// ops a forward graph issues are recorded: any other op would be missing
// from a replay, and the logits would show it.  fail_recordings makes the
// next recordings fail at end_batch() without running anything, as a
// capture the driver refuses.
class ReplayingBackend final : public test::CountingBackend {
 public:
  int recordings = 0, replays = 0, forgotten = 0, fail_recordings = 0;

  ReplayStart begin_replay(uint64_t key) override {
    EXPECT_NE(key, 0u);
    begin_batch();
    auto it = recorded_.find(key);
    if (it != recorded_.end()) {
      ++replays;
      for (const Recorded& op : it->second) op.run();
      return ReplayStart::kReplayed;
    }
    ++recordings;
    recording_key_ = key;
    recording_ = &recorded_[key];
    return ReplayStart::kRecord;
  }
  void end_batch() override {
    std::vector<Recorded>* recorded = recording_;
    recording_ = nullptr;
    CountingBackend::end_batch();
    if (recorded == nullptr) return;
    if (fail_recordings > 0) {
      --fail_recordings;
      recorded_.erase(recording_key_);
      throw Error(ErrorCode::kUnsupported, "replaying backend: a recording failed");
    }
    for (const Recorded& op : *recorded) op.run();
  }
  void forget_replay(uint64_t key) override { forgotten += static_cast<int>(recorded_.erase(key)); }
  // The caller forgets a recording before it frees memory the recording
  // names.
  void free_buffer(void* p) override {
    const char* start = nullptr;
    size_t bytes = 0;
    if (in_buffer(p, &start, &bytes))
      for (const auto& [key, ops] : recorded_)
        for (const Recorded& op : ops)
          for (const void* a : op.mem)
            if (a >= start && a < start + bytes) {
              ADD_FAILURE() << "a buffer freed under the recording of key " << key;
              return;  // leaked, so that a replay cannot write freed memory
            }
    CountingBackend::free_buffer(p);
  }

  void matmul(const WeightView& w, const float* x, int64_t n_rows, float* y) override {
    op({x, y}, [=, this] { CountingBackend::matmul(w, x, n_rows, y); });
  }
  void matmul_q8(const WeightView& w, const float* x, int64_t n_rows, float* y) override {
    op({x, y}, [=, this] { CountingBackend::matmul_q8(w, x, n_rows, y); });
  }
  void matmul_bias(const WeightView& w, const float* x, int64_t n_rows, const float* bias, float* y,
                   bool q8) override {
    op({x, y}, [=, this] { CountingBackend::matmul_bias(w, x, n_rows, bias, y, q8); });
  }
  // Its ops one by one, through the overrides here (ForwardingBackend's
  // product would hand the whole product to the CPU backend unwatched).
  void product(const ProductArgs& a) override { Backend::product(a); }
  void get_rows(const WeightView& w, const int32_t* ids, int64_t n, float* out) override {
    op({ids, out}, [=, this] { CountingBackend::get_rows(w, ids, n, out); });
  }
  void rmsnorm(const float* x, const float* weight, int64_t n_rows, int64_t dim, float eps,
               float* out) override {
    op({x, out}, [=, this] { CountingBackend::rmsnorm(x, weight, n_rows, dim, eps, out); });
  }
  void rope(float* x, const int32_t* pos, int64_t n_rows, int64_t n_heads, int64_t head_dim,
            int64_t rot_dim, float freq_base, const float* freq_factors) override {
    op({x, pos}, [=, this] {
      CountingBackend::rope(x, pos, n_rows, n_heads, head_dim, rot_dim, freq_base, freq_factors);
    });
  }
  void attention(const AttentionArgs& a) override {
    op({a.q, a.q_pos, a.k, a.v, a.out}, [=, this] { CountingBackend::attention(a); });
  }
  void silu_mul(const float* gate, const float* up, int64_t n, float* out) override {
    op({gate, up, out}, [=, this] { CountingBackend::silu_mul(gate, up, n, out); });
  }
  void gelu_mul(const float* gate, const float* up, int64_t n, float* out) override {
    op({gate, up, out}, [=, this] { CountingBackend::gelu_mul(gate, up, n, out); });
  }
  void scale(float* x, int64_t n, float s) override {
    op({x}, [=, this] { CountingBackend::scale(x, n, s); });
  }
  void add(const float* a, const float* b, int64_t n, float* out) override {
    op({a, b, out}, [=, this] { CountingBackend::add(a, b, n, out); });
  }
  void add_bias(float* x, const float* bias, int64_t n_rows, int64_t dim) override {
    op({x}, [=, this] { CountingBackend::add_bias(x, bias, n_rows, dim); });
  }
  void gather_rows(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                   float* dst) override {
    op({src, idx, dst}, [=, this] { CountingBackend::gather_rows(src, row_len, idx, n, dst); });
  }
  void scatter_rows(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                    float* dst) override {
    op({src, idx, dst}, [=, this] { CountingBackend::scatter_rows(src, row_len, idx, n, dst); });
  }
  void scatter_rows_f16(const float* src, int64_t row_len, const int32_t* idx, int64_t n,
                        uint16_t* dst) override {
    op({src, idx, dst},
       [=, this] { CountingBackend::scatter_rows_f16(src, row_len, idx, n, dst); });
  }

 private:
  struct Recorded {
    std::vector<const void*> mem;
    std::function<void()> run;
  };
  void op(std::initializer_list<const void*> mem, std::function<void()> run) {
    if (recording_ != nullptr) {
      recording_->push_back({std::vector<const void*>(mem), std::move(run)});
    } else {
      run();
    }
  }

  std::map<uint64_t, std::vector<Recorded>> recorded_;
  std::vector<Recorded>* recording_ = nullptr;
  uint64_t recording_key_ = 0;
};

std::vector<float> copy(std::span<const float> s) {
  return {s.begin(), s.end()};
}

// Decode on a backend that replays its first token's recording gives the
// logits of a one-token prefill on the CPU (the same ops, over exactly the
// rows written) bitwise, token after token, also after a longer prefill
// has grown (and moved) the session's arena and after the context bias of
// a blended request has changed: both make the session record again.
TEST(ReplayedBatches, DecodeReplaysGiveTheCpusLogits) {
  const std::vector<int32_t> ids = {1, 504, 3290, 314, 260, 1686, 282, 1345, 30,  2,
                                    9, 88,  17,   4,   611, 90,   12,  5,    700, 31,
                                    8, 41,  3,    77,  260, 1686, 282, 1345, 30,  2};
  for (KvType kv : {KvType::kF16, KvType::kF32}) {
    SCOPED_TRACE(kv == KvType::kF16 ? "f16 cache" : "f32 cache");
    const SessionOptions o{.n_ctx = 64, .n_threads = 2, .kv_type = kv};
    Session cpu(model(), o);
    auto owned = std::make_unique<ReplayingBackend>();
    ReplayingBackend& be = *owned;
    Session s(model(), o, std::move(owned));
    size_t next = 0;
    auto prefill = [&](size_t n) {
      const auto want = copy(cpu.prefill(std::span(ids).subspan(next, n)));
      EXPECT_EQ(copy(s.prefill(std::span(ids).subspan(next, n))), want);
      next += n;
    };
    auto decode = [&](int n) {
      for (int i = 0; i < n; ++i, ++next) {
        const auto want = copy(cpu.prefill(std::span(ids).subspan(next, 1)));
        EXPECT_EQ(copy(s.decode(ids[next])), want) << "token " << next;
      }
    };
    prefill(4);
    decode(4);
    EXPECT_EQ(be.recordings, 1);
    EXPECT_EQ(be.replays, 3);
    // More rows than before: the arena grows, its recording is dropped.
    prefill(10);
    EXPECT_EQ(be.forgotten, 1);
    decode(3);
    EXPECT_EQ(be.recordings, 2);
    EXPECT_EQ(be.replays, 5);
    // A blended request's context bias: the attention's arguments change.
    auto set_bias = [&](const KeyBlockBias& b) {
      cpu.set_context_bias(b);
      s.set_context_bias(b);
    };
    set_bias({.key_begin = 2, .key_end = 12, .query_from = 0, .bias = -0.7f});
    decode(3);
    EXPECT_EQ(be.recordings, 3);
    EXPECT_EQ(be.replays, 7);
    // A recording that fails runs nothing: the session issues the token's
    // ops again, and records at its next token.
    set_bias({.key_begin = 3, .key_end = 9, .query_from = 0, .bias = -0.3f});
    be.fail_recordings = 1;
    decode(3);
    EXPECT_EQ(be.fail_recordings, 0);
    EXPECT_EQ(be.recordings, 5);
    EXPECT_EQ(be.replays, 8);
    // Every weight, norm and bias came from prepare_weight(): a GPU's
    // capture refuses host inputs.
    EXPECT_EQ(be.unprepared_weights, 0);
  }
}

}  // namespace
}  // namespace cb
