"""Run inside the image's arm64 root filesystem under qemu-aarch64 (test_npu_emulated.py): the board's
own Python, venv and NEON kernels, with the librknnrt stand-in at the runtime's path.

    python npu_emulated_run.py DENSE_STORE MOE_STORE   → one JSON object on stdout

For each store, greedy tokens with the CPU backend and with `auto` (which on aarch64 loads
/usr/lib/librknnrt.so, runs the self-test and, when it passes, puts prefill's dense matmuls on the
"NPU"), in fp16 and int8, and the backend's name and reason. Imports only the installed project.
"""

import json
import platform
import sys

from inference.engine import Engine

PROMPT = "The three largest cities of France, in order of population, are"
TOKENS = 8


def greedy(engine, prompt: list[int]) -> list[int]:
    out = [int(engine.forward(prompt)[-1].argmax())]
    while len(out) < TOKENS:
        out.append(int(engine.forward([out[-1]])[-1].argmax()))
    return out


def runs(store: str, prompt_of) -> dict:
    got = {}
    for name, kw in {
        "cpu": {"backend": "cpu"},
        "auto": {"backend": "auto"},
        "rknpu-int8": {"backend": "rknpu", "npu_precision": "int8"},
    }.items():
        eng = Engine.open(store, chunk=64, **kw)
        got[name] = {
            "backend": eng.backend.name,
            "reason": eng.backend.reason,
            "tokens": greedy(eng, prompt_of(eng)),
        }
        eng.close()
    return got


def main(dense: str, moe: str) -> None:
    text = lambda eng: eng.tokenizer.encode(PROMPT * 3)  # noqa: E731  (over 32 rows: the NPU takes them)
    numbers = lambda eng: [int(c) for c in "31415926535897932384626433832795028841971693993751"]  # noqa: E731
    print(json.dumps({"machine": platform.machine(), "dense": runs(dense, text), "moe": runs(moe, numbers)}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
