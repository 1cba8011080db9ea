"""The Python bindings on the real model.

The model path comes from $CB_MODEL (default: models/SmolLM2-135M-Instruct.Q4_1.gguf
in the repository); the tests skip when it is missing.  Generations are short
and use 2 threads, so the whole file runs in seconds.
"""
import ctypes
import os
import threading
from pathlib import Path

import pytest

import cacheblend as cb
from cacheblend import _native

REPO = Path(__file__).resolve().parents[3]
MODEL_PATH = os.environ.get("CB_MODEL") or str(REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")

PROMPT = "The capital of France is"
CHUNKS = [
    "The museum opens at nine in the morning and closes at five in the evening.",
    "The secret code of the vault is 4721. Only the bank manager knows it.",
    "The river that flows through the old town is called the Velka.",
]
QUESTION = "What is the secret code of the vault?"

pytestmark = pytest.mark.skipif(not os.path.isfile(MODEL_PATH),
                                reason=f"model file {MODEL_PATH} not found (set CB_MODEL)")


@pytest.fixture(scope="module")
def model():
    with cb.Model(MODEL_PATH, n_threads=2) as m:
        yield m


@pytest.fixture
def session(model):
    with model.session(n_ctx=512) as s:
        yield s


def c_api_greedy(model, prompt, max_tokens):
    """The text the C API generates, called directly (no wrapper classes)."""
    lib = _native.lib
    ids = model.tokenize(prompt)
    arr = (ctypes.c_int32 * len(ids))(*ids)
    sess = _native.SessionPtr()
    assert lib.cb_session_create(model._ptr(), None, ctypes.byref(sess)) == 0
    go = _native.new_options(_native.GenerateOptions, lib.cb_generate_options_init)
    go.max_tokens = max_tokens
    pieces = []

    def collect(token, piece, n, user):
        pieces.append(ctypes.string_at(piece, n))
        return 0

    callback = _native.TokenCallback(collect)
    try:
        assert lib.cb_generate(sess, arr, len(ids), ctypes.byref(go), callback, None, None) == 0
    finally:
        lib.cb_session_free(sess)
    return b"".join(pieces).decode("utf-8")


def test_library_and_model_info(model):
    assert cb.library_version() == "0.1.0"
    assert os.path.exists(cb.library_path) or "/" not in cb.library_path
    info = model.info
    assert info.n_layer > 0 and info.n_vocab > 0 and info.n_ctx_train > 0
    assert info.name and info.architecture == "llama"
    assert info.backend in ("cpu", "cuda")
    assert model.eos is not None and model.is_end_of_generation(model.eos)


def test_chat_template_named_or_the_models_own(model):
    assert model.info.chat_template == "chatml"
    with cb.Model(MODEL_PATH, n_threads=1, chat_template="gemma") as gemma:
        assert gemma.info.chat_template == "gemma"
        assert gemma.chat_format([("system", "Be brief."), ("user", "hi")]) == (
            "<start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n<start_of_turn>model\n")
    with pytest.raises(ValueError, match="vicuna"):
        cb.Model(MODEL_PATH, chat_template="vicuna")


def test_tokenize_round_trip(model):
    text = "Hello, world! Café 123"
    ids = model.tokenize(text, add_special=False)
    assert 1 < len(ids) < len(text)
    assert model.detokenize(ids) == text
    assert b"".join(model.token_to_piece(t) for t in ids) == text.encode()
    assert model.tokenize("") == [] or model.tokenize("") == [model.bos]
    # Invalid UTF-8 is tokenized byte-wise; its bytes come back.
    raw = b"a\xc3b"
    assert model.detokenize_bytes(model.tokenize(raw, add_special=False)) == raw
    # Control tokens are parsed only when asked.
    # (A conversation without a system message opens with the template's
    # default one, SmolLM2's here.)
    chat = model.chat_format([("user", "hi")])
    assert chat.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert "<|im_start|>user\nhi<|im_end|>" in chat and chat.endswith("assistant\n")
    assert len(model.tokenize(chat, parse_special=True)) < len(model.tokenize(chat))


def test_greedy_generate_is_deterministic_and_matches_the_c_api(model, session):
    text = session.generate(PROMPT, max_tokens=6)
    assert text.startswith(" Paris")
    assert session.last_stats.n_generated == 6
    assert session.last_stats.stop_reason == cb.StopReason.MAX_TOKENS
    assert session.n_past == session.last_stats.n_prompt + 6
    session.reset()
    assert session.generate(PROMPT, max_tokens=6) == text
    assert c_api_greedy(model, PROMPT, 6) == text


def test_generation_options(model, session):
    assert session.generate(PROMPT, max_tokens=6, stop=".") == " Paris"
    assert session.last_stats.stop_reason == cb.StopReason.STRING
    sampled = []
    for _ in range(2):
        session.reset()
        sampled.append(session.generate(PROMPT, max_tokens=6, temperature=0.8, seed=7))
    assert sampled[0] == sampled[1]
    # A chat turn, and the logits a generation starts from.
    session.reset()
    session.prefill(model.chat_format([("user", "What is the capital of France?")]))
    logits = session.logits()
    assert len(logits) == model.info.n_vocab
    best = max(range(len(logits)), key=logits.__getitem__)
    assert session.generate(None, max_tokens=1) == model.detokenize([best])


def test_embed(model, session):
    session.prefill("Some context")
    a = session.embed("The cat sat on the warm mat by the kitchen door.")
    assert len(a) == model.info.n_embd and session.n_past == 0
    assert abs(sum(x * x for x in a) - 1.0) < 1e-5
    b = session.embed("A cat was lying on the mat next to the kitchen door.")
    c = session.embed("Quarterly revenue grew by twelve percent in Europe.")
    cos = lambda u, v: sum(x * y for x, y in zip(u, v))  # noqa: E731
    assert cos(a, b) > cos(a, c) and cos(a, b) > cos(b, c)
    assert list(session.embed(model.tokenize("The cat", add_special=False))) == \
        list(session.embed("The cat"))
    with pytest.raises(cb.InvalidArgumentError) as err:
        session.embed("")
    assert err.value.message.startswith("Session.embed(): "), err.value.message


def test_streaming(session):
    expected = session.generate(PROMPT, max_tokens=8)
    session.reset()
    pieces = list(session.stream(PROMPT, max_tokens=8))
    assert len(pieces) > 1 and "".join(pieces) == expected
    # The callback form gives the same pieces.
    session.reset()
    seen = []
    assert session.generate(PROMPT, max_tokens=8, on_text=seen.append) == expected
    assert seen == pieces
    # Leaving the loop early stops the generation; the session stays usable.
    session.reset()
    for i, _ in enumerate(session.stream(PROMPT, max_tokens=50)):
        if i == 1:
            break
    assert session.n_past < len(session.model.tokenize(PROMPT)) + 50
    session.reset()
    assert session.generate(PROMPT, max_tokens=8) == expected
    # on_text returning True stops normally.
    session.reset()
    assert session.generate(PROMPT, max_tokens=8, on_text=lambda t: True) == pieces[0]
    assert session.last_stats.stop_reason == cb.StopReason.CANCELLED


def test_callback_exceptions_propagate(session):
    def fail_on_second(piece, count=[]):
        count.append(piece)
        if len(count) == 2:
            raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        session.generate(PROMPT, max_tokens=8, on_text=fail_on_second)
    assert session.last_stats.n_generated == 2

    def bad_abort():
        raise KeyError("from the abort callback")

    session.reset()
    session.set_abort_callback(bad_abort)
    with pytest.raises(KeyError):
        session.prefill(PROMPT)
    with pytest.raises(KeyError):
        list(session.stream(PROMPT, max_tokens=4))
    assert session.n_past == 0
    session.set_abort_callback(None)
    assert session.generate(PROMPT, max_tokens=2).startswith(" Paris")


def test_abort_callback(session):
    stop = threading.Event()
    session.set_abort_callback(stop.is_set)
    stop.set()
    with pytest.raises(cb.CancelledError) as err:
        session.generate(PROMPT, max_tokens=4)
    assert err.value.status == cb.Status.CANCELLED and err.value.message
    assert session.n_past == 0
    stop.clear()
    assert session.generate(PROMPT, max_tokens=2).startswith(" Paris")


def test_progress_callback(model, session):
    reports = []
    session.set_progress_callback(lambda *r: reports.append(r))
    session.prefill(PROMPT)
    assert reports == [(cb.ProgressStage.PREFILL, session.n_past, session.n_past)]
    n_layer = model.info.n_layer
    layers = lambda stage, n: [(stage, i, n) for i in range(1, n + 1)]  # noqa: E731
    with cb.ChunkCache() as cache:
        session.reset()
        cache.add(session, CHUNKS[0])
        reports.clear()
        session.reset()
        session.rag_prefill(CHUNKS[:2], QUESTION, cache)
        # The default selection ranks in a pass of its own: two passes.
        assert reports == (layers(cb.ProgressStage.CHUNK, n_layer) +
                           layers(cb.ProgressStage.BLEND, 2 * n_layer))

        session.set_progress_callback(lambda stage, done, total: done == 2)
        session.reset()
        with pytest.raises(cb.CancelledError):
            session.rag_prefill(CHUNKS[:2], QUESTION, cache)
        assert session.n_past == 0

        def bad(stage, done, total):
            raise KeyError("from the progress callback")

        session.set_progress_callback(bad)
        with pytest.raises(KeyError):
            session.prefill(PROMPT)
    session.set_progress_callback(None)
    session.reset()
    assert session.generate(PROMPT, max_tokens=2).startswith(" Paris")


def test_rag_in_ram(model, session):
    with cb.ChunkCache() as cache:
        added = [cache.add(session, c) for c in CHUNKS]
        assert all(a.computed and a.n_tokens > 5 for a in added)
        assert not cache.add(session, CHUNKS[0]).computed
        assert all(cache.contains(model, c) for c in CHUNKS)
        assert cache.stats().n_entries == 3

        answer = session.rag_generate(CHUNKS, QUESTION, cache, max_tokens=12)
        assert "4721" in answer
        blend = session.last_rag_stats
        assert blend.cache_hits == 3 and blend.cache_misses == 0
        assert 0 < blend.computed_fraction < 1 and blend.n_reused > 0
        assert session.last_stats.ttft_ms >= blend.total_ms

        full = cb.RagOptions(mode="full")
        assert "4721" in session.rag_generate(CHUNKS, QUESTION, None, full, max_tokens=12)
        assert session.last_rag_stats.computed_fraction == 1.0
        assert session.last_rag_stats.n_tokens == blend.n_tokens

        hkvd = cb.RagOptions(select=cb.Select.HKVD, schedule=[(1, 0.3), (3, 0.15)])
        session.reset()
        stats = session.rag_prefill(CHUNKS, QUESTION, cache, hkvd)
        assert stats.cache_hits == 3 and 0 < stats.computed_fraction < 1

        # Three threads reading the cached chunks: the same logits.
        session.reset()
        session.rag_prefill(CHUNKS, QUESTION, cache)
        one = list(session.logits())
        session.reset()
        stats = session.rag_prefill(CHUNKS, QUESTION, cache, cb.RagOptions(fetch_threads=3))
        assert stats.cache_hits == 3 and list(session.logits()) == one
        # The CPU keeps no chunks in a GPU's memory.
        assert stats.resident_hits == 0 and stats.resident_bytes == 0
        session.reset()
        with pytest.raises(cb.InvalidArgumentError, match="fetch_threads"):
            session.rag_prefill(CHUNKS, QUESTION, cache, cb.RagOptions(fetch_threads=-1))

        # Another namespace does not see these chunks.
        other = cb.RagOptions(cache_namespace="another-app")
        assert not cache.contains(model, CHUNKS[0], other)
        assert cache.remove(session, CHUNKS[0]) and not cache.remove(session, CHUNKS[0])
        assert not cache.contains(model, CHUNKS[0])
        cache.clear()
        assert cache.stats().n_entries == 0


def test_chunk_cache_on_disk_persists(model, session, tmp_path):
    store = tmp_path / "store"
    with cb.ChunkCache(store, codec="q8") as cache:
        session.rag_prefill(CHUNKS, QUESTION, cache)
        assert session.last_rag_stats.cache_misses == 3
        cache.flush()
        assert cache.stats().n_entries == 3
    with cb.ChunkCache(store) as cache:
        assert all(cache.contains(model, c) for c in CHUNKS)
        assert cache.stats().hits >= 3
        answer = session.rag_generate(CHUNKS, QUESTION, cache, max_tokens=12)
        assert "4721" in answer
        assert session.last_rag_stats.cache_hits == 3
        assert session.last_rag_stats.bytes_read > 0


def test_chunk_cache_tiers(model, session, tmp_path):
    """Storage tiers through the store options, and their counters."""
    with cb.ChunkCache() as ram:
        assert ram.tier_stats() == []
    with pytest.raises(cb.InvalidArgumentError, match="placement_ratio"):
        cb.ChunkCache(tmp_path / "bad", placement_ratio=1.5)
    with cb.ChunkCache(tmp_path / "store", codec="f16", ram_budget_bytes=64 << 20,
                       slow_dir=tmp_path / "sd", slow_read_bytes_per_sec=10_000_000,
                       placement_ratio=0.15) as cache:
        session.rag_prefill(CHUNKS, QUESTION, cache)
        cache.flush()
        tiers = cache.tier_stats()
        assert [t.name for t in tiers] == ["ram", "flash", "slow"]
        assert sum(t.placed for t in tiers) == 3
        answer = session.rag_generate(CHUNKS, QUESTION, cache, max_tokens=12)
        assert "4721" in answer
        tiers = cache.tier_stats()
        assert sum(t.hits for t in tiers) == 3
        assert tiers[0].misses + tiers[0].hits >= 6
        assert cache.open_report() == ""
    # A slow directory that cannot be used is skipped, counted and reported.
    (tmp_path / "not_a_dir").write_text("x")
    with cb.ChunkCache(tmp_path / "store", slow_dir=tmp_path / "not_a_dir") as cache:
        assert [t.name for t in cache.tier_stats()] == ["flash"]
        assert cache.stats().unavailable_tiers == 1 and not cache.stats().read_only
        assert "not_a_dir" in cache.open_report() and "unavailable" in cache.open_report()


def test_kv_type_sets_the_cache_size_and_keeps_greedy_text(model):
    info = model.info
    # (f32 activations: int8 rounding turns the f16 cache's ~1e-3 into
    # flipped quantization steps, whose effect can reach a near-tie.)
    with model.session(n_ctx=256, activations="f32") as f16, \
            model.session(n_ctx=256, kv_type="f32", activations="f32") as f32:
        per_type = info.n_layer * 256 * 2 * info.n_head_kv * info.head_dim
        assert f16.kv_bytes == 2 * per_type  # the default
        assert f32.kv_bytes == 4 * per_type
        # The same greedy text on this prompt: the f16 rounding moves the
        # logits by ~1e-3, far below its top-2 gaps.
        assert f16.generate(PROMPT, max_tokens=8) == f32.generate(PROMPT, max_tokens=8)
    # Unknown values stop in the bindings (the C API's own check is
    # tests/abi's).
    with pytest.raises(ValueError, match="not a valid KvType"):
        model.session(kv_type=7)
    with pytest.raises(ValueError, match="unknown KvType"):
        model.session(kv_type="bf16")
    # GPU memory for resident chunks: -1 (none) is a valid choice, below is not.
    model.session(n_ctx=64, resident_kv_bytes=-1).close()
    with pytest.raises(cb.InvalidArgumentError, match="resident_kv_bytes"):
        model.session(resident_kv_bytes=-2)


def test_errors_carry_status_and_message(tmp_path, session):
    missing = tmp_path / "no-such-model.gguf"
    with pytest.raises(cb.Error) as err:
        cb.Model(missing)
    assert isinstance(err.value, cb.IoError) and err.value.status == cb.Status.IO
    assert "no-such-model.gguf" in str(err.value)
    # Messages name the Python call, not the C function behind it.
    assert err.value.message.startswith("Model(): "), err.value.message
    assert "cb_model_load" not in str(err.value)

    not_gguf = tmp_path / "not.gguf"
    not_gguf.write_text("hello")
    with pytest.raises(cb.FormatError, match="GGUF"):
        cb.Model(not_gguf)

    with pytest.raises(cb.InvalidArgumentError, match="ratio"):
        session.rag_prefill(CHUNKS, QUESTION, None, cb.RagOptions(mode="full", ratio=2.0))
    with pytest.raises(cb.InvalidArgumentError, match="NULL"):
        session.rag_prefill(CHUNKS, QUESTION, None)  # only FULL runs without a cache
    with pytest.raises(cb.InvalidArgumentError, match="top_p") as err:
        session.generate(PROMPT, max_tokens=2, top_p=1.5)
    assert err.value.message.startswith("Session.generate(): "), err.value.message
    with pytest.raises(ValueError, match="unknown Mode"):
        cb.RagOptions(mode="fast").to_struct()
    with pytest.raises(ValueError, match="NUL"):
        session.rag_prefill(["a\0b"], QUESTION)
    with pytest.raises(cb.ContextOverflowError):
        with session.model.session(n_ctx=16) as small:
            small.generate("word " * 40, max_tokens=1)


def test_closed_objects_raise(model):
    m = cb.Model(MODEL_PATH, n_threads=2)
    s = m.session(n_ctx=256)
    m.close()
    m.close()  # a second close is harmless
    with pytest.raises(cb.InvalidArgumentError, match="Model is closed"):
        m.tokenize("x")
    with pytest.raises(cb.InvalidArgumentError):
        m.session()
    # The session keeps its model alive and can still read text.
    assert s.generate(PROMPT, max_tokens=2).startswith(" Paris")
    s.close()
    for use in (lambda: s.generate(PROMPT), lambda: s.n_past, s.reset, lambda: list(s.stream())):
        with pytest.raises(cb.InvalidArgumentError, match="Session is closed"):
            use()
    cache = cb.ChunkCache()
    cache.close()
    with pytest.raises(cb.InvalidArgumentError, match="ChunkCache is closed"):
        cache.stats()
    with pytest.raises(cb.InvalidArgumentError):
        cache.contains(model, "x")
    with model.session(n_ctx=256) as live:
        with pytest.raises(cb.InvalidArgumentError):
            live.rag_prefill(CHUNKS, QUESTION, cache)


@pytest.mark.parametrize("callback", ["abort", "progress"])
def test_close_from_the_abort_or_progress_callback(model, callback):
    """close() from the session's own abort or progress callback stops the
    call it runs in (CancelledError); the session is freed when that call
    returns."""
    calls = [
        lambda s, cache: s.prefill(PROMPT * 20),
        lambda s, cache: s.rag_prefill(CHUNKS, QUESTION, cache),
        lambda s, cache: cache.add(s, CHUNKS[0] * 4),
    ]
    with cb.ChunkCache() as cache:
        for call in calls:
            s = model.session(n_ctx=512, n_batch=32)
            count = []

            def close_at_second(*_report):
                count.append(1)
                if len(count) == 2:
                    s.close()
                return False

            if callback == "abort":
                s.set_abort_callback(close_at_second)
            else:
                s.set_progress_callback(close_at_second)
            with pytest.raises(cb.CancelledError):
                call(s, cache)
            assert s.closed and len(count) == 2


# A script that leaves generation running when it exits: in a daemon thread,
# or in a stream() it stops iterating.  The process exits cleanly (before,
# the library swallowed the unwinding that ends such a thread and aborted,
# or the thread called back into the finalized interpreter).  A crash is a
# race, so each way runs a few times.
EXIT_WHILE_GENERATING = """
import sys, threading, time
import cacheblend as cb
model = cb.Model(sys.argv[1], n_threads=2)
session = model.session(n_ctx=512)
started = threading.Event()
def slow(piece):
    started.set()
    time.sleep(0.05)
if sys.argv[2] == "daemon":
    threading.Thread(target=lambda: session.generate("Count to a hundred:", max_tokens=400,
                                                     on_text=slow), daemon=True).start()
    started.wait()
else:
    pieces = session.stream("Count to a hundred:", max_tokens=400)
    next(pieces)
print("exiting", flush=True)
"""


@pytest.mark.parametrize("how", ["daemon", "stream"])
def test_exit_while_generating(how):
    import subprocess
    import sys
    for _ in range(8):
        done = subprocess.run([sys.executable, "-c", EXIT_WHILE_GENERATING, MODEL_PATH, how],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "exiting" in done.stdout and done.stderr == ""
