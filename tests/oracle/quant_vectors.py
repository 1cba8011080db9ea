#!/usr/bin/env python3
"""Generate tests/golden/quant_vectors.bin: dequantization oracle vectors.

For each tensor type the runtime supports (F32, F16, BF16, Q4_0, Q4_1, Q8_0,
Q4_K, Q6_K, Q5_0, Q5_1, Q5_K, Q2_K, Q3_K, IQ4_NL, IQ4_XS; the last seven
appended, so the earlier entries' bytes stay those of the older file) this writes a few blocks of random raw bytes, with the f16 scale
fields overwritten by sane values so every result is finite, together with
their dequantization by the `gguf` Python package (gguf.quants.dequantize),
the reference implementation of the GGUF block formats.  The C++ test
tests/kernels/test_dequantize_oracle.cpp checks that cb::dequantize_row
reproduces these floats bit for bit.

This script is the documented way to regenerate the golden file; the output
is deterministic (fixed seed), so rerunning it must not change the file:

    /root/.cache/cacheblend-rt/venv/bin/python tests/oracle/quant_vectors.py

(any Python with numpy and gguf installed works).

File format, little-endian:
    8 bytes   magic b"CBQV0001"
    u32       number of entries
    per entry:
      u32     ggml type id
      u32     n_elems
      u32     n_bytes
      n_bytes raw tensor bytes (one row)
      n_elems f32 dequantized values
"""

import pathlib
import struct

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

BLOCKS_PER_TYPE = 4
FLOAT_ELEMS = 256
MAGIC = b"CBQV0001"

# (type, elements per block, bytes per block, byte offsets of f16 scales)
QUANT_TYPES = [
    (T.Q4_0, 32, 18, [0]),
    (T.Q4_1, 32, 20, [0, 2]),
    (T.Q8_0, 32, 34, [0]),
    (T.Q4_K, 256, 144, [0, 2]),
    (T.Q6_K, 256, 210, [208]),
    (T.Q5_0, 32, 22, [0]),
    (T.Q5_1, 32, 24, [0, 2]),
    (T.Q5_K, 256, 176, [0, 2]),
    (T.Q2_K, 256, 84, [80, 82]),
    (T.Q3_K, 256, 110, [108]),
    (T.IQ4_NL, 32, 18, [0]),
    (T.IQ4_XS, 256, 136, [0]),
]


def sane_f16(rng: np.random.Generator) -> bytes:
    """A random binary16 of magnitude in [1e-3, 1) and random sign."""
    magnitude = 10.0 ** rng.uniform(-3.0, 0.0)
    sign = -1.0 if rng.random() < 0.5 else 1.0
    return np.array([sign * magnitude], dtype=np.float16).tobytes()


def quant_entry(rng, qtype, block_elems, block_bytes, scale_offsets):
    raw = bytearray(rng.integers(0, 256, size=BLOCKS_PER_TYPE * block_bytes, dtype=np.uint8).tobytes())
    for b in range(BLOCKS_PER_TYPE):
        for off in scale_offsets:
            pos = b * block_bytes + off
            raw[pos : pos + 2] = sane_f16(rng)
    return raw, BLOCKS_PER_TYPE * block_elems


def f32_entry(rng):
    values = (rng.standard_normal(FLOAT_ELEMS) * 10.0 ** rng.uniform(-6, 6, FLOAT_ELEMS)).astype(np.float32)
    values[:4] = np.array([0.0, -0.0, 1e-40, 3.0e38], dtype=np.float32)  # zeros, subnormal, large
    return values.tobytes(), FLOAT_ELEMS


def f16_entry(rng):
    bits = rng.integers(0, 1 << 16, size=FLOAT_ELEMS, dtype=np.uint16)
    bits[(bits & 0x7C00) == 0x7C00] &= 0xBFFF  # no inf/NaN: clear the exponent's top bit
    # Both zeros, smallest/largest subnormal, smallest normal, largest finite.
    bits[:7] = [0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF]
    return bits.tobytes(), FLOAT_ELEMS


def bf16_entry(rng):
    bits = rng.integers(0, 1 << 16, size=FLOAT_ELEMS, dtype=np.uint16)
    bits[(bits & 0x7F80) == 0x7F80] &= 0xBFFF  # no inf/NaN
    bits[:5] = [0x0000, 0x8000, 0x0001, 0x3F80, 0x7F7F]
    return bits.tobytes(), FLOAT_ELEMS


def main() -> None:
    rng = np.random.default_rng(20240611)
    entries = [(T.F32, *f32_entry(rng)), (T.F16, *f16_entry(rng)), (T.BF16, *bf16_entry(rng))]
    for qtype, block_elems, block_bytes, scale_offsets in QUANT_TYPES:
        entries.append((qtype, *quant_entry(rng, qtype, block_elems, block_bytes, scale_offsets)))

    out = bytearray(MAGIC)
    out += struct.pack("<I", len(entries))
    for qtype, raw, n_elems in entries:
        values = dequantize(np.frombuffer(bytes(raw), dtype=np.uint8).reshape(1, -1), qtype)
        values = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
        assert values.size == n_elems, (qtype, values.size, n_elems)
        assert np.all(np.isfinite(values)), qtype
        out += struct.pack("<III", int(qtype), n_elems, len(raw))
        out += bytes(raw)
        out += values.astype("<f4").tobytes()

    path = pathlib.Path(__file__).resolve().parent.parent / "golden" / "quant_vectors.bin"
    path.write_bytes(bytes(out))
    print(f"wrote {path} ({len(out)} bytes, {len(entries)} types)")


if __name__ == "__main__":
    main()
