"""Builds the compiled kernels (a plain C library loaded through ctypes, see inference/kernels/).

The kernels are tuned for the machine that builds them (`-march=native`, `-mcpu=native` on arm).
RKMOJO_ARCH_FLAGS replaces that choice for a build meant for another machine, e.g. the image's
aarch64 wheel: `RKMOJO_ARCH_FLAGS="-march=armv8-a -mtune=cortex-a76"` (see docs/image.md).
"""

import os
import platform
import shlex

from setuptools import Extension, setup


def arch_flags() -> list[str]:
    given = os.environ.get("RKMOJO_ARCH_FLAGS", "").strip()
    if given:
        flags = shlex.split(given)
        if not all(f.startswith("-m") for f in flags):
            raise SystemExit(f"RKMOJO_ARCH_FLAGS={given!r}: give only -m options (-march=, -mcpu=, -mtune=)")
        return flags
    machine = platform.machine().lower()
    return ["-march=native"] if machine in ("x86_64", "amd64") else ["-mcpu=native"]


# link-time optimization: the steps' units (rkdecode.c, rkmoedecode.c, rkgemma4.c) call the matmuls of
# rkkernels.c as one unit's code would, inlined where the compiler sees fit
OPTIMIZE = ["-O3", "-flto=auto"]


def kernel_builds() -> list[Extension]:
    """The native build, and on x86 the same source with AVX-512 or all SIMD ruled out, so one machine
    can time each path (RKMOJO_KERNELS=avx2|scalar picks one at import, see inference/kernels). The AVX2
    build is compiled without AVX-512 at all (-mno-avx512f): otherwise the compiler still encodes its
    AVX2 code with EVEX and 32 vector registers, which an AVX2-only CPU (and valgrind) cannot run."""
    variants = [("_rkkernels", [])]
    if platform.machine().lower() in ("x86_64", "amd64") and not os.environ.get("RKMOJO_ARCH_FLAGS"):
        variants += [("_rkkernels_avx2", ["-DRK_NO_AVX512", "-mno-avx512f"]), ("_rkkernels_scalar", ["-DRK_NO_SIMD"])]
    return [
        Extension(
            f"inference.kernels.{name}",
            sources=[
                "inference/kernels/rkkernels.c",
                "inference/kernels/rkattention.c",
                "inference/kernels/rkdecode.c",
                "inference/kernels/rkmoedecode.c",
                "inference/kernels/rkgemma4.c",
            ],
            depends=[
                "inference/kernels/rkkernels_simd.h",
                "inference/kernels/arch/x86.h",
                "inference/kernels/arch/neon.h",
                "inference/kernels/arch/scalar.h",
                "inference/kernels/rkinternal.h",
                "inference/kernels/rkdescriptors.h",
                "inference/kernels/rkpool.h",
                "inference/kernels/rkpython.h",
            ],
            extra_compile_args=[*OPTIMIZE, "-fopenmp", "-std=c11", *arch_flags(), f"-DRK_MODULE={name}", *flags],
            extra_link_args=[*OPTIMIZE, "-fopenmp", *arch_flags(), *flags],
            libraries=["m"],
        )
        for name, flags in variants
    ]


setup(ext_modules=kernel_builds())
