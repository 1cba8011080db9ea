"""Bundles the C library into the package when one is built.

`pip install ./bindings/python` after `make build` (or `make install`)
copies `libcacheblend.so.0` (and the CUDA plugin, when it was built) into
the installed package, so `import cacheblend` needs no environment
variable.  Where the library comes from, first found:

  $CACHEBLEND_LIBRARY at install time; the checkout's build/lib/ (make build),
  build-install/lib/ (make install's tree).

Without one the package installs as pure Python and finds the library at
import time (README.md, "How the library is found").
"""
import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parents[1]
LIBRARY = "libcacheblend.so.0"
PLUGIN = "libcacheblend-cuda.so.0"


def built_library():
    env = os.environ.get("CACHEBLEND_LIBRARY")
    if env:
        path = Path(env)
        if not path.is_file():
            raise SystemExit(f"CACHEBLEND_LIBRARY={env}: no such file")
        return path
    for tree in ("build", "build-install"):
        path = CHECKOUT / tree / "lib" / LIBRARY
        if path.is_file():
            return path
    return None


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        library = built_library()
        if library is None:
            print("cacheblend: no built libcacheblend.so.0 found; installing the bindings "
                  "alone (they look for the library when imported)")
            return
        target = Path(self.build_lib) / "cacheblend"
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(library.resolve(), target / LIBRARY)
        plugin = library.parent / PLUGIN
        if plugin.is_file():  # the CUDA backend is loaded from beside the library
            shutil.copy2(plugin.resolve(), target / PLUGIN)
        print(f"cacheblend: bundled {library}")


class PlatformDistribution(Distribution):
    # A wheel that may hold a compiled library is specific to its platform.
    def has_ext_modules(self):
        return built_library() is not None


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=PlatformDistribution)
