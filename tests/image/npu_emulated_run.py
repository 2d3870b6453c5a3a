"""Run inside the image's arm64 root filesystem under qemu-aarch64 (test_npu_emulated.py): the board's
own Python, venv and NEON kernels, with the librknnrt stand-in at the runtime's path.

    python npu_emulated_run.py matmuls DENSE_STORE MOE_STORE   → one JSON object on stdout
    python npu_emulated_run.py graphs DIR                      → one JSON object on stdout

matmuls: for each store (no graphs in it), greedy tokens with the CPU backend and with `auto` (which on
aarch64 loads /usr/lib/librknnrt.so, runs the self-test and, when it passes, puts prefill's dense
matmuls on the "NPU"), in fp16 and int8, the top-1 token at every prompt row, and the backend's name
and reason.

graphs: DIR holds dense-fp16, moe-fp16 (and dense-w8a8, moe-w8a8 when built), stores with `.rknn`
graphs of `rkmojo npu build --keep-onnx` for 32-row chunks; `rknnlite` must be importable (the tests'
stand-in, tests/rknnlite_standin, which evaluates each graph's ONNX). Greedy tokens with the CPU, with
`rknpu` and `auto` (both should take the graphs), the top-1 token at every prompt row, and the names
of the graphs that ran.

Imports only the installed project (and rknnlite for the graphs).
"""

import json
import os
import platform
import sys

from inference.engine import Engine

PROMPT = "The three largest cities of France, in order of population, are"
TOKENS = 8
GRAPH_ROWS = 32  # the chunk the graphs are compiled for (test_npu_emulated.py)


def greedy(engine, prompt: list[int]) -> tuple[list[int], list[int]]:
    """(the top-1 token at every prompt row, the greedy continuation)."""
    top1 = [int(t) for t in engine.forward(prompt, last_only=False).argmax(-1)]
    out = [top1[-1]]
    while len(out) < TOKENS:
        out.append(int(engine.forward([out[-1]])[-1].argmax()))
    return top1, out


def graphs_run(engine) -> list[str]:
    """The names of the graphs the engine runs from now on, in order (empty when it has none)."""
    runs: list[str] = []
    for g in getattr(engine.backend.backend, "graphs", {}).values():
        inference = g.rt.inference
        g.rt.inference = lambda inputs, f=inference, name=g.path.name: runs.append(name) or f(inputs=inputs)
    return runs


def runs(store: str, prompt_of, chunk: int, options: dict) -> dict:
    got = {}
    for name, kw in options.items():
        eng = Engine.open(store, chunk=chunk, **kw)
        ran = graphs_run(eng)
        top1, tokens = greedy(eng, prompt_of(eng))
        got[name] = {
            "backend": eng.backend.name,
            "reason": eng.backend.reason,
            "top1": top1,
            "tokens": tokens,
            "graphs": sorted(set(ran)),
        }
        eng.close()
    return got


def text(eng) -> list[int]:
    return eng.tokenizer.encode(PROMPT * 3)  # over 32 rows: the NPU takes them


def numbers(eng) -> list[int]:
    return [int(c) for c in "31415926535897932384626433832795028841971693993751"]


def matmuls(dense: str, moe: str) -> dict:
    options = {
        "cpu": {"backend": "cpu"},
        "auto": {"backend": "auto"},
        "rknpu-int8": {"backend": "rknpu", "npu_precision": "int8"},
    }
    return {"dense": runs(dense, text, 64, options), "moe": runs(moe, numbers, 64, options)}


def whole_chunks(prompt_of):
    """The prompt cut to two whole chunks: every prompt row, the last included, goes through the graphs
    (in a shorter last chunk the CPU would compute the rows whose logits give the first token, and only
    the graphs' k and v of the earlier rows would reach it)."""
    return lambda eng: (prompt_of(eng) * 2)[: 2 * GRAPH_ROWS]


def graphs(root: str) -> dict:
    import rknnlite

    got = {"rknnlite": rknnlite.__file__}  # which one: the image's venv holds the real rknn-toolkit-lite2 too
    for model, prompt_of in (("dense", whole_chunks(text)), ("moe", whole_chunks(numbers))):
        got[model] = runs(
            f"{root}/{model}-fp16",
            prompt_of,
            GRAPH_ROWS,
            {"cpu": {"backend": "cpu"}, "rknpu": {"backend": "rknpu"}, "auto": {"backend": "auto"}},
        )
        if os.path.isdir(f"{root}/{model}-w8a8"):
            got[model] |= runs(f"{root}/{model}-w8a8", prompt_of, GRAPH_ROWS, {"rknpu-w8a8": {"backend": "rknpu"}})
    return got


def main(what: str, *args: str) -> None:
    got = {"matmuls": matmuls, "graphs": graphs}[what](*args)
    print(json.dumps({"machine": platform.machine(), **got}))


if __name__ == "__main__":
    main(*sys.argv[1:])
