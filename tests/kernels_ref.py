"""The reference the kernels are tested against, and builds of rkkernels.c other than the installed one.

`reference` is x @ dequantize(W).T in float64. A kernel result passes when every element is within
`rel` of |x| @ |W|.T, the scale its rounding errors grow with (a cancelling sum can be near zero).

Other builds: the portable C backend and, on AVX-512 machines, the AVX2 one (compiled here into shared
libraries and loaded like the real one) and the NEON backend (cross-compiled with a small driver and run under qemu-aarch64), so an x86
CI machine checks every backend's arithmetic.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

from inference.kernels._lib import _KIND_CODES, Q8A
from inference.quant import dequantize, part_layout, quantize

KERNELS = Path(__file__).resolve().parent.parent / "inference" / "kernels"
# the library's compilation units, as setup.py lists them (inference/kernels/rkinternal.h)
KERNEL_SOURCES = [KERNELS / f"{unit}.c" for unit in ("rkkernels", "rkattention", "rkdecode", "rkmoedecode", "rkgemma4")]


def reference(x: np.ndarray, w) -> np.ndarray:
    """x @ W.T in float64 from the dequantized weight."""
    return x.astype(np.float64) @ dequantize(w).astype(np.float64).T


def assert_close(y: np.ndarray, x: np.ndarray, w, rel: float = 1e-5) -> None:
    """Every y[t, o] within `rel` · (|x| @ |W|.T)[t, o] of the float64 reference."""
    wd = dequantize(w).astype(np.float64)
    ref = x.astype(np.float64) @ wd.T
    scale = np.abs(x).astype(np.float64) @ np.abs(wd).T + 1e-30
    err = np.abs(y - ref) / scale
    worst = np.unravel_index(np.argmax(err), err.shape)
    assert err.max() <= rel, f"{w.kind} {w.shape}: error {err.max():.2e} of |x||W| at {worst} (allowed {rel:.0e})"


def int8_activations(x: np.ndarray) -> np.ndarray:
    """x as the "q8" activation path sees it: each block of 32 rounded (half away from zero) to int8 steps
    of max|x| / 127, given back as float32."""
    xb = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.sign(xb) * np.floor(np.abs(xb * inv) + np.float32(0.5))
    return (q * (amax / np.float32(127))).reshape(x.shape).astype(np.float32)


def halfway_row(inn: int) -> np.ndarray:
    """An activation row whose every block of 32 has max|x| = 127, so the int8 step is 1 and x is its own
    scaled value: halves (k + 0.5, either sign), where rounding half to even would differ from half away."""
    x = (np.arange(inn) % 254 - 126).astype(np.float32) + np.float32(0.5)
    x[::32] = 127.0
    return x


def random_weight(kind: str, out: int, inn: int, rng: np.random.Generator):
    """A quantized random matrix with a few rows of larger magnitude, so scales differ per row/group."""
    w = rng.standard_normal((out, inn), dtype=np.float32) * rng.uniform(0.01, 2.0, (out, 1)).astype(np.float32)
    return quantize(w, kind)


# ------------------------------------------------------------------ the portable C build


def build_variant(out_dir: Path, name: str, flags: list[str]) -> Path | None:
    """The kernel library built with `flags` as a shared library; None without a C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    lib = out_dir / f"rkkernels_{name}.so"
    cmd = [
        cc,
        "-O2",
        "-std=c11",
        "-pthread",
        "-fPIC",
        "-shared",
        "-DRK_NO_PYTHON",
        *flags,
        *map(str, KERNEL_SOURCES),
        "-o",
        str(lib),
        "-lm",
    ]
    subprocess.run(cmd, check=True, capture_output=True)
    return lib


def build_portable(out_dir: Path) -> Path | None:
    """The kernel library with the SIMD backends disabled; None without a C compiler."""
    return build_variant(out_dir, "portable", ["-DRK_NO_SIMD"])


def build_avx2(out_dir: Path) -> Path | None:
    """The native build with AVX-512 ruled out: AVX2 on x86 machines that have it; None without a C compiler."""
    return build_variant(out_dir, "avx2", ["-march=native", "-DRK_NO_AVX512"])


# ------------------------------------------------------------------ the NEON build under qemu

# Reads one call from stdin (header of int64: kind, threads, T, out, in, bytes of the 3 parts; then x
# and the parts) and writes y to stdout; with the argument "decode", one rk_llama_decode call.
_DRIVER_C = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int rk_linear(int, int64_t, int64_t, int64_t, const float *, float *, const void *, const void *, const void *);
int rk_llama_decode(const int64_t *);
int rk_moe_decode_layer(const int64_t *, int64_t);
int rk_moe_experts(int, int64_t, int64_t, int64_t, const float *, const int64_t *, float *);
int rk_gemma4_attn(const int64_t *, int64_t);
int rk_gemma4_route(const int64_t *, int64_t);
int rk_gemma4_ffn_out(const int64_t *, int64_t);
int rk_moe_experts_act(int, int64_t, int64_t, int64_t, int64_t, const float *, const int64_t *, float *);
void rk_moe_combine(int64_t, int64_t, const float *, const float *, float *);
int rk_repack_q4(int64_t, int64_t, const uint8_t *, const uint16_t *, const uint16_t *, uint8_t *, uint16_t *,
                 uint16_t *);
void rk_set_threads(int);
const char *rk_backend(void);
static void *slurp(int64_t n) {
    void *p = malloc(n + 1);
    if (n && fread(p, 1, n, stdin) != (size_t)n) exit(3);
    return p;
}
/* "decode": header (threads, descriptor length, blobs, relocations), the descriptor, each blob as its
 * length then its bytes, relocations (descriptor index, blob index: that field becomes the blob's
 * address); runs rk_llama_decode and writes every blob back, in order. "moe_layer L": the same with
 * rk_moe_decode_layer(desc, L); "moe_experts": the descriptor is (n, H, I, flag, x, y, w, h, K, then the
 * n experts' fields): rk_moe_experts, then rk_moe_combine; "gemma4_attn L", "gemma4_route L",
 * "gemma4_ffn_out L": as "moe_layer" with rk_gemma4_attn, rk_gemma4_route, rk_gemma4_ffn_out (desc, L);
 * "experts_act A": the descriptor is (n, H, I, flag, x, y, then the n experts' fields):
 * rk_moe_experts_act with activation A. */
static int decode(int mode, int64_t layer) {
    int64_t h[4];
    if (fread(h, 8, 4, stdin) != 4) return 2;
    rk_set_threads((int)h[0]);
    int64_t *desc = slurp(8 * h[1]), *len = malloc(8 * h[2] + 8);
    void **blob = malloc(sizeof(void *) * h[2] + 8);
    for (int64_t b = 0; b < h[2]; b++) {
        if (fread(&len[b], 8, 1, stdin) != 1) return 2;
        blob[b] = slurp(len[b]);
    }
    int64_t *rel = slurp(16 * h[3]);
    for (int64_t r = 0; r < h[3]; r++) desc[rel[2 * r]] = (int64_t)(intptr_t)blob[rel[2 * r + 1]];
    int rc;
    if (mode == 0)
        rc = rk_llama_decode(desc);
    else if (mode == 1)
        rc = rk_moe_decode_layer(desc, layer);
    else if (mode == 3)
        rc = rk_gemma4_attn(desc, layer);
    else if (mode == 4)
        rc = rk_gemma4_route(desc, layer);
    else if (mode == 5)
        rc = rk_gemma4_ffn_out(desc, layer);
    else if (mode == 6)
        rc = rk_moe_experts_act((int)desc[0], desc[1], desc[2], desc[3], layer, (const float *)(intptr_t)desc[4],
                                desc + 6, (float *)(intptr_t)desc[5]);
    else {
        float *x = (float *)(intptr_t)desc[4], *y = (float *)(intptr_t)desc[5];
        rc = rk_moe_experts((int)desc[0], desc[1], desc[2], desc[3], x, desc + 9, y);
        if (!rc) rk_moe_combine(desc[8], desc[1], y, (const float *)(intptr_t)desc[6], (float *)(intptr_t)desc[7]);
    }
    if (rc) return 10 + rc;
    for (int64_t b = 0; b < h[2]; b++) fwrite(blob[b], 1, len[b], stdout);
    return 0;
}
/* "repack": header (out, in), then the q4 parts q, scales, biases; rk_repack_q4 in place, the parts back. */
static int repack(void) {
    int64_t h[2];
    if (fread(h, 8, 2, stdin) != 2) return 2;
    int64_t nq = h[0] * h[1] / 2, ns = h[0] * (h[1] / 64) * 2;
    uint8_t *q = slurp(nq);
    uint16_t *s = slurp(ns), *m = slurp(ns);
    int rc = rk_repack_q4(h[0], h[1], q, s, m, q, s, m);
    if (rc) return 10 + rc;
    fwrite(q, 1, nq, stdout);
    fwrite(s, 1, ns, stdout);
    fwrite(m, 1, ns, stdout);
    return 0;
}
int main(int argc, char **argv) {
    int64_t h[8];
    if (argc > 1 && !strcmp(argv[1], "repack")) return repack();
    if (argc > 1 && !strcmp(argv[1], "decode")) return decode(0, 0);
    if (argc > 2 && !strcmp(argv[1], "moe_layer")) return decode(1, atoll(argv[2]));
    if (argc > 1 && !strcmp(argv[1], "moe_experts")) return decode(2, 0);
    if (argc > 2 && !strcmp(argv[1], "gemma4_attn")) return decode(3, atoll(argv[2]));
    if (argc > 2 && !strcmp(argv[1], "gemma4_route")) return decode(4, atoll(argv[2]));
    if (argc > 2 && !strcmp(argv[1], "gemma4_ffn_out")) return decode(5, atoll(argv[2]));
    if (argc > 2 && !strcmp(argv[1], "experts_act")) return decode(6, atoll(argv[2]));
    if (argc > 1) { puts(rk_backend()); return 0; }
    if (fread(h, 8, 8, stdin) != 8) return 2;
    rk_set_threads((int)h[1]);
    float *x = slurp(4 * h[2] * h[4]);
    void *p0 = slurp(h[5]), *p1 = slurp(h[6]), *p2 = slurp(h[7]);
    float *y = malloc(4 * h[2] * h[3] + 4);
    int rc = rk_linear((int)h[0], h[2], h[3], h[4], x, y, p0, p1, p2);
    if (rc) return 10 + rc;
    fwrite(y, 4, h[2] * h[3], stdout);
    return 0;
}
"""


class NeonRunner:
    """The NEON build (cross-compiled for the RK3588's Cortex-A76) run under qemu-aarch64."""

    def __init__(self, exe: Path, qemu: str):
        self.exe, self.qemu = exe, qemu
        self.backend = subprocess.run(
            [qemu, str(exe), "backend"], check=True, capture_output=True, text=True
        ).stdout.strip()

    @classmethod
    def build(cls, out_dir: Path, cpu_flag: str = "-mcpu=cortex-a76") -> "NeonRunner | None":
        """None when the cross compiler or qemu-aarch64 is missing."""
        cc, qemu = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")
        if cc is None or qemu is None or sys.platform != "linux":
            return None
        driver = out_dir / "driver.c"
        driver.write_text(_DRIVER_C)
        exe = out_dir / "rkkernels_neon"
        cmd = [
            cc,
            "-O2",
            "-std=c11",
            "-pthread",
            cpu_flag,
            "-static",
            "-DRK_NO_PYTHON",
            str(driver),
            *map(str, KERNEL_SOURCES),
            "-o",
            str(exe),
            "-lm",
        ]
        subprocess.run(cmd, check=True, capture_output=True)
        return cls(exe, qemu)

    def linear(self, x: np.ndarray, w, threads: int = 2, activations: str = "f32") -> np.ndarray:
        parts = [np.ascontiguousarray(w.parts[n]).tobytes() for n in part_layout(w.kind, w.shape)] + [b"", b""]
        out, inn = w.shape
        x = np.ascontiguousarray(x, dtype=np.float32)
        code = _KIND_CODES[w.kind] | (Q8A if activations == "q8" else 0)
        header = struct.pack("<8q", code, threads, x.shape[0], out, inn, *map(len, parts[:3]))
        run = subprocess.run(
            [self.qemu, str(self.exe)],
            input=header + x.tobytes() + b"".join(parts[:3]),
            capture_output=True,
            check=True,
        )
        return np.frombuffer(run.stdout, np.float32).reshape(x.shape[0], out)

    def repack_q4(self, w):
        """rk_repack_q4 in place on q4 matrix `w` (rows a multiple of 16): the repacked parts (q, scales,
        biases) as the emulated call left them."""
        out, inn = w.shape
        parts = [np.ascontiguousarray(w.parts[n]) for n in ("q", "scales", "biases")]
        run = subprocess.run(
            [self.qemu, str(self.exe), "repack"],
            input=struct.pack("<2q", out, inn) + b"".join(p.tobytes() for p in parts),
            capture_output=True,
            check=True,
        )
        got, at = {}, 0
        for name, p in zip(("q", "scales", "biases"), parts):
            got[name] = np.frombuffer(run.stdout[at : at + p.nbytes], p.dtype).copy()
            at += p.nbytes
        return got

    def llama_decode(self, desc: np.ndarray, blobs: list[np.ndarray], relocs: list[tuple[int, int]], threads: int = 2):
        """rk_llama_decode on `desc` whose fields `relocs` (descriptor index, blob index) are replaced by
        the addresses of `blobs` in the emulated process; returns the blobs as the call left them."""
        return self.call(["decode"], desc, blobs, relocs, threads)

    def call(self, args: list[str], desc: np.ndarray, blobs: list[np.ndarray], relocs, threads: int = 2):
        """The driver's decode-like call `args` ("decode", "moe_layer L", "moe_experts") as llama_decode."""
        blobs = [np.ascontiguousarray(b) for b in blobs]
        msg = [struct.pack("<4q", threads, len(desc), len(blobs), len(relocs)), desc.astype("<i8").tobytes()]
        for b in blobs:
            msg += [struct.pack("<q", b.nbytes), b.tobytes()]
        msg.append(np.array(relocs, dtype="<i8").reshape(-1).tobytes())
        run = subprocess.run([self.qemu, str(self.exe), *args], input=b"".join(msg), capture_output=True, check=True)
        out, at = [], 0
        for b in blobs:
            out.append(np.frombuffer(run.stdout[at : at + b.nbytes], b.dtype).reshape(b.shape).copy())
            at += b.nbytes
        return out
