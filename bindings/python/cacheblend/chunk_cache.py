"""ChunkCache: precomputed KV of text chunks, in RAM or in a directory."""
import os
from ctypes import byref, c_char, c_int32, c_size_t

from . import _native
from .errors import Closeable, check, closed_error
from .model import _sized
from .session import Session, calling_back
from .types import ChunkAdded, Codec, c_string, chunk_cache_stats, rag_struct, tier_stats
from ._native import lib

_STORE_OPTIONS = ("capacity_bytes", "codec", "read_bytes_per_sec", "busy_timeout_ms",
                  "assumed_read_bytes_per_sec", "ram_budget_bytes", "slow_dir",
                  "slow_read_bytes_per_sec", "redis_address", "redis_password",
                  "redis_username", "redis_timeout_ms", "placement_ratio")
_STRING_OPTIONS = ("slow_dir", "redis_address", "redis_password", "redis_username")


def _model_ptr(model):
    """The cb_model* of a Model, or of the model a Session runs."""
    if isinstance(model, Session):
        if model.closed:
            raise closed_error("Session")
        return model._shared.ptr
    return model._ptr()


class ChunkCache(Closeable):
    """A cache of chunks' KV, keyed by model, chunk head, tokens and namespace.

    ChunkCache()      in RAM (float32, grows until cleared)
    ChunkCache(path)  in directory `path` (created if needed), kept across
                      runs and shareable between processes; options:
      capacity_bytes  least recently used entries go beyond it [4 GiB]
      codec           Codec or name: "f16", "q8", "q4" [q8]
      read_bytes_per_sec, busy_timeout_ms, assumed_read_bytes_per_sec:
                      as cb_store_options in cacheblend.h
      storage tiers   ram_budget_bytes, slow_dir, slow_read_bytes_per_sec,
                      redis_address, redis_password, redis_username,
                      redis_timeout_ms, placement_ratio: as cb_store_options
    Safe to use from several threads at once; close() must not race with use.
    """

    def __init__(self, path=None, **store_options):
        self._handle = None
        unknown = set(store_options) - set(_STORE_OPTIONS)
        if unknown:
            raise TypeError(f"unknown store options: {', '.join(sorted(unknown))}")
        ptr = _native.ChunkCachePtr()
        if path is None:
            if store_options:
                raise TypeError("store options need a directory path")
            check(lib.cb_chunk_cache_create(byref(ptr)))
        else:
            opts = _native.new_options(_native.StoreOptions, lib.cb_store_options_init_sized)
            for name, value in store_options.items():
                if value is None:
                    continue
                if name == "codec":
                    value = int(Codec.coerce(value))
                elif name in _STRING_OPTIONS:
                    value = c_string(os.fsencode(value), name)
                setattr(opts, name, value)
            check(lib.cb_chunk_cache_open(c_string(os.fsencode(path), "path"), byref(opts),
                                          byref(ptr)))
        self._handle = ptr
        self._free = lib.cb_chunk_cache_free  # still reachable during interpreter shutdown
        self.path = None if path is None else os.fsdecode(path)

    # --- lifetime
    def close(self):
        """Frees the cache (idempotent); a directory cache first finishes its writes."""
        ptr, self._handle = getattr(self, "_handle", None), None
        if ptr:
            self._free(ptr)

    @property
    def closed(self):
        return self._handle is None

    def __repr__(self):
        where = "closed" if self.closed else (self.path or "in RAM")
        return f"<cacheblend.ChunkCache {where}>"

    def _ptr(self):
        if self._handle is None:
            raise closed_error("ChunkCache")
        return self._handle

    # --- entries
    def add(self, session, text, options=None):
        """Computes the KV of chunk `text` with `session` (which must be empty
        and is left empty) and stores it, unless it is already cached.  Only
        options.chunk_head, system_prompt and cache_namespace matter; use the
        same as for the requests.  Returns ChunkAdded(computed, n_tokens)."""
        ro = rag_struct(options)
        computed = c_int32(0)
        n_tokens = c_int32(0)
        with calling_back():
            status = lib.cb_chunk_cache_add(session._ptr(), self._ptr(), c_string(text, "chunk"),
                                            byref(ro), byref(computed), byref(n_tokens))
        session._finish(status)
        return ChunkAdded(bool(computed.value), n_tokens.value)

    def contains(self, model, text, options=None):
        """Whether a request by `model` (a Model or Session) with `options`
        would find chunk `text` here.  On a directory cache it counts as a
        lookup (a hit or a miss)."""
        ro = rag_struct(options)
        found = c_int32(0)
        check(lib.cb_chunk_cache_contains(_model_ptr(model), self._ptr(), c_string(text, "chunk"),
                                          byref(ro), byref(found)))
        return bool(found.value)

    def remove(self, model, text, options=None):
        """Removes chunk `text` as `model` and `options` key it; returns
        whether it was there."""
        ro = rag_struct(options)
        removed = c_int32(0)
        check(lib.cb_chunk_cache_remove(_model_ptr(model), self._ptr(), c_string(text, "chunk"),
                                        byref(ro), byref(removed)))
        return bool(removed.value)

    def clear(self):
        """Removes every entry this cache holds itself (RAM, flash, the slow
        directory); a Redis tier's shared values are left to the server."""
        check(lib.cb_chunk_cache_clear(self._ptr()))

    def flush(self):
        """Waits until queued write-backs are in the directory (no-op in RAM)."""
        check(lib.cb_chunk_cache_flush(self._ptr()))

    def stats(self):
        """ChunkCacheStats; hits, misses and the rest count on a directory cache only."""
        stats = _native.new_stats(_native.ChunkCacheStats)
        check(lib.cb_chunk_cache_get_stats(self._ptr(), byref(stats)))
        return chunk_cache_stats(stats)

    def open_report(self):
        """What the open found that a user should hear about, one line each:
        a store opened read-only and why, a damaged index rebuilt empty and
        why, quarantined chunks and how to get them back, tiers skipped.  Empty when there was nothing."""
        buf, n = _sized(lambda b, cap, pn: lib.cb_chunk_cache_open_report(self._ptr(), b, cap, pn),
                        c_char, 1024)
        return bytes(buf[:n]).decode("utf-8", "replace")

    def tier_stats(self):
        """[TierStats], fastest first: the storage tiers' counters (one, "flash",
        for a directory cache without tiers; none in RAM)."""
        n = c_size_t(0)
        check(lib.cb_chunk_cache_n_tiers(self._ptr(), byref(n)))
        out = []
        for i in range(n.value):
            stats = _native.new_stats(_native.TierStats)
            check(lib.cb_chunk_cache_get_tier_stats(self._ptr(), i, byref(stats)))
            out.append(tier_stats(stats))
        return out
