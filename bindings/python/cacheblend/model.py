"""Model: a loaded GGUF model, its tokenizer and chat template."""
import os
import threading
from ctypes import byref, c_char, c_int32, c_size_t

from . import _native
from .errors import Closeable, Status, check, closed_error
from .types import Backend, ChatTemplate, c_int32_array, c_string, model_info
from ._native import lib


class _SharedModel:
    """One cb_model* shared by a Model and its Sessions.

    The C library keeps a model's memory alive for its sessions, but its
    handle dies at cb_model_free.  Sessions still need the handle to turn
    text into tokens, so it is freed when the Model and every Session made
    from it are closed.
    """

    def __init__(self, ptr):
        self.ptr = ptr
        self._users = 1
        self._lock = threading.Lock()
        self._free = lib.cb_model_free  # still reachable during interpreter shutdown

    def acquire(self):
        with self._lock:
            self._users += 1

    def release(self):
        with self._lock:
            self._users -= 1
            if self._users > 0 or not self.ptr:
                return
            ptr, self.ptr = self.ptr, None
        self._free(ptr)


def _sized(call, ctype, capacity):
    """Runs a C call that fills a caller buffer (the size-query pattern):
    `call(buf, capacity, byref(n))`, retried once with the reported size
    when the first guess is too small.  Returns (buf, n)."""
    n = c_size_t(0)
    for _ in range(2):
        buf = (ctype * capacity)()
        status = call(buf, capacity, byref(n))
        if status != Status.BUFFER_TOO_SMALL:
            break
        capacity = n.value + 1  # +1: text buffers need room for the NUL
    check(status)
    return buf, n.value


class Model(Closeable):
    """A GGUF model loaded from `path` (memory-mapped: the file must not change
    while it is loaded).

    n_threads  default compute threads of its sessions; 0: all CPU cores
    backend    Backend or name: "auto" (CUDA when built with it and a GPU is
               present, else CPU), "cpu", "cuda"
    device     the CUDA device for "cuda" and "auto"
    chat_template  ChatTemplate or name: "auto" (the family the model's
               template names), "chatml", "llama3", "gemma"

    Use it as a context manager, or call close(); sessions made from it keep
    working after it is closed.
    """

    def __init__(self, path, n_threads=None, backend=None, device=None, chat_template=None):
        self._shared = None
        opts = _native.new_options(_native.ModelOptions, lib.cb_model_options_init_sized)
        if n_threads is not None:
            opts.n_threads = n_threads
        if backend is not None:
            opts.backend = int(Backend.coerce(backend))
        if device is not None:
            opts.device = device
        if chat_template is not None:
            opts.chat_template = int(ChatTemplate.coerce(chat_template))
        ptr = _native.ModelPtr()
        check(lib.cb_model_load(c_string(os.fsencode(path), "path"), byref(opts), byref(ptr)))
        self._shared = _SharedModel(ptr)
        self.path = os.fsdecode(path)
        info = _native.new_stats(_native.ModelInfo)
        check(lib.cb_model_get_info(ptr, byref(info)))
        # Copied now: the C strings die with the handle.
        self.info = model_info(info)

    # --- lifetime
    def close(self):
        """Releases the model (idempotent).  Its sessions keep working."""
        shared, self._shared = getattr(self, "_shared", None), None
        if shared is not None:
            shared.release()

    @property
    def closed(self):
        return self._shared is None

    def __repr__(self):
        state = "closed" if self.closed else f"{self.info.name}, {self.info.backend}"
        return f"<cacheblend.Model {state}>"

    def _ptr(self):
        if self._shared is None:
            raise closed_error("Model")
        return self._shared.ptr

    # --- sessions
    def session(self, **options):
        """A new Session on this model; see Session for the options."""
        from .session import Session
        return Session(self, **options)

    # --- tokens and text
    def tokenize(self, text, add_special=True, parse_special=False):
        """Token ids of `text` (str, or bytes taken as they are).

        add_special    add BOS/EOS as the model's metadata says
        parse_special  turn control-token text such as "<|im_start|>" into its
                       token (for chat-formatted text)
        """
        return tokenize(self._ptr(), text, add_special, parse_special)

    def detokenize(self, tokens, render_special=False):
        """The text of `tokens` (bytes that are not valid UTF-8 become U+FFFD)."""
        return self.detokenize_bytes(tokens, render_special).decode("utf-8", "replace")

    def detokenize_bytes(self, tokens, render_special=False):
        ptr = self._ptr()
        arr, n = c_int32_array(tokens)
        buf, length = _sized(lambda b, cap, out: lib.cb_detokenize(
            ptr, arr, n, int(render_special), b, cap, out), c_char, 4 * n + 16)
        return buf.raw[:length]

    def token_to_piece(self, token, render_special=False):
        """The bytes of one token (possibly part of a UTF-8 sequence)."""
        ptr = self._ptr()
        buf, length = _sized(lambda b, cap, out: lib.cb_token_to_piece(
            ptr, token, int(render_special), b, cap, out), c_char, 64)
        return buf.raw[:length]

    @property
    def bos(self):
        """The BOS token id, or None."""
        token = lib.cb_token_bos(self._ptr())
        return None if token < 0 else token

    @property
    def eos(self):
        """The EOS token id, or None."""
        token = lib.cb_token_eos(self._ptr())
        return None if token < 0 else token

    def is_end_of_generation(self, token):
        return bool(lib.cb_token_is_end_of_generation(self._ptr(), token))

    def chat_format(self, messages, add_assistant_header=True):
        """Formats a conversation with the model's chat template.

        messages: (role, content) pairs or {"role": ..., "content": ...} dicts.
        The result is meant for Session.generate (which parses control tokens).
        """
        ptr = self._ptr()
        pairs = [(m["role"], m["content"]) if isinstance(m, dict) else m for m in messages]
        arr = (_native.ChatMessage * max(len(pairs), 1))()
        for i, (role, content) in enumerate(pairs):
            arr[i].role = c_string(role, "role")
            arr[i].content = c_string(content, "content")
        guess = sum(len(arr[i].content) + 32 for i in range(len(pairs))) + 32
        buf, length = _sized(lambda b, cap, out: lib.cb_chat_format(
            ptr, arr, len(pairs), int(add_assistant_header), b, cap, out), c_char, guess)
        return buf.raw[:length].decode("utf-8", "replace")


def tokenize(ptr, text, add_special, parse_special):
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    buf, n = _sized(lambda b, cap, out: lib.cb_tokenize(
        ptr, data, len(data), int(add_special), int(parse_special), b, cap, out),
        c_int32, len(data) + 8)
    return list(buf[:n])
