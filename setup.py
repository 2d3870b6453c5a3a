"""Builds the compiled kernels (a plain C library loaded through ctypes, see inference/kernels/)."""
import platform

from setuptools import Extension, setup

machine = platform.machine().lower()
arch_flags = ["-march=native"] if machine in ("x86_64", "amd64") else ["-mcpu=native"]

setup(
    ext_modules=[
        Extension(
            "inference.kernels._rkkernels",
            sources=["inference/kernels/rkkernels.c"],
            depends=["inference/kernels/rkkernels_simd.h", "inference/kernels/rkpool.h", "inference/kernels/rkpython.h"],
            extra_compile_args=["-O3", "-fopenmp", "-std=c11", *arch_flags],
            extra_link_args=["-fopenmp"],
        )
    ]
)
