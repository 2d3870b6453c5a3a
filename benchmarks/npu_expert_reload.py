"""What re-setting B costs when a routed expert goes to the NPU (inference/backends/rknpu/experts.py: B
per call, not per cache slot), against the CPU computing the same expert, on Gemma 4 26B-A4B's expert
shape (gate/up 704×2816, down 2816×704, q4 as the store keeps them).

B re-set = our conversion (q4 → fp16 Wᵀ, or → int8 per channel) + the library's
`rknn_B_normal_layout_to_native_layout`. Against the librknnrt stand-in (tests/rknnrt_standin.c) the
second part is the stand-in's C loop, not Rockchip's; the NPU's run time is not measured here at all
(the stand-in computes on the CPU): only a board gives that, through `rkmojo npu calibrate`.

    cc -O3 -shared -fPIC -o /tmp/librknnrt.so tests/rknnrt_standin.c
    .venv/bin/python benchmarks/npu_expert_reload.py /tmp/librknnrt.so [--repeats 5]
"""

import argparse
import statistics
import time

import numpy as np

from inference import kernels
from inference.backends.rknpu import experts as npu_experts
from inference.backends.rknpu import pack
from inference.backends.rknpu.matmul import Runtime
from inference.models.base import silu
from inference.models.moe import experts_mlp
from inference.quant import quantize

H, F = 2816, 704


def seconds(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("library", help="librknnrt.so (here: the stand-in built from tests/rknnrt_standin.c)")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    w = {
        name: quantize((rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32), "q4")
        for name, shape in (("gate", (F, H)), ("up", (F, H)), ("down", (H, F)))
    }
    rt = Runtime(a.library)
    print(f"Gemma 4 expert (gate/up {F}×{H}, down {H}×{F}, q4), median of {a.repeats}")
    for kind in ("fp16", "int8"):
        ctx = npu_experts._ExpertContexts(rt, 32, H, F, kind, core=0)
        try:
            convert = [seconds(lambda k=kind: [pack.b_block(w[n], k) for n in w]) for _ in range(a.repeats)]
            load = [seconds(lambda c=ctx: c.load(w, None)) for _ in range(a.repeats)]
        finally:
            ctx.close()
        c, t = statistics.median(convert), statistics.median(load)
        b_bytes = 3 * H * F * (2 if kind == "fp16" else 1)
        print(
            f"  {kind}: B re-set {t * 1e3:.1f} ms ({b_bytes / 2**20:.1f} MiB of B): our conversion {c * 1e3:.1f} ms, "
            f"the library's layout change and copies {max(t - c, 0) * 1e3:.1f} ms"
        )
    with kernels.configured():
        for r in (8, 32, 128):
            x = rng.standard_normal((r, H)).astype(np.float32)
            cpu = statistics.median(seconds(lambda x=x: experts_mlp([(x, w)], silu)) for _ in range(a.repeats))
            print(f"  CPU kernels, the same expert on {r} rows: {cpu * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
