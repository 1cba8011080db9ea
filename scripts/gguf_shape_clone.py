#!/usr/bin/env python3
"""A same-shape stand-in for a GGUF model that is too large to move.

Speed on a GPU depends on a model's shapes and weight types, not on its
values, but a machine that can only receive a few tens of MiB cannot get a
1 GiB model.  `pack` keeps the GGUF header (metadata, tokenizer, tensor
table) whole, every small tensor whole, and the first rows of each large
one (a fraction of its rows, whole quantized rows so every block stays
valid); `unpack` writes a file of the original size and layout in which
each large tensor repeats its kept rows.  Weights and activations keep the
real model's magnitudes, so nothing overflows.  Each repeat after the first
gets random quantized values under the kept block scales (for the types
whose block layout is listed below), so rows differ and logits do not tie;
the others repeat as they are.  The model says nothing meaningful: use the
clone for timings and for comparing two backends on the same file, never
for answer quality.

    gguf_shape_clone.py pack MODEL.gguf DIR [--fraction 0.02]   (needs gguf)
    gguf_shape_clone.py unpack DIR OUT.gguf                     (needs numpy)
"""
import argparse
import hashlib
import json
import math
import os
import sys

SMALL_TENSOR_BYTES = 1 << 16

# Block bytes and the byte range of the quantized values in a block (the
# rest holds the scales), per GGUF type.
QUANT_PAYLOAD = {
    "Q4_0": (18, 2, 18),
    "Q4_1": (20, 4, 20),
    "Q8_0": (34, 2, 34),
    "Q4_K": (144, 16, 144),
    "Q5_K": (176, 16, 176),
    "Q6_K": (210, 0, 192),
}


def pack(model, out_dir, fraction):
    import gguf  # only the packing side needs it

    reader = gguf.GGUFReader(model)
    os.makedirs(out_dir, exist_ok=True)
    with open(model, "rb") as f:
        header = f.read(reader.data_offset)
    index = {"source": os.path.basename(model), "size": os.path.getsize(model),
             "data_offset": reader.data_offset, "fraction": fraction, "tensors": []}
    kept = 0
    with open(os.path.join(out_dir, "rows.bin"), "wb") as rows, open(model, "rb") as f:
        for t in sorted(reader.tensors, key=lambda t: t.data_offset):
            n_rows = int(math.prod(int(d) for d in t.shape[1:])) or 1
            row_bytes = int(t.n_bytes) // n_rows
            keep_rows = n_rows
            if t.n_bytes > SMALL_TENSOR_BYTES:
                keep_rows = max(1, math.ceil(n_rows * fraction))
            f.seek(t.data_offset)
            data = f.read(keep_rows * row_bytes)
            rows.write(data)
            index["tensors"].append({"name": t.name, "type": t.tensor_type.name,
                                     "offset": int(t.data_offset),
                                     "bytes": int(t.n_bytes), "kept": len(data)})
            kept += len(data)
    with open(os.path.join(out_dir, "header.bin"), "wb") as f:
        f.write(header)
    with open(os.path.join(out_dir, "index.json"), "w") as f:
        json.dump(index, f)
    print(f"{model}: header {len(header)} B, {kept} of "
          f"{index['size'] - reader.data_offset} data bytes kept in {out_dir}")


def repeat_rows(t, kept):
    """The tensor's bytes: `kept` repeated, every repeat after the first with
    random quantized values under the kept scales."""
    import numpy as np

    whole, rest = divmod(t["bytes"], len(kept))
    data = kept * whole + kept[:rest]
    layout = QUANT_PAYLOAD.get(t.get("type"))
    if layout is None or whole <= 1 or len(kept) % layout[0] != 0:
        return data
    block, lo, hi = layout
    blocks = np.frombuffer(bytearray(data), dtype=np.uint8).reshape(-1, block)
    first = len(kept) // block
    rng = np.random.default_rng(int(hashlib.sha256(t["name"].encode()).hexdigest()[:8], 16))
    blocks[first:, lo:hi] = rng.integers(0, 256, size=(len(blocks) - first, hi - lo), dtype=np.uint8)
    return blocks.tobytes()


def unpack(in_dir, out):
    with open(os.path.join(in_dir, "index.json")) as f:
        index = json.load(f)
    with open(os.path.join(in_dir, "header.bin"), "rb") as f:
        header = f.read()
    if len(header) != index["data_offset"]:
        sys.exit(f"{in_dir}: header.bin is {len(header)} bytes, index says {index['data_offset']}")
    tmp = out + ".part"
    with open(os.path.join(in_dir, "rows.bin"), "rb") as rows, open(tmp, "wb") as f:
        f.write(header)
        for t in index["tensors"]:
            kept = rows.read(t["kept"])
            if len(kept) != t["kept"]:
                sys.exit(f"{in_dir}/rows.bin ends inside tensor {t['name']}")
            f.write(b"\0" * (t["offset"] - f.tell()))  # the alignment padding
            f.write(repeat_rows(t, kept))
        f.write(b"\0" * (index["size"] - f.tell()))
    os.replace(tmp, out)
    digest = hashlib.sha256()
    with open(out, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    print(f"{out}: {os.path.getsize(out)} bytes, same shapes as {index['source']}, "
          f"sha256 {digest.hexdigest()[:16]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack")
    p.add_argument("model")
    p.add_argument("dir")
    p.add_argument("--fraction", type=float, default=0.02)
    u = sub.add_parser("unpack")
    u.add_argument("dir")
    u.add_argument("out")
    args = parser.parse_args()
    if args.command == "pack":
        if not 0 < args.fraction <= 1:
            sys.exit("--fraction must be in (0, 1]")
        pack(args.model, args.dir, args.fraction)
    else:
        unpack(args.dir, args.out)


if __name__ == "__main__":
    main()
