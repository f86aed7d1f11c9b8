"""The native engine's C kernels, built at install as an optional extension (pyproject.toml holds the rest).

Optional: without a compiler (or where the build fails) specedge still installs, and the plan and `specedge models`
say the native engine is missing and why (runtime/backends/native_lib.py). -ffp-contract=off: the kernels' float
operations happen in one written order, the same in the portable C and the SIMD paths (csrc/native/se.h), so the
compiler must not fuse a multiply and an add on its own.
"""
import glob

from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "specedge._native",
    sources=sorted(glob.glob("csrc/native/*.c")),
    depends=sorted(glob.glob("csrc/native/*.h")),
    extra_compile_args=["-O3", "-std=gnu11", "-ffp-contract=off", "-fno-math-errno", "-pthread"],
    extra_link_args=["-pthread", "-lm"],
    optional=True,
)])
