"""Python bindings for cacheblend-rt, over its C API (ctypes; no compiler needed).

    import cacheblend
    with cacheblend.Model("model.gguf", n_threads=2) as model, model.session() as s:
        print(s.generate("The capital of France is", max_tokens=8))

Classes: Model, Session, ChunkCache; options: RagOptions; stats: GenerateStats,
RagStats, ChunkCacheStats.  Every failed call raises cacheblend.Error (a
subclass per status code) carrying `status` and the library's `message`.
The C library is found as README.md describes; `library_path` says which
file was loaded.
"""
from ._native import lib as _lib
from ._native import library_path
from .chunk_cache import ChunkCache
from .errors import (BufferTooSmallError, CancelledError, ContextOverflowError, Error,
                     FormatError, InternalError, InvalidArgumentError, IoError,
                     OutOfMemoryError, Status, UnsupportedError)
from .model import Model
from .session import Session
from .types import (Activations, Backend, ChatTemplate, ChunkAdded, ChunkCacheStats, ChunkHead, Codec, GenerateStats, KvType, Mode,
                    ModelInfo, ProgressStage, RagOptions, RagStats, Select, StopReason, TierStats, mode_name,
                    select_name)

__version__ = "0.1.0"


def library_version():
    """The C library's version string."""
    return _lib.cb_version().decode()


__all__ = [
    "Activations", "Backend", "BufferTooSmallError", "ChatTemplate", "CancelledError", "ChunkAdded", "ChunkCache",
    "ChunkCacheStats", "ChunkHead", "Codec", "ContextOverflowError", "Error", "FormatError",
    "GenerateStats", "InternalError", "InvalidArgumentError", "IoError", "KvType", "Mode", "Model",
    "ModelInfo", "OutOfMemoryError", "ProgressStage", "RagOptions", "RagStats", "Select", "Session", "Status",
    "StopReason", "TierStats", "UnsupportedError", "library_path", "library_version", "mode_name",
    "select_name",
]
