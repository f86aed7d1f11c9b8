"""The native engine's C kernels, built at install as an optional extension (pyproject.toml holds the rest).

Optional: without a compiler (or where the build fails) specedge still installs, and the plan and `specedge models`
say the native engine is missing and why (runtime/backends/native_lib.py). -ffp-contract=off: the kernels' float
operations happen in one written order, the same in the portable C and the SIMD paths (csrc/native/se.h), so the
compiler must not fuse a multiply and an add on its own. Each source compiles on a core of its own (26 -> 13 s on
2 cores), the objects linked in the sources' order, so the library is the one a serial build makes.
"""
import glob
import os
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class ParallelBuildExt(build_ext):
    def build_extension(self, ext):
        serial = self.compiler.compile

        def parallel(sources, *args, **kwargs):
            with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
                parts = list(pool.map(lambda src: serial([src], *args, **kwargs), sources))
            return [obj for objs in parts for obj in objs]
        self.compiler.compile = parallel
        try:
            super().build_extension(ext)
        finally:
            del self.compiler.compile  # the instance attribute: the class's method again


setup(cmdclass={"build_ext": ParallelBuildExt}, ext_modules=[Extension(
    "specedge._native",
    sources=sorted(glob.glob("csrc/native/*.c")),
    depends=sorted(glob.glob("csrc/native/*.h")),
    extra_compile_args=["-O3", "-std=gnu11", "-ffp-contract=off", "-fno-math-errno", "-pthread"],
    extra_link_args=["-pthread", "-lm"],
    optional=True,
)])
