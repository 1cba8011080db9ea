#!/usr/bin/env python3
"""rag_assistant models and pull, against a local HTTP server (no network).

  test_rag_pull.py --bin build/bin/rag_assistant --model models/SmolLM2-135M-Instruct.Q4_1.gguf

The server (http.server in a thread) serves a generated file of a few MB,
with Range support that can be switched off, a mode that drops the
connection after N bytes, a redirect and a 404.  Checked: a full pull lands
the right bytes and a second one does nothing; an interrupted pull leaves a
.part that the next pull resumes with a Range request; a server that ignores
Range, or answers 416, restarts cleanly; Ctrl-C keeps the .part; a wrong SHA-256 deletes the
download, leaves an installed file alone and names both hashes; a URL
without a hash is installed with a warning; 404, a closed port and a full
disk are one clear error each; `models` marks what a models directory holds;
--model NAME resolves through the catalogue ($CB_MODELS_DIR first).
--model is the SmolLM2 135M test model (the catalogue's smollm2-135m).
Prints "N passed, N failed"; exit status 1 on any failure.
"""
import argparse
import hashlib
import http.server
import json
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from rag_harness import check, finish


SIZE = 4 << 20
PAYLOAD = random.Random(31).randbytes(SIZE)
SHA = hashlib.sha256(PAYLOAD).hexdigest()
WRONG_SHA = "0" * 64
SMOL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def describe(p):
    return f"rc={p.returncode}\n     stdout: {p.stdout[-800:]!r}\n     stderr: {p.stderr[-1500:]!r}"


def error_lines(p):
    return [l for l in p.stderr.splitlines() if l.startswith("rag_assistant: error: ")]


class Server:
    """The test's HTTP server and what it saw."""

    def __init__(self):
        self.ranges = True       # honour Range requests
        self.drop_after = None   # close the connection after this many body bytes
        self.slow = False        # pause between pieces of the body (a slow link)
        self.requests = []       # (path, Range header or None)
        self.body_bytes = 0      # body bytes sent, all requests together
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                rng = self.headers.get("Range")
                server.requests.append((self.path, rng))
                if self.path == "/redirect/model.gguf":
                    self.send_response(302)
                    self.send_header("Location", "/files/model.gguf")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path not in ("/files/model.gguf", "/files/" + SMOL_FILE):
                    body = b"not here\n"
                    self.send_response(404)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                start = 0
                if rng and server.ranges:
                    start = int(rng.split("=")[1].split("-")[0])
                    if start >= SIZE:
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{SIZE}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{SIZE - 1}/{SIZE}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(SIZE - start))
                self.end_headers()
                body = PAYLOAD[start:]
                if server.drop_after is not None:
                    body = body[:server.drop_after]
                try:
                    for i in range(0, len(body), 65536):
                        piece = body[i:i + 65536]
                        self.wfile.write(piece)
                        server.body_bytes += len(piece)
                        if server.slow:
                            time.sleep(0.05)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    return  # the client gave up (the full-disk test)
                if server.drop_after is not None:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path="/files/model.gguf"):
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def reset(self):
        self.ranges = True
        self.drop_after = None
        self.slow = False
        self.requests = []
        self.body_bytes = 0

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class Rag:
    def __init__(self, binary):
        self.binary = binary
        self.env = {k: v for k, v in os.environ.items() if k not in ("CB_MODEL", "CB_MODELS_DIR")}

    def run(self, args, env=None, cwd=None, preexec_fn=None, timeout=60):
        e = dict(self.env)
        e.update(env or {})
        return subprocess.run([self.binary] + args, capture_output=True, text=True, env=e,
                              cwd=cwd, preexec_fn=preexec_fn, timeout=timeout)

    def popen(self, args):
        return subprocess.Popen([self.binary] + args, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env)

    def pull(self, target, models_dir, extra=(), **kw):
        return self.run(["pull", target, "--models-dir", models_dir] + list(extra), **kw)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def full_disk_after_1mb():
    """In the child: no file may grow past 1 MB (EFBIG, as ENOSPC on a full disk)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))


def test_full_pull(rag, srv, tmp):
    d = os.path.join(tmp, "full")
    srv.reset()
    p = rag.pull(srv.url(), d, ["--sha256", SHA.upper()])
    dest = os.path.join(d, "model.gguf")
    check(p.returncode == 0 and os.path.isfile(dest) and read(dest) == PAYLOAD,
          "pull URL --sha256: the file lands with the right bytes", describe(p))
    check(not os.path.exists(dest + ".part"), "pull: no .part is left behind", describe(p))
    check("verified" in p.stdout, "pull: says the SHA-256 was verified", describe(p))
    check(srv.requests == [("/files/model.gguf", None)],
          "pull: one request, without a Range", repr(srv.requests))

    srv.reset()
    p = rag.pull(srv.url(), d, ["--sha256", SHA])
    check(p.returncode == 0 and "nothing to do" in p.stdout and not srv.requests,
          "pull again: already there with the right hash, nothing downloaded",
          describe(p) + f"\n     requests: {srv.requests!r}")

    srv.reset()
    p = rag.pull(srv.url("/redirect/model.gguf"), os.path.join(tmp, "redirected"),
                 ["--sha256", SHA])
    check(p.returncode == 0 and read(os.path.join(tmp, "redirected", "model.gguf")) == PAYLOAD,
          "pull: a redirect is followed", describe(p))


def test_resume(rag, srv, tmp):
    d = os.path.join(tmp, "resume")
    dest = os.path.join(d, "model.gguf")
    srv.reset()
    srv.drop_after = 1500000
    p = rag.pull(srv.url(), d, ["--sha256", SHA])
    part = dest + ".part"
    check(p.returncode == 1 and os.path.isfile(part) and os.path.getsize(part) == 1500000
          and not os.path.exists(dest),
          "dropped connection: exit 1, the bytes received kept in FILE.part", describe(p))
    errs = error_lines(p)
    check(len(errs) == 1 and "resume" in errs[0] and "model.gguf.part" in errs[0],
          "dropped connection: one error line saying the next pull resumes", describe(p))

    srv.reset()
    p = rag.pull(srv.url(), d, ["--sha256", SHA])
    check(p.returncode == 0 and read(dest) == PAYLOAD and not os.path.exists(part),
          "the next pull resumes and ends with the right file", describe(p))
    check(srv.requests == [("/files/model.gguf", "bytes=1500000-")],
          "resume: one Range request from the .part's end", repr(srv.requests))
    check(1500000 + srv.body_bytes < 2 * SIZE and srv.body_bytes == SIZE - 1500000,
          "resume: only the missing bytes were sent", f"sent {srv.body_bytes}")


def test_interrupt(rag, srv, tmp):
    d = os.path.join(tmp, "interrupted")
    dest = os.path.join(d, "model.gguf")
    part = dest + ".part"
    srv.reset()
    srv.slow = True
    proc = rag.popen(["pull", srv.url(), "--models-dir", d, "--sha256", SHA])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (os.path.exists(part)
                                               and os.path.getsize(part) > 0):
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    p = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    errs = error_lines(p)
    kept = os.path.getsize(part) if os.path.exists(part) else 0
    check(p.returncode == 1 and 0 < kept < SIZE and not os.path.exists(dest),
          "Ctrl-C: exit 1, the partial download kept in FILE.part", describe(p))
    check(len(errs) == 1 and "interrupted" in errs[0] and "resume" in errs[0],
          "Ctrl-C: one error line saying the next pull resumes", describe(p))
    srv.reset()
    p = rag.pull(srv.url(), d, ["--sha256", SHA])
    check(p.returncode == 0 and read(dest) == PAYLOAD
          and srv.requests == [("/files/model.gguf", f"bytes={kept}-")],
          "after Ctrl-C, the next pull resumes and ends right",
          describe(p) + f"\n     requests: {srv.requests!r}")


def test_range_ignored(rag, srv, tmp):
    d = os.path.join(tmp, "norange")
    dest = os.path.join(d, "model.gguf")
    os.makedirs(d)
    with open(dest + ".part", "wb") as f:
        f.write(PAYLOAD[:1000000])
    srv.reset()
    srv.ranges = False
    p = rag.pull(srv.url(), d, ["--sha256", SHA])
    check(p.returncode == 0 and read(dest) == PAYLOAD,
          "a server ignoring Range (200): the download restarts and ends right", describe(p))
    check(srv.requests == [("/files/model.gguf", "bytes=1000000-")]
          and "does not resume" in p.stderr,
          "a server ignoring Range: one request, a warning that it sent the whole file",
          describe(p) + f"\n     requests: {srv.requests!r}")

    # A .part as long as the file, with wrong bytes: the server answers the
    # range past its end with 416, and the pull starts again.
    d = os.path.join(tmp, "416")
    dest = os.path.join(d, "model.gguf")
    os.makedirs(d)
    with open(dest + ".part", "wb") as f:
        f.write(b"\0" * SIZE)
    srv.reset()
    p = rag.pull(srv.url(), d, ["--sha256", SHA])
    check(p.returncode == 0 and read(dest) == PAYLOAD
          and [r for _, r in srv.requests] == [f"bytes={SIZE}-", None],
          "HTTP 416 for the resume: the pull starts again from byte 0 and ends right",
          describe(p) + f"\n     requests: {srv.requests!r}")


def test_wrong_hash(rag, srv, tmp):
    d = os.path.join(tmp, "wrong")
    dest = os.path.join(d, "model.gguf")
    srv.reset()
    p = rag.pull(srv.url(), d, ["--sha256", WRONG_SHA])
    errs = error_lines(p)
    check(p.returncode == 1 and not os.path.exists(dest + ".part") and not os.path.exists(dest),
          "wrong --sha256: exit 1, the download deleted, nothing installed", describe(p))
    check(len(errs) == 1 and WRONG_SHA in errs[0] and SHA in errs[0],
          "wrong --sha256: one error line naming both hashes", describe(p))

    # An installed file stays as it was when a forced download is wrong.
    with open(dest, "wb") as f:
        f.write(b"the good file")
    p = rag.pull(srv.url(), d, ["--sha256", WRONG_SHA, "--force"])
    check(p.returncode == 1 and read(dest) == b"the good file"
          and not os.path.exists(dest + ".part"),
          "wrong hash with --force: the file already there is untouched", describe(p))

    # A URL naming a catalogue file is checked against the catalogue.
    srv.reset()
    p = rag.pull(srv.url("/files/" + SMOL_FILE), d)
    errs = error_lines(p)
    check(p.returncode == 1 and len(errs) == 1 and SMOL_SHA in errs[0]
          and not os.path.exists(os.path.join(d, SMOL_FILE)),
          "a URL of a catalogue file is checked against the catalogue's hash", describe(p))


def test_unverified(rag, srv, tmp):
    d = os.path.join(tmp, "unverified")
    dest = os.path.join(d, "model.gguf")
    srv.reset()
    p = rag.pull(srv.url(), d)
    check(p.returncode == 0 and read(dest) == PAYLOAD and "unverified" in p.stderr
          and SHA in p.stderr,
          "a URL without --sha256: installed, with a warning that it is unverified",
          describe(p))
    p = rag.pull(srv.url(), d)
    check(p.returncode == 0 and "already there" in p.stdout,
          "an unverified file already there: nothing to do (--force downloads again)",
          describe(p))


def test_errors(rag, srv, tmp):
    d = os.path.join(tmp, "errors")
    srv.reset()
    p = rag.pull(srv.url("/files/missing.gguf"), d, ["--sha256", SHA])
    errs = error_lines(p)
    check(p.returncode == 1 and len(errs) == 1 and "HTTP 404" in errs[0]
          and "missing.gguf" in errs[0],
          "404: exit 1, one error line naming the URL and the status", describe(p))
    check(not os.path.exists(os.path.join(d, "missing.gguf.part"))
          and not os.path.exists(os.path.join(d, "missing.gguf")),
          "404: no file and no .part left", describe(p))

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    p = rag.pull(f"http://127.0.0.1:{port}/model.gguf", d, ["--sha256", SHA])
    errs = error_lines(p)
    check(p.returncode == 1 and len(errs) == 1 and "connect" in errs[0].lower(),
          "a closed port: exit 1, one error line about the connection", describe(p))

    srv.reset()
    p = rag.pull(srv.url(), os.path.join(tmp, "full_disk"), ["--sha256", SHA],
                 preexec_fn=full_disk_after_1mb)
    errs = error_lines(p)
    dest = os.path.join(tmp, "full_disk", "model.gguf")
    check(p.returncode == 1 and len(errs) == 1 and "model.gguf.part" in errs[0]
          and not os.path.exists(dest),
          "a full disk: one error naming the .part, nothing installed", describe(p))

    for args, what in ((["pull"], "pull without a target"),
                       (["pull", "a", "b"], "pull with two targets"),
                       (["pull", "x", "--sha256", "abc"], "a malformed --sha256"),
                       (["models", "--force"], "models --force"),
                       (["--store", tmp, "ask", "q", "--models-dir", tmp], "ask --models-dir")):
        p = rag.run(args)
        check(p.returncode == 2 and len(error_lines(p)) == 1, f"usage error: {what}", describe(p))
    p = rag.pull("no-such-model", d)
    check(p.returncode == 1 and "rag_assistant models" in p.stderr,
          "an unknown name: exit 1, pointing at `models`", describe(p))
    p = rag.pull("ftp://127.0.0.1/model.gguf", d)
    check(p.returncode == 1 and "http" in p.stderr, "an ftp:// URL is refused", describe(p))


def test_models(rag, tmp, model):
    d = os.path.join(tmp, "listed")
    os.makedirs(d)
    os.symlink(os.path.abspath(model), os.path.join(d, SMOL_FILE))
    with open(os.path.join(d, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf.part"), "wb") as f:
        f.write(b"x" * 1000)
    p = rag.run(["models", "--models-dir", d])
    out = p.stdout
    check(p.returncode == 0 and "smollm2-135m: present" in out
          and "qwen2.5-coder-1.5b (default): not downloaded" in out
          and "qwen2.5-coder-0.5b: partly downloaded (1000 of" in out
          and SMOL_SHA in out and "Apache-2.0" in out and "huggingface.co" in out,
          "models: the catalogue, what the directory holds, the default marked", describe(p))
    p = rag.run(["models", "--json"], env={"CB_MODELS_DIR": d})
    try:
        j = json.loads(p.stdout)
        rows = {m["name"]: m for m in j["models"]}
        ok = (j["models_dir"] == d and j["default"] == "qwen2.5-coder-1.5b"
              and rows["smollm2-135m"]["present"] is True
              and rows["smollm2-135m"]["sha256"] == SMOL_SHA
              and rows["smollm2-135m"]["size_bytes"] == os.path.getsize(model)
              and rows["qwen2.5-coder-1.5b"]["present"] is False
              and rows["qwen2.5-coder-1.5b"]["default"] is True
              and rows["qwen2.5-coder-0.5b"]["status"] == "partial"
              and all(m["url"].startswith("https://") for m in j["models"]))
    except (ValueError, KeyError) as e:
        ok = False
        p.stderr += f" ({e})"
    check(p.returncode == 0 and ok, "models --json with $CB_MODELS_DIR", describe(p))

    # A catalogue file already in the models directory with the right hash
    # (the real test model): pull does nothing.
    p = rag.pull("smollm2-135m", d)
    check(p.returncode == 0 and "nothing to do" in p.stdout,
          "pull NAME of a verified file already there: nothing to do", describe(p))


def test_model_names(rag, tmp, model):
    docs = os.path.join(tmp, "docs")
    os.makedirs(docs)
    with open(os.path.join(docs, "a.md"), "w") as f:
        f.write("# A\n\nSome text.\n")
    # The name resolves (the source tree's models/ holds the test model): ask
    # gets as far as the store.
    p = rag.run(["--store", os.path.join(tmp, "no_store"), "--model", "smollm2-135m", "ask", "q"],
                cwd=tmp)
    errs = error_lines(p)
    check(p.returncode == 1 and len(errs) == 1 and "store" in errs[0] and "model" not in errs[0],
          "--model NAME resolves through the catalogue (ask fails on the store)", describe(p))
    # $CB_MODELS_DIR comes first: a broken file of that name there is the
    # one loaded.
    broken = os.path.join(tmp, "broken_models")
    os.makedirs(broken)
    with open(os.path.join(broken, SMOL_FILE), "wb") as f:
        f.write(b"not a model")
    p = rag.run(["--store", os.path.join(tmp, "store"), "--model", "smollm2-135m", "ingest", docs],
                env={"CB_MODELS_DIR": broken}, cwd=tmp)
    check(p.returncode == 1 and os.path.join(broken, SMOL_FILE) in p.stderr,
          "--model NAME is looked for in $CB_MODELS_DIR first", describe(p))
    p = rag.run(["--store", os.path.join(tmp, "no_store"), "--model", "no-such-model", "ask", "q"],
                cwd=tmp)
    errs = error_lines(p)
    check(p.returncode == 1 and len(errs) == 1 and "no-such-model" in errs[0],
          "--model with neither a file nor a catalogue name: the model error", describe(p))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    rag = Rag(os.path.abspath(a.bin))
    probe = rag.run(["pull", "http://127.0.0.1:1/x.gguf"])
    if "built without download support" in probe.stderr:
        check(probe.returncode == 1, "a build without libcurl says so", describe(probe))
        return finish(" (no download support: pull not tested)")
    srv = Server()
    tmp = tempfile.mkdtemp(prefix="rag_pull_")
    try:
        test_full_pull(rag, srv, tmp)
        test_resume(rag, srv, tmp)
        test_interrupt(rag, srv, tmp)
        test_range_ignored(rag, srv, tmp)
        test_wrong_hash(rag, srv, tmp)
        test_unverified(rag, srv, tmp)
        test_errors(rag, srv, tmp)
        test_models(rag, tmp, a.model)
        test_model_names(rag, tmp, a.model)
    finally:
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
