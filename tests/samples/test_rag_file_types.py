#!/usr/bin/env python3
"""End-to-end test of the file types rag_assistant ingest reads.

  test_rag_file_types.py --bin build/bin/rag_assistant [--model models/X.gguf]

$CB_MODEL, when set, overrides --model.  Builds a folder at run time: an
extensionless README, a reStructuredText file, an HTML page with a script
and a style, gzip-compressed text, a PDF (written here, byte offsets and
all, so that no tool is needed), and files that must be skipped: a binary
file, a corrupt PDF, an encrypted PDF, a truncated gzip file and a gzip
bomb; plus one or two real files from /usr/share/doc when there are any.
Checks that every good file is stored (with its title) and that `ask`
retrieves a chunk of each by a word only it holds, that every bad one is
skipped with a one-line warning naming it and the reason, that a change in
an HTML page's or a PDF's text (and only in its text) re-ingests it, and
that the "empty corpus" error lists the supported types.  Prints "N passed,
N failed"; exit status 1 on any failure.
"""
import argparse
import glob
import gzip
import hashlib
import json
import os
import shutil
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time
import rag_harness
from rag_harness import check, describe, finish

CHUNK_TOKENS = "48"
THREADS = "2"


class Rag(rag_harness.Rag):
    def __init__(self, binary, model):
        super().__init__(binary, model, THREADS)


# ---------------------------------------------------------------- PDF writer

def pdf_string(s):
    return "(" + s.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") + ")"


def make_pdf(pages, title="", encrypt=None):
    """A PDF with one page of Helvetica text lines per entry of `pages` (a
    list of lists of lines), an /Info title, and the cross-reference table's
    byte offsets computed as a writer would.  `encrypt`: (Encrypt dictionary,
    first file ID) for a password-protected file."""
    objs = ["<< /Type /Catalog /Pages 2 0 R >>", None,
            "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
            f"<< /Title {pdf_string(title)} >>"]
    kids = []
    for lines in pages:
        ops = ["BT", "/F1 12 Tf", "14 TL", "72 720 Td"]
        for line in lines:
            ops += [f"{pdf_string(line)} Tj", "T*"]
        ops.append("ET")
        content = "\n".join(ops)
        page_obj = len(objs) + 1
        objs.append("<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
                    f"/Resources << /Font << /F1 3 0 R >> >> /Contents {page_obj + 1} 0 R >>")
        objs.append(f"<< /Length {len(content)} >>\nstream\n{content}\nendstream")
        kids.append(f"{page_obj} 0 R")
    objs[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(pages)} >>"
    trailer_extra = ""
    if encrypt:
        objs.append(encrypt[0])
        file_id = encrypt[1].hex()
        trailer_extra = f" /Encrypt {len(objs)} 0 R /ID [<{file_id}> <{file_id}>]"
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for i, body in enumerate(objs):
        offsets.append(len(out))
        out += f"{i + 1} 0 obj\n{body}\nendobj\n".encode("latin-1")
    xref = len(out)
    out += f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n".encode()
    for off in offsets:
        out += f"{off:010d} 00000 n \n".encode()
    out += (f"trailer\n<< /Size {len(objs) + 1} /Root 1 0 R /Info 4 0 R{trailer_extra} >>\n"
            f"startxref\n{xref}\n%%EOF\n").encode()
    return bytes(out)


def rc4(key, data):
    s = list(range(256))
    j = 0
    for i in range(256):
        j = (j + s[i] + key[i % len(key)]) % 256
        s[i], s[j] = s[j], s[i]
    out = bytearray()
    i = j = 0
    for byte in data:
        i = (i + 1) % 256
        j = (j + s[i]) % 256
        s[i], s[j] = s[j], s[i]
        out.append(byte ^ s[(s[i] + s[j]) % 256])
    return bytes(out)


def standard_encryption(user_password, owner_password):
    """The PDF standard security handler's dictionary (revision 2, 40-bit
    RC4) for these passwords: a reader without the user password cannot
    open the file."""
    pad = bytes.fromhex("28BF4E5E4E758A4164004E56FFFA01082E2E00B6D0683E802F0CA9FE6453697A")
    padded = lambda pw: (pw + pad)[:32]
    o = rc4(hashlib.md5(padded(owner_password)).digest()[:5], padded(user_password))
    permissions = -4
    file_id = hashlib.md5(b"rag_assistant test").digest()
    key = hashlib.md5(padded(user_password) + o + struct.pack("<i", permissions)
                      + file_id).digest()[:5]
    u = rc4(key, pad)
    return (f"<< /Filter /Standard /V 1 /R 2 /O <{o.hex()}> /U <{u.hex()}> /P {permissions} >>",
            file_id)


# ---------------------------------------------------------------- the corpus

# One word per type that no other file holds, and a question that finds it.
GOOD = {
    "README": ("The quillfeather daemon syncs the notes every nine minutes.",
               "How often does the quillfeather daemon sync?"),
    "guide.rst": ("Run the zephyrine installer twice.", "What about the zephyrine installer?"),
    "page.html": ("The marmotvale burrow holds three chambers.", "How many marmotvale chambers?"),
    "notes.txt.gz": ("The obsidianite lamp glows at dusk.", "When does the obsidianite lamp glow?"),
    "report.pdf": ("The heliotrope valve opens at noon.", "When does the heliotrope valve open?"),
}


def write_corpus(docs):
    os.makedirs(docs)
    with open(os.path.join(docs, "README"), "w") as f:
        f.write("Project Quillfeather\n\n" + GOOD["README"][0] + "\n")
    with open(os.path.join(docs, "guide.rst"), "w") as f:
        f.write("Kestrel Guide\n=============\n\nAn introduction.\n\n"
                "Installing\n----------\n\n" + GOOD["guide.rst"][0] + "\n")
    write_html(docs, GOOD["page.html"][0], "var scriptonlyword = 1;")
    with open(os.path.join(docs, "notes.txt.gz"), "wb") as f:
        f.write(gzip.compress((GOOD["notes.txt.gz"][0] + "\n").encode()))
    with open(os.path.join(docs, "report.pdf"), "wb") as f:
        f.write(make_pdf([["Valve report, page one.", GOOD["report.pdf"][0]],
                          ["Page two: maintenance is quarterly."]], title="Valve Report"))
    # What must be skipped, and a word of each reason.
    with open(os.path.join(docs, "picture.bin"), "wb") as f:
        f.write(bytes(range(256)) * 8)
    with open(os.path.join(docs, "broken.pdf"), "wb") as f:
        f.write(b"%PDF-1.4\n1 0 obj\n<< /Type /Catal")
    with open(os.path.join(docs, "locked.pdf"), "wb") as f:
        f.write(make_pdf([["Locked secret text."]], title="Locked",
                         encrypt=standard_encryption(b"secret", b"owner")))
    whole = gzip.compress(b"A sentence that never arrives in full.\n" * 50)
    with open(os.path.join(docs, "broken.txt.gz"), "wb") as f:
        f.write(whole[:len(whole) // 2])
    with open(os.path.join(docs, "bomb.txt.gz"), "wb") as f:
        f.write(gzip.compress(b"a" * (3 << 20)))  # 3 MB of text, over --max-file-mb 1
    return {
        "picture.bin": "binary",
        "broken.pdf": "not a readable PDF",
        "locked.pdf": "encrypted",
        "broken.txt.gz": "truncated",
        "bomb.txt.gz": "decompresses to more than the 1.0 MB",
    }


def write_html(docs, body_sentence, script):
    with open(os.path.join(docs, "page.html"), "w") as f:
        f.write("<!DOCTYPE html><html><head><title>Marmot &amp; Co</title>"
                f"<script>{script}</script><style>p {{ color: teal }}</style></head>"
                "<body><h1>Marmot handbook</h1><!-- a comment -->"
                f"<p>{body_sentence.replace('three', '&#116;hree')}</p>"
                "<ul><li>one</li><li>two</li></ul></body></html>")


def real_docs(docs):
    """One small changelog.Debian.gz and one small extensionless README from
    /usr/share/doc, copied into docs/debian; their names, or [] when there
    are none."""
    picked = []
    dest = os.path.join(docs, "debian")

    def small_text(data):  # a few chunks: the KV precompute stays quick
        return 200 <= len(data) <= 3000 and b"\0" not in data

    for path in sorted(glob.glob("/usr/share/doc/*/changelog.Debian.gz"))[:300]:
        try:
            with gzip.open(path) as f:
                data = f.read(4000)
        except (OSError, EOFError):
            continue
        if small_text(data):
            os.makedirs(dest, exist_ok=True)
            shutil.copy(path, os.path.join(dest, "changelog.Debian.gz"))
            picked.append("changelog.Debian.gz")
            break
    for path in sorted(glob.glob("/usr/share/doc/*/README*"))[:300]:
        name = os.path.basename(path)
        if not os.path.isfile(path) or "." in name:  # an extensionless one
            continue
        try:
            with open(path, "rb") as f:
                data = f.read(4000)
            data.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if small_text(data):
            os.makedirs(dest, exist_ok=True)
            shutil.copy(path, os.path.join(dest, name))
            picked.append(name)
            break
    return picked


def stored(store):
    with sqlite3.connect(os.path.join(store, "corpus.sqlite")) as db:
        files = dict(db.execute("SELECT display, title FROM files"))
        texts = [t for (t,) in db.execute("SELECT text FROM chunks")]
    return files, texts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", default="")
    args = ap.parse_args()
    rag = Rag(args.bin, os.environ.get("CB_MODEL") or args.model)
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        docs = os.path.join(tmp, "docs")
        bad = write_corpus(docs)
        real = real_docs(docs)
        if not real:
            print("skip: no small changelog.Debian.gz or README in /usr/share/doc")
        store = os.path.join(tmp, "store")
        ingest = ["--store", store, "ingest", docs, "--chunk-tokens", CHUNK_TOKENS,
                  "--max-file-mb", "1"]
        rc, o, out, err = rag.json(ingest)
        check(rc == 0 and o is not None, "ingest of the mixed folder succeeds", describe(rc, out, err))
        if o is None:
            return finish()
        pdf_built = "built without PDF support" not in err
        if not pdf_built:
            print("note: this rag_assistant was built without PDF support")
            bad["report.pdf"] = "built without PDF support"
            bad["locked.pdf"] = "built without PDF support"
            bad["broken.pdf"] = "built without PDF support"
        n_good = len(GOOD) - (0 if pdf_built else 1) + len(real)
        check(o.get("files_new") == n_good and o.get("files_skipped") == len(bad),
              f"{n_good} files stored, {len(bad)} skipped", describe(rc, out, err))

        # Each bad file: one warning line naming it and the reason.
        warnings = [l for l in err.splitlines() if l.startswith("rag_assistant: warning: skipping ")]
        for name, reason in sorted(bad.items()):
            lines = [l for l in warnings if f"docs/{name}: " in l]
            check(len(lines) == 1 and reason in lines[0],
                  f"{name} is skipped with the reason '{reason}'", "\n     ".join(warnings))
        check(len(warnings) == len(bad), "no other file is skipped", "\n     ".join(warnings))

        files, texts = stored(store)
        expected_titles = {"README": "README", "guide.rst": "Kestrel Guide",
                           "page.html": "Marmot & Co", "notes.txt.gz": "notes"}
        if pdf_built:
            expected_titles["report.pdf"] = "Valve Report"
        for name, title in expected_titles.items():
            check(files.get("docs/" + name) == title, f"{name} is stored with the title '{title}'",
                  repr(files))
        for name in real:
            check("docs/debian/" + name in files, f"/usr/share/doc's {name} is stored", repr(files))
        all_text = "\n".join(texts)
        check("scriptonlyword" not in all_text and "teal" not in all_text
              and "a comment" not in all_text, "no script, style or comment text is stored",
              all_text[:600])
        check("# Marmot handbook" in all_text and "- one\n- two" in all_text,
              "HTML headings and list items are kept as Markdown", all_text[:600])
        check("## Installing" in all_text, "reStructuredText titles become headings", all_text[:600])
        if pdf_built:
            check("Page two: maintenance is quarterly." in all_text,
                  "every page of the PDF is stored", all_text[:600])

        # Retrieval: a word only one file holds finds that file first.
        for name, (_, question) in GOOD.items():
            if name == "report.pdf" and not pdf_built:
                continue
            rc, a, out, err = rag.json(["--store", store, "ask", question, "--top-k", "1",
                                        "--max-tokens", "4"])
            sources = (a or {}).get("sources") or [{}]
            check(rc == 0 and sources[0].get("file") == "docs/" + name,
                  f"ask retrieves {name}", describe(rc, out, err))

        # Re-ingest: nothing changed; a script-only change to the page keeps
        # its text (not re-chunked); a change to its text, or to the PDF's,
        # re-chunks that file.
        rc, o, out, err = rag.json(ingest)
        check(o is not None and o.get("files_unchanged") == n_good and o.get("kv_computed") == 0,
              "a second ingest changes nothing", describe(rc, out, err))
        write_html(docs, GOOD["page.html"][0], "var anotherscript = 2;")
        rc, o, out, err = rag.json(ingest)
        check(o is not None and o.get("files_changed") == 0 and o.get("files_unchanged") == n_good,
              "a change to the page's script alone does not re-ingest it", describe(rc, out, err))
        write_html(docs, "The marmotvale burrow holds five chambers.", "var x = 1;")
        if pdf_built:
            with open(os.path.join(docs, "report.pdf"), "wb") as f:
                f.write(make_pdf([["Valve report, page one.",
                                   "The heliotrope valve opens at midnight."]],
                                 title="Valve Report"))
        rc, o, out, err = rag.json(ingest)
        changed = 2 if pdf_built else 1
        check(o is not None and o.get("files_changed") == changed and o.get("kv_computed", 0) > 0,
              "a changed page" + (" and PDF are" if pdf_built else " is") + " re-ingested",
              describe(rc, out, err))
        files, texts = stored(store)
        all_text = "\n".join(texts)
        check("five chambers" in all_text and "three chambers" not in all_text
              and (not pdf_built or ("midnight" in all_text and "noon" not in all_text)),
              "the new text replaced the old", all_text[:600])

        # Nothing of a supported type: the error says what would be.
        only_binary = os.path.join(tmp, "only_binary")
        os.makedirs(only_binary)
        shutil.copy(os.path.join(docs, "picture.bin"), only_binary)
        rc, out, err = rag.run(["--store", os.path.join(tmp, "store2"), "ingest", only_binary])
        errors = [l for l in err.splitlines() if l.startswith("rag_assistant: error: ")]
        check(rc == 1 and len(errors) == 1 and "empty corpus" in errors[0]
              and all(t in errors[0] for t in (".md", ".txt", ".rst", ".html", ".pdf", ".gz"))
              and "picture.bin" in err,
              "a folder with nothing readable: 'empty corpus' with the supported types",
              describe(rc, out, err))
        rc, out, err = rag.run(["--store", os.path.join(tmp, "store2"), "ingest",
                                os.path.join(docs, "broken.txt.gz")])
        check(rc == 1 and "truncated" in err and "nothing to ingest" in err,
              "a named bad file alone: its reason, then 'nothing to ingest'", describe(rc, out, err))
        # A store inside the folder it indexes is not walked into.
        inside = os.path.join(tmp, "inside")
        os.makedirs(inside)
        shutil.copy(os.path.join(docs, "README"), inside)
        inner_store = ["--store", os.path.join(inside, "store"), "ingest", inside]
        rag.run(inner_store)
        rc, o, out, err = rag.json(inner_store)
        check(o is not None and o.get("files_unchanged") == 1 and o.get("files_skipped") == 0
              and "warning" not in err, "a store inside the walked folder is passed over",
              describe(rc, out, err))
    return finish(f" ({time.monotonic() - start:.0f} s)")


if __name__ == "__main__":
    sys.exit(main())
