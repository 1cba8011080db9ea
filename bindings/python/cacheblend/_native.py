"""The C library: finding and loading it, its structs and its prototypes.

Everything here mirrors abi/include/cacheblend/cacheblend.h field for field
and argument for argument; a mismatch would corrupt memory silently, so
keep the two in step.
"""
import ctypes
import ctypes.util
import os
import sys
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int,
                    c_int32, c_int64, c_size_t, c_uint32, c_uint64, c_void_p)
from pathlib import Path

ENV_VAR = "CACHEBLEND_LIBRARY"
# The bindings follow header version 0.1.x; the library accepts the struct
# sizes of earlier headers, so any 0.x library from 0.1.0 on will do.
MIN_VERSION_NUMBER = 100

c_enum = c_int  # a C enum argument or field: int-sized with the compilers we support


# --- Opaque handles: distinct pointer types, so that ctypes refuses a
# session where a model is expected.
class _CModel(Structure):
    pass


class _CSession(Structure):
    pass


class _CChunkCache(Structure):
    pass


ModelPtr = POINTER(_CModel)
SessionPtr = POINTER(_CSession)
ChunkCachePtr = POINTER(_CChunkCache)


# --- Structs, in header order.
class ModelOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("n_threads", c_int32), ("backend", c_enum),
                ("device", c_int32), ("chat_template", c_enum)]


class ModelInfo(Structure):
    _fields_ = [("struct_size", c_size_t), ("n_layer", c_int32), ("n_embd", c_int32),
                ("n_head", c_int32), ("n_head_kv", c_int32), ("head_dim", c_int32),
                ("n_ff", c_int32), ("n_vocab", c_int32), ("n_ctx_train", c_int32),
                ("file_size", c_uint64), ("name", c_char_p), ("architecture", c_char_p),
                ("backend", c_char_p), ("kernels", c_char_p), ("chat_template", c_char_p)]


class ChatMessage(Structure):
    _fields_ = [("role", c_char_p), ("content", c_char_p)]


class SessionOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("n_ctx", c_int32), ("n_threads", c_int32),
                ("n_batch", c_int32), ("reserved0", c_int32), ("kv_type", c_int32),
                ("reserved1", c_int32), ("activations", c_int32),
                ("resident_kv_bytes", c_int64)]


class SamplingOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("temperature", c_float), ("top_k", c_int32),
                ("top_p", c_float), ("seed", c_uint64), ("min_p", c_float),
                ("repeat_penalty", c_float), ("repeat_last_n", c_int32)]


class GenerateOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("max_tokens", c_int32),
                ("stop_at_end_of_generation", c_int32), ("sampling", POINTER(SamplingOptions)),
                ("stop_strings", POINTER(c_char_p)), ("n_stop_strings", c_size_t)]


class GenerateStats(Structure):
    _fields_ = [("struct_size", c_size_t), ("n_prompt", c_int32), ("n_generated", c_int32),
                ("ttft_ms", c_double), ("prefill_ms", c_double), ("decode_ms", c_double),
                ("tok_s", c_double), ("stop_reason", c_enum)]


class StoreOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("capacity_bytes", c_uint64), ("codec", c_enum),
                ("read_bytes_per_sec", c_uint64), ("busy_timeout_ms", c_int32),
                ("assumed_read_bytes_per_sec", c_double), ("ram_budget_bytes", c_uint64),
                ("slow_dir", c_char_p), ("slow_read_bytes_per_sec", c_uint64),
                ("redis_address", c_char_p), ("redis_password", c_char_p),
                ("redis_username", c_char_p), ("redis_timeout_ms", c_int32),
                ("placement_ratio", c_float)]


class ChunkCacheStats(Structure):
    _fields_ = [("struct_size", c_size_t), ("n_entries", c_uint64), ("bytes", c_uint64),
                ("hits", c_uint64), ("misses", c_uint64), ("evictions", c_uint64),
                ("corrupt_drops", c_uint64), ("bytes_read", c_uint64), ("quarantined", c_uint64),
                ("unavailable_tiers", c_uint32), ("read_only", c_int32)]


class TierStats(Structure):
    _fields_ = [("struct_size", c_size_t), ("name", c_char_p), ("hits", c_uint64),
                ("misses", c_uint64), ("bytes_read", c_uint64), ("read_failures", c_uint64),
                ("placed", c_uint64), ("promoted_in", c_uint64), ("demoted_in", c_uint64),
                ("failures", c_uint64), ("budget_bytes", c_uint64)]


class CheckLayer(Structure):
    _fields_ = [("layer", c_int32), ("ratio", c_float)]


class RagOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("mode", c_enum), ("ratio", c_float),
                ("schedule", POINTER(CheckLayer)), ("n_schedule", c_size_t),
                ("chunk_head", c_enum), ("system_prompt", c_char_p),
                ("cache_namespace", c_char_p), ("pipeline", c_int32), ("auto_ratio", c_int32),
                ("select", c_enum), ("sink_tokens", c_int32), ("seed", c_uint64),
                ("guard_share", c_float), ("guard_max_ratio", c_float),
                ("chunk_shift", c_int32),
                ("shift_probes", c_float), ("shift_span", c_int32),
                ("fetch_threads", c_int32)]


class RagStats(Structure):
    _fields_ = [("struct_size", c_size_t), ("n_tokens", c_int32), ("n_reused", c_int32),
                ("cache_hits", c_int32), ("cache_misses", c_int32),
                ("chunks_recomputed", c_int32), ("precompute_ms", c_double),
                ("fuse_ms", c_double), ("total_ms", c_double), ("computed_fraction", c_double),
                ("ratio", c_float), ("pipelined", c_int32), ("bytes_read", c_uint64),
                ("load_ms", c_double), ("blocked_ms", c_double), ("recompute_ms", c_double),
                ("upload_ms", c_double), ("selected_share", c_double),
                ("guard_raised", c_int32), ("fetch_ms", c_double),
                ("resident_hits", c_int32), ("resident_bytes", c_uint64)]


# `piece` is POINTER(c_char), not c_char_p: it is piece_len bytes that need
# not be NUL-free, and c_char_p would cut it at the first NUL.
TokenCallback = CFUNCTYPE(c_int, c_int32, POINTER(c_char), c_size_t, c_void_p)
AbortCallback = CFUNCTYPE(c_int, c_void_p)
ProgressCallback = CFUNCTYPE(c_int, c_int, c_int32, c_int32, c_void_p)

_I32P = POINTER(c_int32)
_SIZEP = POINTER(c_size_t)
_BUF = POINTER(c_char)

# name: (restype, argtypes).  The *_init_sized functions take void*: they are
# given a struct of these bindings with its size (see new_options).
_PROTOTYPES = {
    "cb_version": (c_char_p, []),
    "cb_version_number": (c_int, []),
    "cb_status_string": (c_char_p, [c_enum]),
    "cb_last_error": (c_char_p, []),
    "cb_model_options_init_sized": (None, [c_void_p, c_size_t]),
    "cb_model_load": (c_enum, [c_char_p, POINTER(ModelOptions), POINTER(ModelPtr)]),
    "cb_model_free": (None, [ModelPtr]),
    "cb_model_get_info": (c_enum, [ModelPtr, POINTER(ModelInfo)]),
    "cb_tokenize": (c_enum, [ModelPtr, c_char_p, c_size_t, c_int, c_int, _I32P, c_size_t,
                             _SIZEP]),
    "cb_detokenize": (c_enum, [ModelPtr, _I32P, c_size_t, c_int, _BUF, c_size_t, _SIZEP]),
    "cb_token_to_piece": (c_enum, [ModelPtr, c_int32, c_int, _BUF, c_size_t, _SIZEP]),
    "cb_token_bos": (c_int32, [ModelPtr]),
    "cb_token_eos": (c_int32, [ModelPtr]),
    "cb_token_is_end_of_generation": (c_int, [ModelPtr, c_int32]),
    "cb_chat_format": (c_enum, [ModelPtr, POINTER(ChatMessage), c_size_t, c_int, _BUF,
                                c_size_t, _SIZEP]),
    "cb_session_options_init_sized": (None, [c_void_p, c_size_t]),
    "cb_session_create": (c_enum, [ModelPtr, POINTER(SessionOptions), POINTER(SessionPtr)]),
    "cb_session_free": (None, [SessionPtr]),
    "cb_session_prefill": (c_enum, [SessionPtr, _I32P, c_size_t]),
    "cb_session_n_past": (c_int32, [SessionPtr]),
    "cb_session_n_ctx": (c_int32, [SessionPtr]),
    "cb_session_kv_bytes": (c_uint64, [SessionPtr]),
    "cb_session_reset": (c_enum, [SessionPtr]),
    "cb_session_embed": (c_enum, [SessionPtr, _I32P, c_size_t, POINTER(c_float), c_size_t]),
    "cb_session_set_abort_callback": (c_enum, [SessionPtr, AbortCallback, c_void_p]),
    "cb_session_set_progress_callback": (c_enum, [SessionPtr, ProgressCallback, c_void_p]),
    "cb_session_logits": (c_enum, [SessionPtr, POINTER(POINTER(c_float)), _SIZEP]),
    "cb_sampling_options_init_sized": (None, [c_void_p, c_size_t]),
    "cb_generate_options_init_sized": (None, [c_void_p, c_size_t]),
    "cb_generate": (c_enum, [SessionPtr, _I32P, c_size_t, POINTER(GenerateOptions),
                             TokenCallback, c_void_p, POINTER(GenerateStats)]),
    "cb_chunk_cache_create": (c_enum, [POINTER(ChunkCachePtr)]),
    "cb_chunk_cache_free": (None, [ChunkCachePtr]),
    "cb_store_options_init_sized": (None, [c_void_p, c_size_t]),
    "cb_chunk_cache_open": (c_enum, [c_char_p, POINTER(StoreOptions), POINTER(ChunkCachePtr)]),
    "cb_chunk_cache_flush": (c_enum, [ChunkCachePtr]),
    "cb_chunk_cache_get_stats": (c_enum, [ChunkCachePtr, POINTER(ChunkCacheStats)]),
    "cb_chunk_cache_open_report": (c_enum, [ChunkCachePtr, _BUF, c_size_t, _SIZEP]),
    "cb_chunk_cache_clear": (c_enum, [ChunkCachePtr]),
    "cb_chunk_cache_n_tiers": (c_enum, [ChunkCachePtr, _SIZEP]),
    "cb_chunk_cache_get_tier_stats": (c_enum, [ChunkCachePtr, c_size_t, POINTER(TierStats)]),
    "cb_mode_name": (c_char_p, [c_enum]),
    "cb_select_name": (c_char_p, [c_enum]),
    "cb_rag_options_init_sized": (None, [c_void_p, c_size_t]),
    "cb_rag_prefill": (c_enum, [SessionPtr, ChunkCachePtr, POINTER(c_char_p), c_size_t,
                                c_char_p, POINTER(RagOptions), POINTER(RagStats)]),
    "cb_chunk_cache_add": (c_enum, [SessionPtr, ChunkCachePtr, c_char_p, POINTER(RagOptions),
                                    _I32P, _I32P]),
    "cb_chunk_cache_contains": (c_enum, [ModelPtr, ChunkCachePtr, c_char_p,
                                         POINTER(RagOptions), _I32P]),
    "cb_chunk_cache_remove": (c_enum, [ModelPtr, ChunkCachePtr, c_char_p, POINTER(RagOptions),
                                       _I32P]),
}
# The stats and info *_init_sized functions only set struct_size and zero the
# rest, which new_stats does without a call.


def _file_names():
    if sys.platform == "darwin":
        return ["libcacheblend.0.dylib", "libcacheblend.dylib"]
    if sys.platform == "win32":
        return ["cacheblend.dll"]
    return ["libcacheblend.so.0"]


def _checkout_root():
    """The repository root when this package is used from a source checkout."""
    root = Path(__file__).resolve().parents[3]
    if (root / "abi" / "include" / "cacheblend" / "cacheblend.h").is_file():
        return root
    return None


def _candidates():
    """Where to look, in order (lazily: find_library may run a subprocess)."""
    env = os.environ.get(ENV_VAR)
    if env:
        # An explicit choice is the only one: falling back to another copy
        # would hide a typo.
        yield os.path.abspath(env), ENV_VAR
        return
    # A copy bundled into the package at install time (setup.py).
    for name in _file_names():
        bundled = Path(__file__).resolve().parent / name
        if bundled.is_file():
            yield str(bundled), "bundled with the package"
    for name in _file_names():
        yield name, "the loader's search path"
    found = ctypes.util.find_library("cacheblend")
    if found:
        yield found, "ctypes.util.find_library"
    # Installed prefixes the loader may not search (no ldconfig run since
    # `make install`, or installed into this Python's own prefix).
    for prefix in dict.fromkeys([sys.prefix, "/usr/local"]):
        for name in _file_names():
            yield str(Path(prefix) / "lib" / name), "an installed prefix"
    root = _checkout_root()
    if root is not None:
        for name in _file_names():
            yield str(root / "build" / "lib" / name), "the source checkout's build"


def _load():
    tried = []
    for path, how in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"  {path} ({how}): {e}")
    raise ImportError(
        "cacheblend: cannot load the cacheblend C library.  Tried:\n" + "\n".join(tried) +
        f"\nBuild the library (`make build` in the repository) and reinstall the package "
        f"(pip install ./bindings/python bundles it), or set {ENV_VAR} to the full path of "
        "libcacheblend.so.0, or put its directory on LD_LIBRARY_PATH.")


def _bind(cdll, path):
    for name, (restype, argtypes) in _PROTOTYPES.items():
        try:
            fn = getattr(cdll, name)
        except AttributeError:
            raise ImportError(f"cacheblend: {path} has no {name}: the library is older than "
                              "these bindings") from None
        fn.restype = restype
        fn.argtypes = argtypes
    number = cdll.cb_version_number()
    if number // 10000 != MIN_VERSION_NUMBER // 10000 or number < MIN_VERSION_NUMBER:
        raise ImportError(f"cacheblend: {path} is version {cdll.cb_version().decode()}; these "
                          "bindings need 0.1.0 or a later 0.x")
    return cdll


_cdll, library_path = _load()
lib = _bind(_cdll, library_path)

def new_options(cls, init_sized):
    """A `cls` struct holding the library's defaults, sized for these bindings:
    `init_sized` (a cb_*_init_sized) writes no more than sizeof(cls)."""
    size = ctypes.sizeof(cls)
    opts = cls()
    init_sized(ctypes.byref(opts), size)
    if opts.struct_size < size:
        raise RuntimeError(f"cacheblend: the library's {cls.__name__} ({opts.struct_size} bytes) "
                           f"is older than these bindings' ({size} bytes)")
    return opts


def new_stats(cls):
    """A zeroed `cls` struct whose struct_size is set, as the *_init functions do."""
    stats = cls()
    stats.struct_size = ctypes.sizeof(cls)
    return stats
