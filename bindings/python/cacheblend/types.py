"""Enums, option and stats dataclasses, and their conversion to C structs."""
import ctypes
import enum
from dataclasses import dataclass, fields
from typing import Optional, Sequence, Tuple

from . import _native
from ._native import lib


class _NamedEnum(enum.IntEnum):
    @classmethod
    def coerce(cls, value):
        """Accepts a member, its number or its name in any case ("blend")."""
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                names = ", ".join(m.name.lower() for m in cls)
                raise ValueError(f"unknown {cls.__name__} {value!r}; one of: {names}") from None
        return cls(value)


class Backend(_NamedEnum):
    AUTO = 0
    CPU = 1
    CUDA = 2


class ChatTemplate(_NamedEnum):
    AUTO = 0
    CHATML = 1
    LLAMA3 = 2
    GEMMA = 3


class KvType(_NamedEnum):
    """The element type of a session's KV cache: F16 (default) halves its
    memory; F32 keeps it exact."""
    F16 = 0
    F32 = 1


class Activations(_NamedEnum):
    """How a session's weight products treat the activations: INT8 (default)
    quantizes them to int8 as llama.cpp does (2-3x faster prefill on x86 CPUs;
    logits ~1e-2 from the f32 path's); F32 keeps them exact."""
    INT8 = 0
    F32 = 1


class StopReason(_NamedEnum):
    NONE = 0
    MAX_TOKENS = 1
    END_OF_GENERATION = 2
    CONTEXT_FULL = 3
    CANCELLED = 4
    STRING = 5


class Codec(_NamedEnum):
    F16 = 1
    Q8 = 2
    Q4 = 3


class Mode(_NamedEnum):
    FULL = 0
    PREFIX = 1
    REUSE = 2
    BLEND = 3


class ChunkHead(_NamedEnum):
    PROMPT = 0
    NONE = 1


class ProgressStage(_NamedEnum):
    """What a progress report counts (Session.set_progress_callback)."""
    PREFILL = 0  # tokens through the model
    CHUNK = 1  # layers of a chunk's KV computed for a chunk cache
    BLEND = 2  # layers of a RAG prefill's passes over reused chunk KV


class Select(_NamedEnum):
    DEFAULT = 0
    HKVD = 1
    HKVD_KV = 2
    ATTENTION = 3
    LOOKAHEAD = 4
    # Study-only baselines and oracles (the C API's experimental header):
    # no compatibility promise.
    RANDOM = 5
    ORACLE = 6
    ORACLE_KL = 7


def mode_name(mode):
    """The library's name for a Mode ("blend", ...)."""
    return lib.cb_mode_name(int(Mode.coerce(mode))).decode()


def select_name(select):
    """The library's name for a Select policy; DEFAULT names the policy it stands for."""
    return lib.cb_select_name(int(Select.coerce(select))).decode()


def _from_struct(cls, struct, **converters):
    values = {}
    for f in fields(cls):
        value = getattr(struct, f.name)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        values[f.name] = converters[f.name](value) if f.name in converters else value
    return cls(**values)


@dataclass(frozen=True)
class ModelInfo:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    file_size: int
    name: str
    architecture: str
    backend: str  # "cpu" or "cuda"
    kernels: str  # CPU kernel level in use ("avx2", ...) or "cuda"
    chat_template: str  # "chatml", "llama3", "gemma"; "" when of no known family


@dataclass(frozen=True)
class GenerateStats:
    n_prompt: int
    n_generated: int
    ttft_ms: float
    prefill_ms: float
    decode_ms: float
    tok_s: float
    stop_reason: StopReason


@dataclass(frozen=True)
class RagStats:
    n_tokens: int
    n_reused: int
    cache_hits: int
    cache_misses: int
    chunks_recomputed: int
    precompute_ms: float
    fuse_ms: float
    total_ms: float
    computed_fraction: float
    ratio: float
    pipelined: bool
    bytes_read: int
    load_ms: float
    blocked_ms: float
    recompute_ms: float
    upload_ms: float
    selected_share: float
    guard_raised: bool
    fetch_ms: float
    resident_hits: int  # of cache_hits, chunks copied from the session's GPU memory
    resident_bytes: int


@dataclass(frozen=True)
class ChunkCacheStats:
    n_entries: int
    bytes: int
    hits: int
    misses: int
    evictions: int
    corrupt_drops: int
    bytes_read: int
    quarantined: int  # chunks the open moved to DIR/quarantine/ (see ChunkCache.open_report)
    unavailable_tiers: int  # configured tiers the open skipped
    read_only: bool  # DIR could not be written and was opened read-only


@dataclass(frozen=True)
class TierStats:
    """One storage tier's counters (cb_tier_stats)."""
    name: str
    hits: int
    misses: int
    bytes_read: int
    read_failures: int
    placed: int
    promoted_in: int
    demoted_in: int
    failures: int
    budget_bytes: int


@dataclass(frozen=True)
class ChunkAdded:
    computed: bool  # False: the chunk was already cached
    n_tokens: int


def model_info(struct):
    return _from_struct(ModelInfo, struct)


def generate_stats(struct):
    return _from_struct(GenerateStats, struct, stop_reason=StopReason)


def rag_stats(struct):
    return _from_struct(RagStats, struct, pipelined=bool, guard_raised=bool)


def chunk_cache_stats(struct):
    return _from_struct(ChunkCacheStats, struct, read_only=bool)


def tier_stats(struct):
    return _from_struct(TierStats, struct)


@dataclass
class RagOptions:
    """Options of a RAG request (cb_rag_options).  None keeps the library's
    default, shown in brackets.

    mode             Mode or name [BLEND]
    ratio            recompute ratio in [0, 1] for BLEND [0.2]
    schedule         check layers [(layer, ratio), ...], layers increasing,
                     ratios not increasing; replaces `ratio` [none]
    chunk_head       ChunkHead: what chunks are precomputed after [PROMPT]
    system_prompt    the system turn ["Answer the question using the documents."]
    cache_namespace  keeps apps' chunks apart [the default namespace]
    pipeline         load layer i+1 while layer i computes [True]
    auto_ratio       on a directory cache, pick the ratio so recompute hides
                     behind loading, never below `ratio` [False]
    select           Select policy ranking the tokens to recompute [LOOKAHEAD]
    sink_tokens      first tokens of every chunk always recomputed [0]
    seed             seed of Select.RANDOM [0]
    guard_share      quality guard: raise the ratio until the kept tokens hold
                     this share of the policy's score; 0 is off [0]
    guard_max_ratio  the guard's ceiling on the ratio [0.5]
    chunk_shift      BLEND shifts each chunk's tokens that are not recomputed by
                     the mean correction of its tokens that are [True]
    shift_probes     with chunk_shift, the share of the recomputed count given
                     to evenly spread tokens that measure that correction [0.25]
    shift_span       with chunk_shift, spans of about this many tokens: a token
                     takes half its chunk's correction and half its span's;
                     0 is the chunk's alone [128]
    fetch_threads    threads reading a layer of the cached chunks at once,
                     in [0, 64]; 0 picks: 1 on the CPU, up to 4 on a
                     discrete GPU [0]

    chunk_head, system_prompt and cache_namespace are part of a chunk's cache
    key: pass the same values when adding, looking up and answering.
    """
    mode: Optional[Mode] = None
    ratio: Optional[float] = None
    schedule: Optional[Sequence[Tuple[int, float]]] = None
    chunk_head: Optional[ChunkHead] = None
    system_prompt: Optional[str] = None
    cache_namespace: Optional[str] = None
    pipeline: Optional[bool] = None
    auto_ratio: Optional[bool] = None
    select: Optional[Select] = None
    sink_tokens: Optional[int] = None
    seed: Optional[int] = None
    guard_share: Optional[float] = None
    guard_max_ratio: Optional[float] = None
    chunk_shift: Optional[bool] = None
    shift_probes: Optional[float] = None
    shift_span: Optional[int] = None
    fetch_threads: Optional[int] = None

    _ENUMS = {"mode": Mode, "chunk_head": ChunkHead, "select": Select}

    def to_struct(self):
        """The C struct.  It references the strings and the schedule array it
        was given (ctypes keeps them alive with it), so keep it for the call."""
        s = _native.new_options(_native.RagOptions, lib.cb_rag_options_init_sized)
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if f.name in self._ENUMS:
                value = int(self._ENUMS[f.name].coerce(value))
            elif f.name in ("system_prompt", "cache_namespace"):
                value = c_string(value, f.name)
            elif f.name in ("pipeline", "auto_ratio", "chunk_shift"):
                value = int(bool(value))
            elif f.name == "schedule":
                layers = [_native.CheckLayer(int(layer), float(ratio)) for layer, ratio in value]
                s.schedule = (_native.CheckLayer * len(layers))(*layers) if layers else None
                s.n_schedule = len(layers)
                continue
            setattr(s, f.name, value)
        return s


def rag_struct(options):
    return (options if options is not None else RagOptions()).to_struct()


def c_string(text, what="text"):
    """UTF-8 bytes for a NUL-terminated C string parameter (bytes pass as they are)."""
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    if b"\0" in data:
        raise ValueError(f"{what} contains a NUL character, which would end it early in C")
    return data


def c_int32_array(values):
    values = list(values)
    return (ctypes.c_int32 * len(values))(*values), len(values)
