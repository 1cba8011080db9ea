"""Status codes and the exceptions raised for them."""
import enum

from ._native import lib


class Status(enum.IntEnum):
    """cb_status."""
    OK = 0
    INVALID_ARGUMENT = 1
    IO = 2
    FORMAT = 3
    UNSUPPORTED = 4
    OUT_OF_MEMORY = 5
    CONTEXT_OVERFLOW = 6
    CANCELLED = 7
    BUFFER_TOO_SMALL = 8
    INTERNAL = 9


class Error(Exception):
    """A call into the library failed.

    `status` is the Status code, `message` the library's explanation
    (cb_last_error), and str(error) reads "<status text>: <message>".
    """

    def __init__(self, status, message):
        try:
            status = Status(status)
        except ValueError:
            pass  # a code newer than these bindings: keep the number
        self.status = status
        self.message = message
        text = lib.cb_status_string(int(status)).decode("utf-8", "replace")
        super().__init__(f"{text}: {message}" if message else text)


class InvalidArgumentError(Error, ValueError):
    """Bad arguments or options, a handle that is not live, a closed object."""


class IoError(Error):
    """A file could not be opened, read, written or mapped."""


class FormatError(Error):
    """A malformed model file or cache entry."""


class UnsupportedError(Error):
    """Well-formed but not supported (architecture, tensor type, backend)."""


class OutOfMemoryError(Error):
    """An allocation, or starting a thread, failed."""


class ContextOverflowError(Error):
    """The tokens do not fit in the session's context."""


class CancelledError(Error):
    """An abort callback (or freeing the session from a callback) stopped the call."""


class BufferTooSmallError(Error):
    """Reported by the C API's size-query pattern; the bindings retry, so rarely seen."""


class InternalError(Error):
    """A bug in the library."""


_CLASSES = {
    Status.INVALID_ARGUMENT: InvalidArgumentError,
    Status.IO: IoError,
    Status.FORMAT: FormatError,
    Status.UNSUPPORTED: UnsupportedError,
    Status.OUT_OF_MEMORY: OutOfMemoryError,
    Status.CONTEXT_OVERFLOW: ContextOverflowError,
    Status.CANCELLED: CancelledError,
    Status.BUFFER_TOO_SMALL: BufferTooSmallError,
    Status.INTERNAL: InternalError,
}


# What a Python caller called, for the C function a message starts with
# ("cb_session_reset: ..." reads "Session.reset(): ...").
_PYTHON_NAMES = {
    "cb_model_load": "Model()",
    "cb_model_get_info": "Model()",
    "cb_tokenize": "Model.tokenize()",
    "cb_detokenize": "Model.detokenize()",
    "cb_token_to_piece": "Model.token_to_piece()",
    "cb_chat_format": "Model.chat_format()",
    "cb_session_create": "Model.session()",
    "cb_session_reset": "Session.reset()",
    "cb_session_embed": "Session.embed()",
    "cb_session_prefill": "Session.prefill()",
    "cb_session_logits": "Session.logits()",
    "cb_session_set_abort_callback": "Session.set_abort_callback()",
    "cb_session_set_progress_callback": "Session.set_progress_callback()",
    "cb_generate": "Session.generate()",
    "cb_rag_prefill": "Session.rag_prefill()",
    "cb_chunk_cache_create": "ChunkCache()",
    "cb_chunk_cache_open": "ChunkCache()",
    "cb_chunk_cache_add": "ChunkCache.add()",
    "cb_chunk_cache_contains": "ChunkCache.contains()",
    "cb_chunk_cache_remove": "ChunkCache.remove()",
    "cb_chunk_cache_clear": "ChunkCache.clear()",
    "cb_chunk_cache_flush": "ChunkCache.flush()",
    "cb_chunk_cache_get_stats": "ChunkCache.stats()",
    "cb_chunk_cache_open_report": "ChunkCache.open_report()",
    "cb_chunk_cache_n_tiers": "ChunkCache.tier_stats()",
    "cb_chunk_cache_get_tier_stats": "ChunkCache.tier_stats()",
}


def python_message(message):
    """The library's message with its leading C function name, if it has one,
    spelled as the Python call that reached it."""
    name, sep, rest = message.partition(": ")
    if sep and name in _PYTHON_NAMES:
        return f"{_PYTHON_NAMES[name]}: {rest}"
    return message


def error_for(status):
    """The exception for `status` (None for OK), with the calling thread's
    cb_last_error (its C function named as the Python call).  Call it right
    after the failing call, on the same thread: the next call into the
    library replaces the message."""
    if status == Status.OK:
        return None
    message = python_message(lib.cb_last_error().decode("utf-8", "replace"))
    return _CLASSES.get(status, Error)(status, message)


def check(status):
    """Raises the exception for a failed status."""
    err = error_for(status)
    if err is not None:
        raise err


def closed_error(what):
    return InvalidArgumentError(Status.INVALID_ARGUMENT, f"this {what} is closed")


class Closeable:
    """close() is idempotent; `with` closes, and so does garbage collection."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
