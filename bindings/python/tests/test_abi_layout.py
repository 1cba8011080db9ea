"""The ctypes declarations against cacheblend.h.

A wrong struct field or argument type would corrupt memory without an
error, so this compiles a small C++ program that describes, from the header
itself, every struct (size, field offsets and types) and every bound
function (return and argument types), and compares it with the same
description made from the ctypes declarations.  Enum values and the list of
functions are read from the header text.  Needs the repository's header and
a C++17 compiler; skips without them.  Loads no model.
"""
import ctypes
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import cacheblend as cb
from cacheblend import _native

REPO = Path(__file__).resolve().parents[3]
INCLUDE = REPO / "abi" / "include"
HEADER = INCLUDE / "cacheblend" / "cacheblend.h"

# Declared in the header, deliberately not bound: the bindings set
# struct_size and zero the struct themselves (see _native.new_stats).
UNBOUND = {"cb_model_info_init_sized", "cb_generate_stats_init_sized",
           "cb_chunk_cache_stats_init_sized", "cb_rag_stats_init_sized",
           "cb_tier_stats_init_sized"}

STRUCTS = [_native.ModelOptions, _native.ModelInfo, _native.ChatMessage,
           _native.SessionOptions, _native.SamplingOptions, _native.GenerateOptions,
           _native.GenerateStats, _native.StoreOptions, _native.ChunkCacheStats, _native.TierStats,
           _native.CheckLayer, _native.RagOptions, _native.RagStats]

ENUM_PREFIXES = {cb.Activations: "CB_ACTIVATIONS_", cb.Backend: "CB_BACKEND_", cb.ChatTemplate: "CB_CHAT_TEMPLATE_", cb.StopReason: "CB_STOP_", cb.Codec: "CB_CODEC_", cb.KvType: "CB_KV_",
                 cb.Mode: "CB_MODE_", cb.ChunkHead: "CB_CHUNK_HEAD_", cb.Select: "CB_SELECT_",
                 cb.ProgressStage: "CB_PROGRESS_"}

pytestmark = pytest.mark.skipif(not HEADER.is_file(), reason=f"{HEADER} not found")

CXX_DESCRIBE = r"""
#include <cacheblend/cacheblend.h>
#include <cstddef>
#include <cstdio>
#include <string>
#include <type_traits>

template <class T, class = void> struct is_complete : std::false_type {};
template <class T> struct is_complete<T, decltype(void(sizeof(T)))> : std::true_type {};

template <class R, class... A> std::string fn_desc(R (*)(A...));

// The grammar of desc() in test_abi_layout.py: a C enum is described as the
// int ctypes passes it as.
template <class T> std::string desc() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_void_v<U>) return "void";
  else if constexpr (std::is_same_v<U, char>) return "char";
  else if constexpr (std::is_enum_v<U>) return "i" + std::to_string(sizeof(U));
  else if constexpr (std::is_integral_v<U>)
    return (std::is_signed_v<U> ? "i" : "u") + std::to_string(sizeof(U));
  else if constexpr (std::is_floating_point_v<U>) return "f" + std::to_string(sizeof(U));
  else if constexpr (std::is_pointer_v<U>) {
    if constexpr (std::is_function_v<std::remove_pointer_t<U>>)
      return "*" + fn_desc(static_cast<U>(nullptr));
    else return "*" + desc<std::remove_pointer_t<U>>();
  }
  else if constexpr (is_complete<U>::value) return "s" + std::to_string(sizeof(U));
  else return "opaque";
}

template <class R, class... A> std::string fn_desc(R (*)(A...)) {
  std::string args[] = {std::string(), desc<A>()...};
  std::string s = "fn(" + desc<R>() + ";";
  for (std::size_t i = 1; i < sizeof args / sizeof args[0]; ++i) s += (i > 1 ? "," : "") + args[i];
  return s + ")";
}

template <class R, class... A> void print_fn(const char* name, R (*)(A...)) {
  std::string args[] = {std::string(), desc<A>()...};
  std::printf("%s ret %s\n", name, desc<R>().c_str());
  std::printf("%s nargs %zu\n", name, sizeof args / sizeof args[0] - 1);
  for (std::size_t i = 1; i < sizeof args / sizeof args[0]; ++i)
    std::printf("%s arg%zu %s\n", name, i - 1, args[i].c_str());
}

int main() {
"""


def c_name(cls):
    return "cb_" + re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()


def desc(t):
    """A ctypes type in the grammar of the C++ desc()."""
    if t is None:
        return "void"
    if issubclass(t, ctypes._CFuncPtr):
        return "*fn(" + desc(t._restype_) + ";" + ",".join(map(desc, t._argtypes_)) + ")"
    if issubclass(t, ctypes._Pointer):
        return "*" + desc(t._type_)
    if issubclass(t, ctypes.Structure):
        return f"s{ctypes.sizeof(t)}" if hasattr(t, "_fields_") else "opaque"
    code = t._type_
    if code in ("z", "P"):
        return "*char" if code == "z" else "*void"
    if code == "c":
        return "char"
    if code in ("f", "d"):
        return f"f{ctypes.sizeof(t)}"
    return ("u" if code.isupper() else "i") + str(ctypes.sizeof(t))


def python_side():
    lines = {}
    for name, (restype, argtypes) in _native._PROTOTYPES.items():
        lines[f"{name} ret"] = desc(restype)
        lines[f"{name} nargs"] = str(len(argtypes))
        for i, t in enumerate(argtypes):
            lines[f"{name} arg{i}"] = desc(t)
    for cls in STRUCTS:
        lines[f"{c_name(cls)} size"] = str(ctypes.sizeof(cls))
        for field, t in cls._fields_:
            lines[f"{c_name(cls)}.{field}"] = f"{getattr(cls, field).offset} {desc(t)}"
    return lines


def cxx_source():
    body = []
    for name in _native._PROTOTYPES:
        # decltype: the type alone, so nothing needs linking.
        body.append(f'  print_fn("{name}", static_cast<decltype(&{name})>(nullptr));')
    for cls in STRUCTS:
        n = c_name(cls)
        body.append(f'  std::printf("{n} size %zu\\n", sizeof({n}));')
        for field, _ in cls._fields_:
            body.append(f'  std::printf("{n}.{field} %zu %s\\n", offsetof({n}, {field}), '
                        f'desc<decltype({n}::{field})>().c_str());')
    return CXX_DESCRIBE + "\n".join(body) + "\n  return 0;\n}\n"


def find_cxx():
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def test_structs_and_prototypes_match_the_header(tmp_path):
    cxx = find_cxx()
    if cxx is None:
        pytest.skip("no C++ compiler (set CXX)")
    src = tmp_path / "describe.cpp"
    exe = tmp_path / "describe"
    src.write_text(cxx_source())
    build = subprocess.run([cxx, "-std=c++17", "-I", str(INCLUDE), str(src), "-o", str(exe)],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    header = {}
    for line in out.splitlines():  # "struct.field OFFSET DESC" or "name WHAT DESC"
        first, rest = line.split(" ", 1)
        if "." in first:
            header[first] = rest
        else:
            what, value = rest.split(" ")
            header[f"{first} {what}"] = value
    ours = python_side()
    assert set(ours) == set(header)
    wrong = []
    for key, value in ours.items():
        # The *_init_sized functions take void*: the bindings hand them a struct.
        if value == "*void" and key.endswith("_init_sized arg0") and header[key].startswith("*s"):
            continue
        if value != header[key]:
            wrong.append(f"{key}: bindings {value}, header {header[key]}")
    assert not wrong, "\n".join(wrong)


def test_every_function_and_enum_value_is_known():
    text = HEADER.read_text()
    declared = set(re.findall(r"CB_API\s[^;]*?\b(cb_\w+)\s*\(", text))
    assert declared == set(_native._PROTOTYPES) | UNBOUND
    enumerators = re.findall(r"^\s*(CB_[A-Z0-9_]+)\s*=\s*(\d+)", text, re.M)
    values = {name: int(v) for name, v in enumerators}
    # The experimental header's values of the public enums.
    experimental = (HEADER.parent / "cacheblend_experimental.h").read_text()
    values.update({name: int(v) for name, v in re.findall(
        r"^#define\s+(CB_[A-Z0-9_]+)\s+\(\(cb_\w+\)(\d+)\)", experimental, re.M)})
    ours = {("CB_OK" if s == 0 else "CB_ERR_" + s.name): int(s) for s in cb.Status}
    for enum, prefix in ENUM_PREFIXES.items():
        ours.update({prefix + m.name: int(m) for m in enum})
    assert ours == values
