#!/usr/bin/env python3
"""rag_assistant with storage tiers, end to end, over a real redis-server.

  test_rag_tiers.py --bin build/bin/rag_assistant --corpus tests/samples/fixtures/small_corpus
                    [--model models/X.gguf]

$CB_MODEL, when set, overrides --model; $CB_REDIS_SERVER names the
redis-server binary (default: the one on PATH, installed by
scripts/setup.sh).  The server runs on a free loopback port in a temporary
directory, persistence off, with a password given to rag_assistant through
$CB_REDIS_PASSWORD.  Three rag_assistant "devices", each with its own local
store (and RAM and slow-directory tiers), share it:

  * A ingests the corpus: every chunk's KV is computed and also written to
    the server.
  * B ingests the same files and computes nothing (every chunk is found on
    the server); B's first ask is served by the server (its stats: remote
    hits, no misses) and answers exactly as A does from its own store (one
    codec, so the same KV).
  * C ingests likewise, then asks through a TCP relay that SIGKILLs the
    server the moment C starts reading the chunks' layers (after their
    lookups succeeded): C must exit 0 with the same answer as a full
    prefill (--mode full), a warning on stderr, and stats saying every
    chunk was computed.

Plus the option errors.  Prints "N passed, N failed"; exit status 1 on any
failure, 77 (skipped) is never used: a missing redis-server is a failure
naming scripts/setup.sh.
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import rag_harness
from rag_harness import check, describe, finish


QUESTION = "What is the name of the office cat in the office where Zofia Brandvold works?"
CHUNK_TOKENS = "48"
THREADS = "2"
PASSWORD = "tier-test-secret"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A real redis-server on a free loopback port, in its own directory."""

    def __init__(self, workdir):
        self.binary = os.environ.get("CB_REDIS_SERVER") or shutil.which("redis-server")
        self.port = free_port()
        self.workdir = workdir
        self.proc = None

    def start(self):
        if not self.binary:
            return "no redis-server found (run scripts/setup.sh, or set CB_REDIS_SERVER)"
        os.makedirs(self.workdir, exist_ok=True)
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.workdir, "--requirepass", PASSWORD],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.command("PING") == b"+PONG":
                return ""
            time.sleep(0.05)
        return "redis-server did not answer PING within 10 s"

    def command(self, *args):
        """One command (after AUTH); the first reply line, or None."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                def send(parts):
                    msg = b"*%d\r\n" % len(parts)
                    for p in parts:
                        p = p.encode() if isinstance(p, str) else p
                        msg += b"$%d\r\n%s\r\n" % (len(p), p)
                    s.sendall(msg)
                    data = b""
                    while b"\r\n" not in data:
                        chunk = s.recv(4096)
                        if not chunk:
                            return None
                        data += chunk
                    return data.split(b"\r\n")[0]
                if send(["AUTH", PASSWORD]) != b"+OK":
                    return None
                return send(list(args))
        except OSError:
            return None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


class KillingRelay:
    """A TCP relay to the server that SIGKILLs it at the first GETRANGE of a
    layer (a start offset past 0: lookups read the header from 0), before
    passing that command on, and closes every relayed connection."""

    def __init__(self, server):
        self.server = server
        self.port = free_port()
        self.killed = threading.Event()
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", self.port))
        self.listener.listen(8)
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.killed.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.server.port))
            except OSError:
                client.close()
                continue
            self.conns += [client, upstream]
            threading.Thread(target=self._up, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client), daemon=True).start()

    @staticmethod
    def _commands(buf):
        """Complete RESP commands at the front of buf: (list of arg lists, rest)."""
        out = []
        while True:
            if not buf.startswith(b"*"):
                return out, buf
            end = buf.find(b"\r\n")
            if end < 0:
                return out, buf
            n = int(buf[1:end])
            pos = end + 2
            args = []
            for _ in range(n):
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    return out, buf
                size = int(buf[pos + 1:end])
                if len(buf) < end + 2 + size + 2:
                    return out, buf
                args.append(buf[end + 2:end + 2 + size])
                pos = end + 2 + size + 2
            out.append(args)
            buf = buf[pos:]

    def _up(self, src, dst):
        pending = b""
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                pending += data
                cmds, rest = self._commands(pending)
                consumed = len(pending) - len(rest)
                for c in cmds:
                    if c and c[0].upper() == b"GETRANGE" and len(c) == 4 and c[2] != b"0":
                        self.server.kill()
                        self.killed.set()
                        self.close()
                        return
                dst.sendall(pending[:consumed])
                pending = rest
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def _down(self, src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass

    def close(self):
        for s in [self.listener] + self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass


class Rag(rag_harness.Rag):
    def __init__(self, binary, model):
        super().__init__(binary, model, THREADS)
        self.env["CB_REDIS_PASSWORD"] = PASSWORD

    def run(self, args, timeout=600):
        return super().run(args, timeout=timeout)


def tier(o, name):
    for t in (o or {}).get("tiers", []):
        if t.get("name") == name:
            return t
    return {}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--model", default="")
    args = ap.parse_args()
    rag = Rag(args.bin, os.environ.get("CB_MODEL") or args.model)
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(os.path.join(tmp, "redis"))
        why = server.start()
        check(why == "", "a redis-server runs on a free loopback port", why)
        if why:
            return finish()
        try:
            run_tests(rag, server, tmp, args.corpus)
        finally:
            server.kill()
    return finish(f" ({time.monotonic() - start:.0f} s)")


def run_tests(rag, server, tmp, corpus_src):
    corpus = os.path.join(tmp, "corpus")
    os.makedirs(corpus)
    for name in ("people.md", "offices.md", "projects.md"):
        shutil.copy(os.path.join(corpus_src, name), corpus)
    redis = ["--redis", f"127.0.0.1:{server.port}", "--redis-timeout-ms", "500"]
    local = lambda d: ["--store", os.path.join(tmp, d), "--ram-budget-mb", "64",
                       "--slow-dir", os.path.join(tmp, d + "-sd"), "--slow-read-mbps", "10"]

    # Option errors: usage errors (exit 2), one line each.
    for bad, what in ((["--redis-password", "x"], "--redis"),
                      (["--slow-read-mbps", "10"], "--slow-dir"),
                      (["--placement-ratio", "1.5"], "--placement-ratio")):
        rc, out, err = rag.run(["--store", os.path.join(tmp, "x"), "ask", "q"] + bad)
        check(rc == 2 and what in err and err.count("rag_assistant: error: ") == 1,
              f"usage error: {' '.join(bad)}", describe(rc, out, err))

    # A mistyped URL: the error names the address, never its password.
    rc, out, err = rag.run(["--store", os.path.join(tmp, "x"), "--redis",
                            "redis://app:" + PASSWORD + "@127.0.0.1:63z79", "ingest", corpus])
    check(rc != 0 and "redis address" in err and PASSWORD not in err + out,
          "a mistyped redis:// URL's error hides its password", describe(rc, out, err))

    # Device A computes every chunk; each is also written to the server.
    rc, a_ing, out, err = rag.json(local("a") + redis + ["ingest", corpus,
                                                         "--chunk-tokens", CHUNK_TOKENS])
    n_chunks = (a_ing or {}).get("chunks", 0)
    check(a_ing is not None and n_chunks > 0 and a_ing.get("kv_computed") == n_chunks,
          "A: ingest computes every chunk's KV", describe(rc, out, err))
    keys = server.command("DBSIZE")
    check(keys == b":%d" % n_chunks, "A: every chunk is on the shared server",
          f"DBSIZE {keys!r}, {n_chunks} chunks")
    rc, a_ask, out, err = rag.json(local("a") + redis + ["ask", QUESTION, "--max-tokens", "40"])
    # (From whichever tier placement chose: the server is the cheapest, and
    # where a blend at r = 0.2 hides its reads, new chunks live only there.)
    check(a_ask is not None and a_ask.get("cache_misses") == 0
          and sum(t.get("hits", 0) for t in a_ask.get("tiers", [])) == a_ask.get("cache_hits"),
          "A: its ask is served from the store", describe(rc, out, err))

    # Device B (its own local store) finds everything on the server.
    rc, b_ing, out, err = rag.json(local("b") + redis + ["ingest", corpus,
                                                         "--chunk-tokens", CHUNK_TOKENS])
    check(b_ing is not None and b_ing.get("chunks") == n_chunks and b_ing.get("kv_computed") == 0,
          "B: ingest of the same files computes nothing (found on the server)",
          describe(rc, out, err))
    rc, b_ask, out, err = rag.json(local("b") + redis + ["ask", QUESTION, "--max-tokens", "40"])
    n_src = len((b_ask or {}).get("sources", []))
    r = tier(b_ask, "redis")
    check(b_ask is not None and n_src > 0 and b_ask.get("cache_misses") == 0
          and b_ask.get("cache_hits") == n_src and r.get("hits") == n_src
          and r.get("bytes_read", 0) > 0
          and sum(tier(b_ask, n).get("hits", -1) for n in ("ram", "flash", "slow")) == 0
          and [t.get("name") for t in b_ask.get("tiers", [])] == ["ram", "flash", "slow", "redis"],
          "B: its first ask of A's chunks is served by the server (remote hits)",
          describe(rc, out, err))
    check(b_ask is not None and a_ask is not None and b_ask.get("answer") == a_ask.get("answer"),
          "B: the same answer as A (same codec, same KV)",
          f"A {a_ask and a_ask.get('answer')!r}\n     B {b_ask and b_ask.get('answer')!r}")
    rc, out, err = rag.run(local("b") + redis + ["ask", QUESTION, "--max-tokens", "8"])
    check(rc == 0 and "storage tiers (hits): ram " in out and ", redis " in out,
          "ask reports each tier's hits", describe(rc, out, err))

    # Device C: the server dies while C reads the chunks' layers.
    rc, c_ing, out, err = rag.json(local("c") + redis + ["ingest", corpus,
                                                         "--chunk-tokens", CHUNK_TOKENS])
    check(c_ing is not None and c_ing.get("kv_computed") == 0,
          "C: ingest computes nothing (found on the server)", describe(rc, out, err))
    rc, full, out, err = rag.json(local("c") + ["ask", QUESTION, "--mode", "full",
                                                "--max-tokens", "40"])
    check(full is not None and full.get("answer"), "C: the full prefill's answer",
          describe(rc, out, err))
    relay = KillingRelay(server)
    relayed = ["--redis", f"127.0.0.1:{relay.port}", "--redis-timeout-ms", "500"]
    try:
        rc, c_ask, out, err = rag.json(local("c") + relayed + ["ask", QUESTION,
                                                               "--max-tokens", "40"])
    finally:
        relay.close()
    check(relay.killed.is_set() and not server.alive(),
          "the server was killed during C's ask (at its first layer read)")
    check(rc == 0 and c_ask is not None, "C: no crash, exit status 0", describe(rc, out, err))
    check(c_ask is not None and full is not None and c_ask.get("answer") == full.get("answer"),
          "C: the same answer as a full prefill",
          f"full {full and full.get('answer')!r}\n     C {c_ask and c_ask.get('answer')!r}")
    check("rag_assistant: warning: storage tier 'redis' failed" in err
          and "could not be read" in err and "rag_assistant: error" not in err,
          "C: a warning on stderr", err[-800:])
    n_src = len((c_ask or {}).get("sources", []))
    check(c_ask is not None and c_ask.get("cache_hits") == 0
          and c_ask.get("chunks_recomputed") == n_src
          and tier(c_ask, "redis").get("read_failures", 0) >= 1,
          "C: its stats say every chunk was computed", describe(rc, out, err))
    # With the server gone for good, C still answers (blend, chunks computed).
    rc, again, out, err = rag.json(local("c") + relayed + ["ask", QUESTION, "--max-tokens", "8"])
    check(rc == 0 and again is not None and again.get("answer"),
          "C: asks go on with the server gone", describe(rc, out, err))


if __name__ == "__main__":
    sys.exit(main())
