// The CUDA backend as the runtime's pipeline uses it: batches (deferred
// completion) against unbatched runs, errors inside a batch, uploads from
// staging and pageable memory, a loader thread uploading and rotating KV
// rows while the main thread runs a batch, short-lived threads, and
// zero-copy buffers.  Without a CUDA device every test skips with a message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <latch>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/reference_ops.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/cuda/cuda_fixture.h"
#include "tests/kernels/kernel_test_util.h"

namespace cb {
namespace {

using test::Cuda;

std::unique_ptr<Backend> cuda_backend(CudaMemory memory) {
  CudaBackendOptions o;
  o.memory = memory;
  return make_cuda_backend(0, o);
}

const char* memory_name(CudaMemory m) {
  switch (m) {
    case CudaMemory::kDevice:
      return "device";
    case CudaMemory::kMapped:
      return "zero-copy";
    case CudaMemory::kManaged:
      return "managed";
    default:
      return "auto";
  }
}

// A long chain of dependent ops, a transformer layer's worth per iteration:
// rmsnorm with a host weight vector (mirror path), matmul (GEMV for 5 rows,
// dequantize + SGEMM for 24), rope with host positions, silu_mul, matmul,
// add of a host bias (staged: past the 64 KiB mirror limit for 24 rows),
// residual add in place, gather with host indices, row_sq_diff, top_k into
// a host vector, and every 8 iterations a logits row into a host vector.
// Every host input is scribbled over as soon as its op returns: the op must
// already hold the values.  Batched and unbatched runs issue the same
// kernels in the same order, so their results are bitwise equal.  The
// buffers are reached only through upload() and ops, so any kind of
// backend memory will do.
class Chain {
 public:
  static constexpr int64_t kD = 1024, kD2 = 512, kHeads = 8, kHeadDim = 64, kVocab = 300;

  Chain(Backend& be, int64_t rows, uint32_t seed) : be_(be), rows_(rows) {
    std::mt19937 rng(seed);
    wa_ = prepare(rng, DType::Q4_0, kD2, kD);
    wb_ = prepare(rng, DType::Q4_1, kD, kD2);
    wout_ = prepare(rng, DType::Q8_0, kVocab, kD);
    norm_ = test::random_floats(rng, kD);
    x0_ = test::random_floats(rng, rows_ * kD);
    h_ = buffer(rows_ * kD);
    t1_ = buffer(rows_ * kD);
    t2_ = buffer(rows_ * kD2);
    t3_ = buffer(rows_ * kD2);
    t4_ = buffer(rows_ * kD);
    g_ = buffer(rows_ * kD);
    sq_ = buffer(rows_);
  }
  Chain(const Chain&) = delete;
  Chain& operator=(const Chain&) = delete;
  ~Chain() {
    for (void* p : buffers_) be_.free_buffer(p);
  }

  struct Result {
    std::vector<float> h;
    std::vector<std::vector<float>> logits;
    std::vector<std::vector<int32_t>> picks;
  };

  // batched: the whole run is one batch; nested: one iteration in the
  // middle is an inner batch as well.  The caller's thread must not have a
  // batch open when batched is false.
  Result run(int iters, bool batched, bool nested = false) {
    be_.upload(h_, x0_.data(), x0_.size() * sizeof(float));
    be_.wait_uploads();
    Result r;
    const int64_t R = rows_;
    std::vector<int32_t> pos(static_cast<size_t>(R)), idx(static_cast<size_t>(R)), pick(2);
    std::vector<float> bias(static_cast<size_t>(R * kD)), logits(kVocab);
    if (batched) be_.begin_batch();
    for (int it = 0; it < iters; ++it) {
      const bool inner = nested && it == iters / 2;
      if (inner) be_.begin_batch();
      be_.rmsnorm(h_, norm_.data(), R, kD, 1e-5f, t1_);
      be_.matmul(wa_, t1_, R, t2_);
      for (int64_t i = 0; i < R; ++i) pos[i] = static_cast<int32_t>(it * 13 + 3 * i);
      be_.rope(t2_, pos.data(), R, kHeads, kHeadDim, kHeadDim, 10000.0f, nullptr);
      std::fill(pos.begin(), pos.end(), -7);
      be_.silu_mul(t2_, t2_, R * kD2, t3_);
      be_.matmul(wb_, t3_, R, t4_);
      for (size_t j = 0; j < bias.size(); ++j) bias[j] = 0.01f * static_cast<float>((it + j) % 17);
      be_.add(t4_, bias.data(), R * kD, t4_);
      std::fill(bias.begin(), bias.end(), 1e6f);
      be_.add(h_, t4_, R * kD, h_);
      for (int64_t i = 0; i < R; ++i) idx[i] = static_cast<int32_t>((i * 5 + it) % R);
      be_.gather_rows(h_, kD, idx.data(), R, g_);
      std::fill(idx.begin(), idx.end(), -1);
      be_.row_sq_diff(h_, g_, R, kD, sq_);
      be_.top_k(sq_, R, 2, pick.data());
      r.picks.push_back(pick);
      if (it % 8 == 7) {
        be_.matmul(wout_, h_ + (R - 1) * kD, 1, logits.data());
        r.logits.push_back(logits);
      }
      if (inner) be_.end_batch();
    }
    if (batched) be_.end_batch();
    r.h.resize(static_cast<size_t>(R * kD));
    copy_to_host(be_, h_, R * kD, r.h.data());
    return r;
  }

 private:
  WeightView prepare(std::mt19937& rng, DType t, int64_t n_out, int64_t n_in) {
    const std::vector<uint8_t> bytes = test::random_weight(rng, t, n_out, n_in);
    return be_.prepare_weight({bytes.data(), t, n_in, n_out});  // copies: bytes may go
  }
  float* buffer(int64_t n) {
    auto* p = static_cast<float*>(be_.alloc_buffer(static_cast<size_t>(n) * sizeof(float)));
    buffers_.push_back(p);
    return p;
  }

  Backend& be_;
  int64_t rows_;
  WeightView wa_, wb_, wout_;
  std::vector<float> norm_, x0_;
  float *h_, *t1_, *t2_, *t3_, *t4_, *g_, *sq_;
  std::vector<void*> buffers_;
};

void expect_same(const Chain::Result& a, const Chain::Result& b, const std::string& what) {
  EXPECT_TRUE(test::bitwise_equal(a.h, b.h)) << what << ": final activations differ";
  ASSERT_EQ(a.logits.size(), b.logits.size()) << what;
  for (size_t i = 0; i < a.logits.size(); ++i) {
    EXPECT_TRUE(test::bitwise_equal(a.logits[i], b.logits[i])) << what << ": logits " << i;
  }
  EXPECT_EQ(a.picks, b.picks) << what << ": top_k picks";
  for (float x : a.h) {
    ASSERT_TRUE(std::isfinite(x)) << what << ": the chain overflowed";
  }
}

TEST_F(Cuda, BatchGivesTheSameResultsAsSeparateOps) {
  for (CudaMemory memory : {CudaMemory::kDevice, CudaMemory::kManaged, CudaMemory::kMapped}) {
    auto be = cuda_backend(memory);
    for (int64_t rows : {5, 24}) {
      Chain chain(*be, rows, 30);
      const std::string what = std::string(memory_name(memory)) + " rows=" + std::to_string(rows);
      const Chain::Result plain = chain.run(40, false);
      const Chain::Result batched = chain.run(40, true);
      expect_same(batched, plain, what + " batched");
      const Chain::Result nested = chain.run(40, true, true);
      expect_same(nested, plain, what + " nested");
      // Again after the batches: nothing of them is left half done.
      expect_same(chain.run(40, false), plain, what + " unbatched again");
    }
  }
}

TEST_F(Cuda, UnbalancedEndBatchIsAnError) {
  try {
    be_->end_batch();
    FAIL() << "expected kInvalidArgument";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  }
  be_->begin_batch();
  be_->begin_batch();
  be_->end_batch();
  be_->end_batch();
  EXPECT_THROW(be_->end_batch(), Error);
}

// An op that fails inside a batch leaves the batch usable: the ops before
// it still complete at end_batch, and later ops work.
TEST_F(Cuda, ErrorInsideABatchLeavesItUsable) {
  std::mt19937 rng(22);
  const int64_t n = 1000;
  const std::vector<float> a = test::random_floats(rng, n), b = test::random_floats(rng, n);
  std::vector<float> expect(static_cast<size_t>(n));
  ref::add(a.data(), b.data(), n, expect.data());
  float* out = dev(std::vector<float>(static_cast<size_t>(n)));
  be_->begin_batch();
  be_->add(dev(a), dev(b), n, out);
  EXPECT_THROW(be_->rope(out, nullptr, 1, 1, 8, 9, 10000.0f, nullptr), Error);
  be_->end_batch();
  EXPECT_TRUE(test::bitwise_equal(host(out, expect.size()), expect));
  be_->add(out, dev(std::vector<float>(static_cast<size_t>(n), 0.0f)), n, out);
  EXPECT_TRUE(test::bitwise_equal(host(out, expect.size()), expect));
}

// --------------------------------------------------------------- uploads --

TEST_F(Cuda, StagedUploadsOnlyWithoutZeroCopy) {
  EXPECT_TRUE(cuda_backend(CudaMemory::kDevice)->wants_staged_uploads());
  EXPECT_TRUE(cuda_backend(CudaMemory::kManaged)->wants_staged_uploads());
  EXPECT_FALSE(cuda_backend(CudaMemory::kMapped)->wants_staged_uploads());
}

// CB_CUDA_MEMORY chooses for a backend that leaves the choice to it, and a
// value it does not know is an error, not a silent default.
TEST_F(Cuda, MemoryFromTheEnvironment) {
  const char* set = std::getenv("CB_CUDA_MEMORY");
  const std::optional<std::string> caller = set ? std::optional<std::string>(set) : std::nullopt;
  setenv("CB_CUDA_MEMORY", "mapped", 1);
  EXPECT_FALSE(make_cuda_backend(0)->wants_staged_uploads());
  EXPECT_TRUE(cuda_backend(CudaMemory::kDevice)->wants_staged_uploads());  // asked: kept
  setenv("CB_CUDA_MEMORY", "host", 1);
  try {
    make_cuda_backend(0);
    ADD_FAILURE() << "no error for CB_CUDA_MEMORY=host";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find("CB_CUDA_MEMORY"), std::string::npos) << e.what();
  }
  if (caller) {
    setenv("CB_CUDA_MEMORY", caller->c_str(), 1);
  } else {
    unsetenv("CB_CUDA_MEMORY");
  }
}

// Device memory, which the host never touches: uploads in, ops, a host
// output back; an allocation beyond the card is a clear kOutOfMemory.
TEST_F(Cuda, DeviceBuffersAreReachedThroughUploadsAndOps) {
  auto be = cuda_backend(CudaMemory::kDevice);
  std::mt19937 rng(31);
  const int64_t n = 300000;
  const std::vector<float> a = test::random_floats(rng, n), b = test::random_floats(rng, n);
  std::vector<float> expect(static_cast<size_t>(n));
  ref::add(a.data(), b.data(), n, expect.data());
  auto* da = static_cast<float*>(be->alloc_buffer(n * sizeof(float)));
  auto* db = static_cast<float*>(be->alloc_buffer(n * sizeof(float)));
  auto* staging = static_cast<float*>(be->alloc_host_staging(n * sizeof(float)));
  std::memcpy(staging, a.data(), n * sizeof(float));
  be->upload(da, staging, n * sizeof(float));
  be->upload(db, b.data(), n * sizeof(float));  // pageable
  be->add(da, db, n, da);
  std::vector<float> got(static_cast<size_t>(n), NAN);
  copy_to_host(*be, da, n, got.data());
  EXPECT_TRUE(test::bitwise_equal(got, expect));
  // Within the backend: resident chunks are copied so.
  be->upload(db, da, n * sizeof(float));
  std::fill(got.begin(), got.end(), NAN);
  copy_to_host(*be, db, n, got.data());
  EXPECT_TRUE(test::bitwise_equal(got, expect));
  EXPECT_GE(be->wait_uploads(), 0.0);
  be->free_host_staging(staging);
  be->free_buffer(da);
  be->free_buffer(db);
  try {
    be->alloc_buffer(size_t{1} << 50);
    ADD_FAILURE() << "a petabyte of device memory";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory) << e.what();
    EXPECT_NE(std::string(e.what()).find("device memory"), std::string::npos) << e.what();
  }
}

// upload() from page-locked staging and from ordinary (pageable) memory;
// a later op of the same thread outside a batch sees the data, and so does
// the host once that op has returned.
TEST_F(Cuda, UploadedDataIsSeenByTheNextOp) {
  std::mt19937 rng(23);
  for (CudaMemory memory : {CudaMemory::kManaged, CudaMemory::kMapped}) {
    auto be = cuda_backend(memory);
    const std::string what = memory_name(memory);
    const int64_t n = int64_t{1} << 20;
    auto* buf = static_cast<float*>(be->alloc_buffer(n * sizeof(float)));
    auto* zeros = static_cast<float*>(be->alloc_buffer(n * sizeof(float)));
    auto* out = static_cast<float*>(be->alloc_buffer(n * sizeof(float)));
    std::memset(buf, 0, n * sizeof(float));
    std::memset(zeros, 0, n * sizeof(float));
    const std::vector<float> a = test::random_floats(rng, n);
    auto* staging = static_cast<float*>(be->alloc_host_staging(n * sizeof(float)));
    std::memcpy(staging, a.data(), n * sizeof(float));
    be->upload(buf, staging, n * sizeof(float));
    be->add(buf, zeros, n, out);
    EXPECT_TRUE(test::bitwise_equal(host(out, a.size()), a)) << what << " from staging";

    // Pageable source, into the middle and up to the very end of the buffer.
    const std::vector<float> b = test::random_floats(rng, 1000);
    std::vector<float> expect = a;
    std::copy(b.begin(), b.end(), expect.begin() + 100);
    std::copy(b.begin(), b.end(), expect.end() - 1000);
    be->upload(buf + 100, b.data(), b.size() * sizeof(float));
    be->upload(buf + n - 1000, b.data(), b.size() * sizeof(float));
    be->upload(buf, b.data(), 0);  // nothing
    be->add(buf, zeros, n, out);
    EXPECT_TRUE(test::bitwise_equal(host(out, expect.size()), expect)) << what << " pageable";
    EXPECT_TRUE(test::bitwise_equal(host(buf, expect.size()), expect)) << what << " host view";
    EXPECT_GE(be->wait_uploads(), 0.0);
    be->free_host_staging(staging);
    for (float* p : {buf, zeros, out}) be->free_buffer(p);
  }
}

// The copy time comes from GPU events: positive after 64 MiB, and only the
// copies since the previous call count.  300 small uploads exercise the
// folding of completed copies (the event list is bounded).
TEST_F(Cuda, WaitUploadsReturnsTheCopyTime) {
  be_ = cuda_backend(CudaMemory::kManaged);  // a copy the GPU does, also on Jetson
  const size_t bytes = size_t{64} << 20;
  auto* buf = static_cast<unsigned char*>(be_->alloc_buffer(bytes));
  auto* staging = static_cast<unsigned char*>(be_->alloc_host_staging(bytes));
  for (size_t i = 0; i < bytes; ++i) staging[i] = static_cast<unsigned char>(i * 7 + 1);
  EXPECT_EQ(be_->wait_uploads(), 0.0) << "no upload yet";
  be_->upload(buf, staging, bytes);
  const double ms = be_->wait_uploads();
  std::printf("64 MiB upload from staging: %.3f ms (%.1f GB/s)\n", ms,
              static_cast<double>(bytes) / (ms * 1e6));
  EXPECT_GT(ms, 0.0);
  EXPECT_EQ(be_->wait_uploads(), 0.0) << "already counted";
  EXPECT_EQ(std::memcmp(buf, staging, bytes), 0);

  const size_t piece = bytes / 300;
  for (size_t i = 0; i < 300; ++i) {
    std::memset(staging + i * piece, static_cast<int>(i % 251), piece);
    be_->upload(buf + i * piece, staging + i * piece, piece);
  }
  EXPECT_GT(be_->wait_uploads(), 0.0);
  for (size_t i = 0; i < 300; i += 37) {
    EXPECT_EQ(buf[i * piece], static_cast<unsigned char>(i % 251)) << i;
    EXPECT_EQ(buf[i * piece + piece - 1], static_cast<unsigned char>(i % 251)) << i;
  }
  be_->free_host_staging(staging);
  be_->free_buffer(buf);
}

// What the layerwise loader does: per chunk, K and V rows read into staging,
// uploaded into the KV cache rows, K rotated to the chunk's global
// positions -- on its own thread, while the main thread runs a long batch
// on other buffers.  Both sides must give exactly what they give alone.
TEST_F(Cuda, LoaderThreadUploadsBesideABatch) {
  constexpr int64_t kChunks = 8, kChunkRows = 64, kHeadsKv = 3, kHeadDim = 64;
  constexpr int64_t kKvDim = kHeadsKv * kHeadDim, kRows = kChunks * kChunkRows;
  std::mt19937 rng(24);
  const std::vector<float> k_src = test::random_floats(rng, kRows * kKvDim);
  const std::vector<float> v_src = test::random_floats(rng, kRows * kKvDim);
  // Managed memory beside running kernels needs concurrent managed access,
  // which integrated GPUs (where kAuto means zero-copy) do not have.
  const bool integrated = !cuda_backend(CudaMemory::kAuto)->wants_staged_uploads();
  for (CudaMemory memory : {CudaMemory::kManaged, CudaMemory::kMapped}) {
    if (memory == CudaMemory::kManaged && integrated) {
      std::printf("integrated GPU: the managed-memory case is not run\n");
      continue;
    }
    auto be = cuda_backend(memory);
    const std::string what = memory == CudaMemory::kMapped ? "zero-copy" : "managed";
    const size_t kv_bytes = static_cast<size_t>(kRows * kKvDim) * sizeof(float);
    auto* kc = static_cast<float*>(be->alloc_buffer(kv_bytes));
    auto* vc = static_cast<float*>(be->alloc_buffer(kv_bytes));

    // The loader's work; `staged` picks staging memory or writing straight
    // into the cache (the zero-copy way) for the data.
    auto load = [&](bool staged) -> double {
      const size_t chunk_bytes = static_cast<size_t>(kChunkRows * kKvDim) * sizeof(float);
      auto* sk = static_cast<float*>(be->alloc_host_staging(chunk_bytes));
      auto* sv = static_cast<float*>(be->alloc_host_staging(chunk_bytes));
      std::vector<int32_t> pos(kChunkRows);
      for (int64_t c = 0; c < kChunks; ++c) {
        const int64_t row0 = c * kChunkRows;
        const float* ks = k_src.data() + row0 * kKvDim;
        const float* vs = v_src.data() + row0 * kKvDim;
        if (staged) {
          std::memcpy(sk, ks, chunk_bytes);
          std::memcpy(sv, vs, chunk_bytes);
          be->upload(kc + row0 * kKvDim, sk, chunk_bytes);
          be->upload(vc + row0 * kKvDim, sv, chunk_bytes);
        } else {
          std::memcpy(kc + row0 * kKvDim, ks, chunk_bytes);
          std::memcpy(vc + row0 * kKvDim, vs, chunk_bytes);
        }
        for (int64_t i = 0; i < kChunkRows; ++i) pos[i] = static_cast<int32_t>(row0 + 3 + i);
        be->rope(kc + row0 * kKvDim, pos.data(), kChunkRows, kHeadsKv, kHeadDim, kHeadDim,
                 100000.0f, nullptr);
        // The rope returned: both copies (queued before it) are done, so the
        // staging memory may be refilled for the next chunk.
      }
      const double ms = be->wait_uploads();
      be->free_host_staging(sk);
      be->free_host_staging(sv);
      return ms;
    };

    // Alone first (the reference for both sides), on this thread.
    Chain chain(*be, 24, 31);
    const Chain::Result chain_alone = chain.run(40, false);
    load(true);
    const std::vector<float> k_alone = host(kc, k_src.size());
    EXPECT_TRUE(test::bitwise_equal(host(vc, v_src.size()), v_src)) << what;
    std::vector<float> k_ref = k_src;
    for (int64_t c = 0; c < kChunks; ++c) {
      std::vector<int32_t> pos(kChunkRows);
      for (int64_t i = 0; i < kChunkRows; ++i)
        pos[i] = static_cast<int32_t>(c * kChunkRows + 3 + i);
      ref::rope(k_ref.data() + c * kChunkRows * kKvDim, pos.data(), kChunkRows, kHeadsKv, kHeadDim,
                kHeadDim, 100000.0f);
    }
    for (size_t i = 0; i < k_ref.size(); ++i) {
      ASSERT_NEAR(k_alone[i], k_ref[i], 2e-6) << what << " K element " << i;
    }

    // Writing straight into the cache while kernels run is what zero-copy
    // buffers allow (wants_staged_uploads() false); managed ones get staging.
    for (bool staged : {true, false}) {
      if (!staged && be->wants_staged_uploads()) continue;
      std::memset(kc, 0, kv_bytes);
      std::memset(vc, 0, kv_bytes);
      std::latch start(2);
      double copy_ms = -1.0;
      std::thread loader([&] {
        start.arrive_and_wait();
        copy_ms = load(staged);
      });
      start.arrive_and_wait();
      const Chain::Result together = chain.run(40, true);
      loader.join();
      const std::string w = what + (staged ? " staged" : " direct");
      expect_same(together, chain_alone, w + " main thread");
      EXPECT_TRUE(test::bitwise_equal(host(kc, k_src.size()), k_alone)) << w << " K";
      EXPECT_TRUE(test::bitwise_equal(host(vc, v_src.size()), v_src)) << w << " V";
      // Copies between host buffers (staging into zero-copy memory) may be
      // done by the CPU inside upload(), outside the timed events.
      if (!staged) {
        EXPECT_EQ(copy_ms, 0.0) << w;
      } else if (memory == CudaMemory::kManaged) {
        EXPECT_GT(copy_ms, 0.0) << w;
      } else {
        EXPECT_GE(copy_ms, 0.0) << w;
      }
    }
    be->free_buffer(kc);
    be->free_buffer(vc);
  }
}

// A layer's chunks read by several threads at once, as the layer loader
// does with fetch_threads > 1: each thread stages and uploads every n-th
// chunk through two slots of its own (waiting for its copies before a slot
// is refilled and once at its end), then one thread rotates the whole
// layer's K.  The copies of each thread are ordered on its own stream only,
// so the result shows that each thread's final wait covered them.
TEST_F(Cuda, FetchThreadsUploadALayersChunksAtOnce) {
  constexpr int64_t kChunks = 8, kChunkRows = 64, kHeadsKv = 3, kHeadDim = 64, kThreads = 3;
  constexpr int64_t kKvDim = kHeadsKv * kHeadDim, kRows = kChunks * kChunkRows;
  constexpr size_t kChunkBytes = static_cast<size_t>(kChunkRows * kKvDim) * sizeof(float);
  std::mt19937 rng(26);
  const std::vector<float> k_src = test::random_floats(rng, kRows * kKvDim);
  const std::vector<float> v_src = test::random_floats(rng, kRows * kKvDim);
  std::vector<int32_t> pos(static_cast<size_t>(kRows));
  std::iota(pos.begin(), pos.end(), 5);
  std::vector<float> k_ref = k_src;
  ref::rope(k_ref.data(), pos.data(), kRows, kHeadsKv, kHeadDim, kHeadDim, 100000.0f);
  const bool integrated = !cuda_backend(CudaMemory::kAuto)->wants_staged_uploads();
  for (CudaMemory memory : {CudaMemory::kManaged, CudaMemory::kMapped}) {
    if (memory == CudaMemory::kManaged && integrated) continue;
    auto be = cuda_backend(memory);
    const std::string what = memory == CudaMemory::kMapped ? "zero-copy" : "managed";
    const size_t kv_bytes = static_cast<size_t>(kRows * kKvDim) * sizeof(float);
    auto* kc = static_cast<float*>(be->alloc_buffer(kv_bytes));
    auto* vc = static_cast<float*>(be->alloc_buffer(kv_bytes));
    std::memset(kc, 0, kv_bytes);
    std::memset(vc, 0, kv_bytes);
    auto* staging = static_cast<float*>(be->alloc_host_staging(2 * kThreads * 2 * kChunkBytes));
    std::vector<double> copy_ms(kThreads, 0.0);
    std::vector<std::thread> threads;
    std::latch start(kThreads);
    for (int64_t t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        start.arrive_and_wait();
        int slot = 0;
        for (int64_t c = t; c < kChunks; c += kThreads, slot ^= 1) {
          float* sk = staging + (2 * t + slot) * 2 * (kChunkBytes / sizeof(float));
          float* sv = sk + kChunkBytes / sizeof(float);
          copy_ms[t] += be->wait_uploads();  // this slot's previous copies
          const int64_t row0 = c * kChunkRows;
          std::memcpy(sk, k_src.data() + row0 * kKvDim, kChunkBytes);
          std::memcpy(sv, v_src.data() + row0 * kKvDim, kChunkBytes);
          be->upload(kc + row0 * kKvDim, sk, kChunkBytes);
          be->upload(vc + row0 * kKvDim, sv, kChunkBytes);
        }
        copy_ms[t] += be->wait_uploads();
      });
    }
    for (std::thread& th : threads) th.join();
    be->rope(kc, pos.data(), kRows, kHeadsKv, kHeadDim, kHeadDim, 100000.0f, nullptr);
    const std::vector<float> k = host(kc, k_src.size());
    for (size_t i = 0; i < k_ref.size(); ++i)
      ASSERT_NEAR(k[i], k_ref[i], 2e-6) << what << " K " << i;
    EXPECT_TRUE(test::bitwise_equal(host(vc, v_src.size()), v_src)) << what << " V";
    if (memory == CudaMemory::kManaged) {
      for (int64_t t = 0; t < kThreads; ++t) EXPECT_GT(copy_ms[t], 0.0) << what << " thread " << t;
    }
    be->free_host_staging(staging);
    be->free_buffer(kc);
    be->free_buffer(vc);
  }
}

// Threads come and go (the fusor starts a loader per request): each new
// thread's calls work, and a thread's leftover state does not leak into the
// next one that gets its stream.
TEST_F(Cuda, ShortLivedThreadsEachWork) {
  std::mt19937 rng(25);
  const int64_t n = 4096;
  const std::vector<float> a = test::random_floats(rng, n);
  float* src = dev(a);
  for (int t = 0; t < 24; ++t) {
    float* out = dev(std::vector<float>(static_cast<size_t>(n), 0.0f));
    const std::vector<float> b = test::random_floats(rng, n);
    std::vector<float> expect(static_cast<size_t>(n));
    ref::add(a.data(), b.data(), n, expect.data());
    std::thread th([&] {
      float* tmp = static_cast<float*>(be_->alloc_buffer(n * sizeof(float)));
      be_->upload(tmp, b.data(), n * sizeof(float));
      if (t % 3 == 0) {
        // Left open on purpose: the thread ends inside a batch.  The top_k
        // into host memory waits for the add; if the open batch leaked into
        // the next thread, that thread's add would return unfinished.
        be_->begin_batch();
        be_->add(src, tmp, n, out);
        int32_t pick = -1;
        be_->top_k(out, n, 1, &pick);
        EXPECT_GE(pick, 0);
      } else {
        be_->add(src, tmp, n, out);
      }
      // (Zero-copy, the default on an integrated GPU, may copy on the CPU.)
      EXPECT_GE(be_->wait_uploads(), be_->wants_staged_uploads() ? 1e-9 : 0.0);
      be_->free_buffer(tmp);
    });
    th.join();
    EXPECT_TRUE(test::bitwise_equal(host(out, expect.size()), expect)) << "thread " << t;
  }
}

// ------------------------------------------------------------- zero-copy --

// Forced zero-copy on any GPU: host writes into buffers that ops read, ops
// write buffers the host reads after the op (or the batch) returns, and the
// host may write a buffer that no queued op uses while a batch runs.
TEST_F(Cuda, ZeroCopyBuffersAreSharedWithTheHost) {
  auto be = cuda_backend(CudaMemory::kMapped);
  std::mt19937 rng(26);
  const int64_t dim = 576, n_rows = 7;
  const std::vector<float> x = test::random_floats(rng, n_rows * dim);
  const std::vector<float> wt = test::random_floats(rng, dim);
  auto alloc = [&](int64_t n) {
    auto* p = static_cast<float*>(be->alloc_buffer(static_cast<size_t>(n) * sizeof(float)));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    return p;
  };
  float* dx = alloc(n_rows * dim);
  float* dw = alloc(dim);
  float* dout = alloc(n_rows * dim);
  std::memcpy(dx, x.data(), x.size() * sizeof(float));
  std::memcpy(dw, wt.data(), wt.size() * sizeof(float));
  std::vector<float> expect(x.size());
  ref::rmsnorm(x.data(), wt.data(), n_rows, dim, 1e-5f, expect.data());
  be->rmsnorm(dx, dw, n_rows, dim, 1e-5f, dout);
  for (size_t i = 0; i < expect.size(); ++i) {
    ASSERT_NEAR(dout[i], expect[i], 1e-6 * (1.0 + std::fabs(expect[i]))) << i;
  }

  // Matmul both paths, weight in device memory, activations zero-copy.
  const std::vector<uint8_t> data = test::random_weight(rng, DType::Q4_K, 40, dim - 64);
  const WeightView hw{data.data(), DType::Q4_K, dim - 64, 40};
  const WeightView w = be->prepare_weight(hw);
  for (int64_t rows : {int64_t{1}, n_rows}) {
    std::vector<float> y_ref(static_cast<size_t>(rows * 40));
    std::vector<float> xin(x.begin(), x.begin() + rows * (dim - 64));
    ref::matmul(hw, xin.data(), rows, y_ref.data());
    float* xi = alloc(rows * (dim - 64));
    float* y = alloc(rows * 40);
    std::memcpy(xi, xin.data(), xin.size() * sizeof(float));
    be->matmul(w, xi, rows, y);
    for (size_t i = 0; i < y_ref.size(); ++i) {
      ASSERT_NEAR(y[i], y_ref[i], 1e-3 * (1.0 + std::fabs(y_ref[i]))) << "rows " << rows;
    }
  }

  // While a batch is queued on A, the host fills B; B is read afterwards.
  const int64_t big = int64_t{1} << 22;
  float* a = alloc(big);
  float* b = alloc(big);
  float* c = alloc(big);
  std::fill(a, a + big, 1.0f);
  be->begin_batch();
  for (int i = 0; i < 20; ++i) be->add(a, a, big, a);  // a = 2^20
  for (int64_t i = 0; i < big; ++i) b[i] = static_cast<float>(i % 1000);
  be->end_batch();
  be->add(a, b, big, c);
  for (int64_t i = 0; i < big; i += 4099) {
    ASSERT_EQ(c[i], 1048576.0f + static_cast<float>(i % 1000)) << i;
  }
  for (float* p : {dx, dw, dout, a, b, c}) be->free_buffer(p);

  try {
    be->alloc_buffer(std::numeric_limits<size_t>::max() / 2);
    FAIL() << "expected kOutOfMemory";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory) << e.what();
  }
}

// ---------------------------------------------------- invalid arguments --

TEST_F(Cuda, RejectsBadUploadsAndFrees) {
  auto expect_code = [](ErrorCode code, const char* what, auto&& f) {
    try {
      f();
      ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << what << ": " << e.what();
    }
  };
  const size_t n = 256;
  auto* buf = static_cast<float*>(be_->alloc_buffer(n * sizeof(float)));
  std::vector<float> host_mem(n, 1.0f);
  expect_code(ErrorCode::kInvalidArgument, "upload to host memory",
              [&] { be_->upload(host_mem.data(), host_mem.data(), 16); });
  expect_code(ErrorCode::kInvalidArgument, "upload to null",
              [&] { be_->upload(nullptr, buf, 16); });
  expect_code(ErrorCode::kInvalidArgument, "upload from null",
              [&] { be_->upload(buf, nullptr, 16); });
  expect_code(ErrorCode::kInvalidArgument, "upload past the end",
              [&] { be_->upload(buf + n - 1, host_mem.data(), 2 * sizeof(float)); });
  expect_code(ErrorCode::kInvalidArgument, "free of host memory",
              [&] { be_->free_buffer(host_mem.data()); });
  expect_code(ErrorCode::kInvalidArgument, "free inside a buffer",
              [&] { be_->free_buffer(buf + 1); });
  expect_code(ErrorCode::kInvalidArgument, "free_host_staging of other memory",
              [&] { be_->free_host_staging(host_mem.data()); });
  expect_code(ErrorCode::kOutOfMemory, "huge staging",
              [&] { be_->alloc_host_staging(std::numeric_limits<size_t>::max() / 2); });
  expect_code(ErrorCode::kInvalidArgument, "scatter into pageable memory", [&] {
    const int32_t idx = 0;
    be_->scatter_rows(buf, 4, &idx, 1, host_mem.data());
  });
  EXPECT_NO_THROW(be_->free_host_staging(nullptr));
  EXPECT_NO_THROW(be_->upload(buf, host_mem.data(), 0));
  be_->free_buffer(buf);
}

}  // namespace
}  // namespace cb
