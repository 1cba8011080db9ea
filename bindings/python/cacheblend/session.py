"""Session: a KV cache on a model, for prefill, generation and RAG requests."""
import atexit
import codecs
import contextlib
import ctypes
import queue
import threading
from array import array
from ctypes import POINTER, byref, c_char_p, c_float, c_size_t

from . import _native
from .errors import Closeable, Status, check, closed_error, error_for
from .model import tokenize
from .types import Activations, KvType, ProgressStage, c_int32_array, c_string, generate_stats, rag_stats, rag_struct
from ._native import lib


def _generate_options(max_tokens, stop, stop_at_end_of_generation, sampling):
    go = _native.new_options(_native.GenerateOptions, lib.cb_generate_options_init_sized)
    go.max_tokens = max_tokens
    go.stop_at_end_of_generation = int(bool(stop_at_end_of_generation))
    sampling = {k: v for k, v in sampling.items() if v is not None}
    if sampling:
        s = _native.new_options(_native.SamplingOptions, lib.cb_sampling_options_init_sized)
        for name, value in sampling.items():
            setattr(s, name, value)
        go.sampling = ctypes.pointer(s)  # go keeps s alive
    if stop:
        if isinstance(stop, (str, bytes)):
            stop = [stop]
        strings = [c_string(x, "stop string") for x in stop]
        go.stop_strings = (c_char_p * len(strings))(*strings)
        go.n_stop_strings = len(strings)
    return go


# The C calls that may call back into Python run with the GIL released.  A
# thread still inside one when the interpreter exits (a daemon thread, an
# unfinished stream()) would call back into a finalized interpreter and
# crash the process.  So at exit the callbacks ask every call to stop, and
# the exit waits for the calls to return.
_exiting = threading.Event()
_calls = threading.Condition()
_in_flight = [0]
_EXIT_WAIT_S = 30.0


def _asks_to_stop(pending, ask):
    """What a C callback that stops its call with a non-zero result returns:
    whether `ask()` is true; 1 when it raises (the exception goes to
    `pending`, to be re-raised when the call returns) or when the
    interpreter is exiting."""
    if _exiting.is_set():
        return 1
    try:
        return 1 if ask() else 0
    except BaseException as e:  # noqa: B036 - re-raised after the call
        pending.append(e)
        return 1


@contextlib.contextmanager
def calling_back():
    """Marks a C call that may call back into Python, for the exit to wait on."""
    with _calls:
        _in_flight[0] += 1
    try:
        yield
    finally:
        with _calls:
            _in_flight[0] -= 1
            _calls.notify_all()


def _stop_calls_at_exit():
    _exiting.set()
    with _calls:
        _calls.wait_for(lambda: _in_flight[0] == 0, timeout=_EXIT_WAIT_S)


atexit.register(_stop_calls_at_exit)


class _Failure:
    def __init__(self, error):
        self.error = error


class Session(Closeable):
    """A session (a KV cache) on `model`.  Calls on one session must not
    overlap; different sessions may run on different threads.

    n_ctx      context length in tokens; 0: the smaller of the model's
               training context and 4096
    n_threads  compute threads; 0: the model's n_threads
    n_batch    tokens per forward chunk during prefill; 0: 256 (CPU) or 2048 (CUDA)
    kv_type    the KV cache's element type: KvType.F16 (default: half the
               memory) or KvType.F32 (exact); a member, its number or "f16"/"f32"
    activations  Activations.INT8 (default: int8 activations in the weight
               products, as llama.cpp) or Activations.F32 (exact); a member,
               its number or "int8"/"f32"
    resident_kv_bytes  GPU memory for retrieved chunks' KV kept between RAG
               requests (RagStats.resident_hits); 0: the library's choice (a
               sixteenth of a discrete GPU's memory, at most 4 GiB; none on
               the CPU or Jetson), -1: none

    Prompts may be text (tokenized with control tokens parsed, BOS/EOS added
    as the model says when the session is empty), bytes, or token ids.
    """

    def __init__(self, model, n_ctx=None, n_threads=None, n_batch=None, kv_type=None, activations=None,
                 resident_kv_bytes=None):
        self._handle = None
        shared = model._shared
        if shared is None:
            raise closed_error("Model")
        opts = _native.new_options(_native.SessionOptions, lib.cb_session_options_init_sized)
        for name, value in (("n_ctx", n_ctx), ("n_threads", n_threads), ("n_batch", n_batch),
                            ("resident_kv_bytes", resident_kv_bytes)):
            if value is not None:
                setattr(opts, name, value)
        if kv_type is not None:
            opts.kv_type = int(KvType.coerce(kv_type))
        if activations is not None:
            opts.activations = int(Activations.coerce(activations))
        ptr = _native.SessionPtr()
        check(lib.cb_session_create(shared.ptr, byref(opts), byref(ptr)))
        shared.acquire()
        self._shared = shared
        self._handle = ptr
        self._free = lib.cb_session_free  # still reachable during interpreter shutdown
        self.model = model
        # Exceptions raised by Python callbacks during a C call, re-raised
        # when it returns.  A list, not an attribute of self, so that the
        # callbacks do not hold a reference to the session.
        self._pending = []
        self._abort = None  # keeps the C function pointer alive
        self._progress = None  # likewise
        self._stream = None  # (stop event, worker thread) while stream() runs
        self.last_stats = None  # GenerateStats of the last generate()
        self.last_rag_stats = None  # RagStats of the last RAG prefill

    # --- lifetime
    def close(self):
        """Frees the session (idempotent).  A running stream() is stopped first."""
        stream = getattr(self, "_stream", None)
        if stream is not None and stream[1] is not threading.current_thread():
            stream[0].set()
            stream[1].join()
        ptr, self._handle = getattr(self, "_handle", None), None
        if ptr:
            self._free(ptr)
        shared, self._shared = getattr(self, "_shared", None), None
        if shared is not None:
            shared.release()

    @property
    def closed(self):
        return self._handle is None

    def __repr__(self):
        if self.closed:
            return "<cacheblend.Session closed>"
        return f"<cacheblend.Session {self.n_past}/{self.n_ctx} tokens>"

    def _ptr(self):
        if self._handle is None:
            raise closed_error("Session")
        return self._handle

    def _finish(self, status):
        """Raises what a call left: a callback's exception first (it is why
        the call stopped), else the call's own error."""
        err = error_for(status)  # first: it reads this thread's last error
        if self._pending:
            raise self._pending.pop()
        if err is not None:
            raise err

    def _tokens(self, prompt):
        self._ptr()  # a closed session says so, whatever the prompt
        if prompt is None or len(prompt) == 0:
            return []
        if isinstance(prompt, (str, bytes, bytearray)):
            return tokenize(self._shared.ptr, prompt, self.n_past == 0, True)
        return list(prompt)

    # --- state
    @property
    def n_past(self):
        """Tokens in the session's context."""
        return lib.cb_session_n_past(self._ptr())

    @property
    def n_ctx(self):
        """The session's context length."""
        return lib.cb_session_n_ctx(self._ptr())

    @property
    def kv_bytes(self):
        """Bytes of the session's KV cache (allocated at creation)."""
        return lib.cb_session_kv_bytes(self._ptr())

    def reset(self):
        """Forgets the whole context."""
        check(lib.cb_session_reset(self._ptr()))

    def prefill(self, prompt):
        """Appends `prompt` to the context (runs the forward pass over it)."""
        arr, n = c_int32_array(self._tokens(prompt))
        with calling_back():
            status = lib.cb_session_prefill(self._ptr(), arr, n)
        self._finish(status)

    def embed(self, text):
        """The embedding of `text` (str, bytes or token ids; text is
        tokenized without special tokens): the mean of the model's last
        hidden states over its tokens, scaled to unit length (array of
        n_embd floats), so a dot product is a cosine.  The session's context
        is discarded.  A decoder model's pooled states are no trained
        sentence embedding: measure them on your task first."""
        self._ptr()
        if isinstance(text, (str, bytes, bytearray)):
            ids = tokenize(self._shared.ptr, text, False, False)
        else:
            ids = list(text)
        arr, n = c_int32_array(ids)
        dim = self.model.info.n_embd
        out = (c_float * dim)()
        with calling_back():
            status = lib.cb_session_embed(self._ptr(), arr, n, out, dim)
        self._finish(status)
        return array("f", out)

    def logits(self):
        """The last position's logits (a copy, array of n_vocab floats)."""
        data = POINTER(c_float)()
        n = c_size_t(0)
        check(lib.cb_session_logits(self._ptr(), byref(data), byref(n)))
        out = array("f")
        out.frombytes(ctypes.string_at(data, n.value * ctypes.sizeof(c_float)))
        return out

    def set_abort_callback(self, callback):
        """Asks `callback()` before every step of the forward passes and before
        each generated token; a true result stops the call with
        CancelledError.  It runs on the calling thread and must not use this
        session; typically it reads a flag (threading.Event().is_set) that
        another thread sets.  None removes it."""
        ptr = self._ptr()
        if callback is None:
            check(lib.cb_session_set_abort_callback(ptr, _native.AbortCallback(), None))
            self._abort = None
            return
        pending = self._pending
        c_callback = _native.AbortCallback(lambda _user: _asks_to_stop(pending, callback))
        check(lib.cb_session_set_abort_callback(ptr, c_callback, None))
        self._abort = c_callback

    def set_progress_callback(self, callback):
        """Tells `callback(stage, done, total)` how far a call on this session
        has come; `stage` is a ProgressStage: PREFILL counts tokens (after
        each batch of prefill(), embed(), a generation's prompt and a FULL
        RAG prefill), CHUNK the layers of a chunk's KV computed for a chunk
        cache, BLEND the layers of a RAG prefill's passes over reused chunk
        KV (two passes with the default selection).  A true result stops the
        call with CancelledError.  It runs on the calling thread and must not
        use this session.  None removes it."""
        ptr = self._ptr()
        if callback is None:
            check(lib.cb_session_set_progress_callback(ptr, _native.ProgressCallback(), None))
            self._progress = None
            return
        pending = self._pending

        def trampoline(stage, done, total, _user):
            return _asks_to_stop(pending, lambda: callback(ProgressStage(stage), done, total))

        c_callback = _native.ProgressCallback(trampoline)
        check(lib.cb_session_set_progress_callback(ptr, c_callback, None))
        self._progress = c_callback

    # --- generation
    def generate(self, prompt=None, max_tokens=256, *, on_text=None, stop=None,
                 stop_at_end_of_generation=True, temperature=None, top_k=None, top_p=None,
                 min_p=None, seed=None, repeat_penalty=None, repeat_last_n=None):
        """Appends `prompt` (None: continue from the context) and generates up
        to `max_tokens` tokens; returns their text.  Greedy unless
        `temperature` > 0.

        on_text(piece)  called with each new piece of text as it is generated
                        (whole characters only); a true result stops the
                        generation normally.  An exception it raises stops
                        it and is re-raised here.
        stop            a string or strings that end the generation (not
                        included in the text)
        The call's GenerateStats are left in `last_stats`.
        """
        tokens = self._tokens(prompt)
        go = _generate_options(max_tokens, stop, stop_at_end_of_generation, dict(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
            repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n))
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        parts = []
        pending = self._pending
        stopped = []

        def on_token(_token, piece, piece_len, _user):
            if _exiting.is_set():  # the interpreter is exiting: stop here, as on_text may
                stopped.append(True)
                return 1
            try:
                text = decoder.decode(ctypes.string_at(piece, piece_len) if piece_len else b"")
                if text:
                    parts.append(text)
                    if on_text is not None and on_text(text):
                        stopped.append(True)
                        return 1
                return 0
            except BaseException as e:  # noqa: B036 - re-raised after the call
                pending.append(e)
                return 1

        c_callback = _native.TokenCallback(on_token)
        arr, n = c_int32_array(tokens)
        stats = _native.new_stats(_native.GenerateStats)
        with calling_back():
            status = lib.cb_generate(self._ptr(), arr if n else None, n, byref(go), c_callback,
                                     None, byref(stats))
        if status in (Status.OK, Status.CANCELLED):
            self.last_stats = generate_stats(stats)
        if status == Status.CANCELLED and stopped and not pending:
            status = Status.OK  # on_text asked to stop: not an error
        self._finish(status)
        tail = decoder.decode(b"", final=True)  # an unfinished UTF-8 sequence at the end
        if tail:
            parts.append(tail)
            if on_text is not None:
                on_text(tail)
        return "".join(parts)

    def stream(self, prompt=None, max_tokens=256, **options):
        """generate() as an iterator of text pieces.  Generation runs on a
        worker thread; leaving the loop early stops it at the next token.
        Takes the options of generate() except on_text."""
        self._ptr()
        if "on_text" in options:
            raise TypeError("stream() takes no on_text: iterate over it instead")
        return self._stream_pieces(prompt, max_tokens, options)

    def _stream_pieces(self, prompt, max_tokens, options):
        pieces = queue.SimpleQueue()
        stop = threading.Event()
        done = object()

        def on_text(text):
            pieces.put(text)
            return stop.is_set()

        def work():
            try:
                self.generate(prompt, max_tokens, on_text=on_text, **options)
                pieces.put(done)
            except BaseException as e:  # noqa: B036 - handed to the consumer
                pieces.put(_Failure(e))

        worker = threading.Thread(target=work, name="cacheblend-stream", daemon=True)
        self._stream = (stop, worker)
        worker.start()
        try:
            while True:
                item = pieces.get()
                if item is done:
                    return
                if isinstance(item, _Failure):
                    raise item.error
                yield item
        finally:
            stop.set()
            worker.join()
            self._stream = None

    # --- retrieval-augmented requests
    def rag_prefill(self, chunks, question, cache=None, options=None):
        """Prefills this empty session with a RAG request: the chunks (texts),
        each reused from `cache` (a ChunkCache; computed and stored there when
        missing), then the question, as `options` (RagOptions) say.  `cache`
        may be None only with mode FULL.  Afterwards generate() (no prompt)
        answers.  Returns the RagStats (also left in `last_rag_stats`)."""
        texts = [c_string(c, "chunk") for c in chunks]
        arr = (c_char_p * max(len(texts), 1))(*texts)
        ro = rag_struct(options)
        stats = _native.new_stats(_native.RagStats)
        cache_ptr = cache._ptr() if cache is not None else None
        with calling_back():
            status = lib.cb_rag_prefill(self._ptr(), cache_ptr, arr, len(texts),
                                        c_string(question, "question"), byref(ro), byref(stats))
        self._finish(status)
        self.last_rag_stats = rag_stats(stats)
        return self.last_rag_stats

    def rag_generate(self, chunks, question, cache=None, options=None, max_tokens=256,
                     **generate_options):
        """Resets the session, runs rag_prefill(), then generate(); returns the
        answer.  Stats: `last_rag_stats` and `last_stats` (whose ttft_ms is the
        request's time to first token)."""
        self.reset()
        self.rag_prefill(chunks, question, cache, options)
        return self.generate(None, max_tokens, **generate_options)
