# The two commands of the README:  make demo  and  make test.
# Both run the idempotent set-up first (Debian packages, model), then build.
BUILD       ?= build
BUILD_ASAN  ?= build-asan
BUILD_FUZZ  ?= build-fuzz
JOBS        ?= $(shell nproc)
CMAKE_FLAGS ?=
FUZZ_SECONDS ?= 30
DEMO_MODEL  := models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
MODEL       ?= $(if $(CB_MODEL),$(CB_MODEL),$(DEMO_MODEL))

.PHONY: all setup build test test-asan test-fuzz test-tsan test-arm demo peer clean

all: build

setup:
	@bash scripts/setup.sh

# The project's own builds treat warnings as errors (CB_WERROR); a consumer's
# build of the library does not.
build: setup
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCB_WERROR=ON $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j$(JOBS)

# The whole suite: release build (unit, integration on the real model, C ABI,
# oracles), then the suite under ASan+UBSan, bounded fuzzing, and the kernel
# tests cross-built for aarch64 (NEON) and run under qemu-user.
test: build
	@cd $(BUILD) && ctest --output-on-failure -j$(JOBS)
	@$(MAKE) --no-print-directory test-asan
	@$(MAKE) --no-print-directory test-fuzz
	@$(MAKE) --no-print-directory test-arm

test-asan: setup
	@cmake -S . -B $(BUILD_ASAN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCB_SANITIZE=ON -DCB_WERROR=ON >/dev/null
	@cmake --build $(BUILD_ASAN) -j$(JOBS)
	@cd $(BUILD_ASAN) && ctest --output-on-failure -j$(JOBS)

test-fuzz: setup
	@CC=clang CXX=clang++ cmake -S . -B $(BUILD_FUZZ) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCB_FUZZ=ON -DCB_SANITIZE=ON -DCB_BUILD_TESTS=ON -DCB_WERROR=ON >/dev/null
	@cmake --build $(BUILD_FUZZ) -j$(JOBS) --target fuzzers
	@bash scripts/run_fuzzers.sh $(BUILD_FUZZ) $(FUZZ_SECONDS)

# The threaded parts under ThreadSanitizer: the KV pipeline (its loader
# threads, staged loads, storage tiers, the loading controller), the chunk
# store's concurrent and asynchronous writes, and the C API's tests.  Not part
# of make test: about 30 minutes on 2 cores.
BUILD_TSAN ?= build-tsan
TSAN_TESTS := Pipeline|LoadingController|Staged|Tiered|Resident|Concurrency|AsyncPut|WriteBackQueue|ChunkCache|Throttle
test-tsan: setup
	@cmake -S . -B $(BUILD_TSAN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCB_TSAN=ON -DCB_WERROR=ON >/dev/null
	@cmake --build $(BUILD_TSAN) -j$(JOBS) --target test_runtime test_cache test_c_api
	@cd $(BUILD_TSAN) && ctest --output-on-failure -j$(JOBS) -R '$(TSAN_TESTS)'
	@$(BUILD_TSAN)/bin/test_c_api > $(BUILD_TSAN)/test_c_api.log 2>&1 || \
	  { tail -n 60 $(BUILD_TSAN)/test_c_api.log; exit 1; }
	@tail -n 1 $(BUILD_TSAN)/test_c_api.log

test-arm: setup
	@bash scripts/test_arm.sh build-arm64

# The RAG assistant on the bundled handbook corpus: ingest (a no-op once
# done), then each question with CacheBlend and with full prefill, answers and
# TTFT side by side.  The default model (Qwen2.5-Coder-1.5B-Instruct, 1.1 GB)
# is fetched on first use; MODEL=path or CB_MODEL picks another.
demo: build
	@$(if $(filter $(DEMO_MODEL),$(MODEL)),bash scripts/setup.sh model qwen1.5b,true)
	@python3 scripts/rag_demo.py --bin $(BUILD)/bin/rag_assistant --model $(MODEL) \
	  --store $(BUILD)/rag_demo_store

# Installs the C API (header, libcacheblend.so + SONAME links, libcacheblend.a,
# CMake package, cacheblend.pc) under PREFIX, e.g. make install PREFIX=$HOME/.local.
# Its own build tree, without the test suite and without the set-up (no
# packages, servers or models are fetched): CMake names any missing library.
PREFIX ?= /usr/local
BUILD_INSTALL ?= build-install
.PHONY: install
install:
	@cmake -S . -B $(BUILD_INSTALL) -DCMAKE_BUILD_TYPE=Release -DCB_BUILD_TESTS=OFF \
	  $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD_INSTALL) -j$(JOBS)
	@cmake --install $(BUILD_INSTALL) --prefix $(PREFIX)

# llama.cpp built from the llama-cpp-python sdist, for side-by-side benchmarks.
peer: setup
	@bash scripts/build_llamacpp_peer.sh

# The same llama.cpp with its CUDA backend (needs nvcc; ~20 min on 2 cores),
# which scripts/gpu_bundle.sh carries to a GPU machine.
.PHONY: peer-cuda
peer-cuda:
	@bash scripts/setup.sh packages
	@bash scripts/build_llamacpp_peer.sh --cuda

# The CUDA backend and its tests (needs nvcc; the tests skip without a GPU):
#   make build-cuda && (cd build-cuda && ctest -L cuda)
# CUDA_ARCHS overrides the target GPUs, e.g. CUDA_ARCHS=89 (see docs/CUDA.md).
BUILD_CUDA  ?= build-cuda
CUDA_ARCHS  ?=
.PHONY: build-cuda
build-cuda:
	@bash scripts/setup.sh packages  # the CUDA tests need no model
	@cmake -S . -B $(BUILD_CUDA) -DCMAKE_BUILD_TYPE=Release -DCB_CUDA=ON -DCB_WERROR=ON \
	  $(if $(CUDA_ARCHS),-DCMAKE_CUDA_ARCHITECTURES="$(CUDA_ARCHS)") $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD_CUDA) -j$(JOBS) --target cacheblend_cuda test_cuda cuda_bench

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_FUZZ) $(BUILD_INSTALL)
