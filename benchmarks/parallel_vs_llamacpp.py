"""N answers at once: rkmojo's batcher (`inference.batch`) against llama.cpp's server with `--parallel N`
(continuous batching), on the demo GGUF, taking turns in one run.

Each round, for each N (rotating order) and each side (alternating which goes first): N requests sent at
once, each a different short question answered with `--tokens` tokens (greedy; the end of text biased
away on both sides, so every answer has its full length). Timed from the first request to the last
answer: aggregate tok/s = N × tokens / wall time, prompts included (they are ~20 tokens). rkmojo runs in
this process on the store converted from the same GGUF, with `--threads` kernel threads; llama.cpp's
server (a `llama-server` binary built from llama.cpp's sources, `--server`) with the same threads, N
slots and a context of 1024 per slot.

    .venv/bin/python benchmarks/parallel_vs_llamacpp.py --server PATH/llama-server [--counts 1,2,4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

QUESTIONS = [
    "Tell me about the sea.",
    "Describe a walk in a forest.",
    "What makes a good breakfast?",
    "Explain how a bicycle works.",
    "Write about a city at night.",
    "What is the best season and why?",
    "Describe an old library.",
    "Tell me about mountains.",
]


def chat_prompt(q: str) -> str:
    return f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"


class LlamaServer:
    def __init__(self, binary: str, gguf: Path, n: int, threads: int, port: int):
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [
                binary,
                "-m",
                str(gguf),
                "-np",
                str(n),
                "-c",
                str(1024 * n),
                "-t",
                str(threads),
                "-tb",
                str(threads),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-webui",
                "-ngl",
                "0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.close()
        raise RuntimeError("llama-server did not start")

    def complete(self, prompt: str, tokens: int) -> int:
        body = {"prompt": prompt, "n_predict": tokens, "temperature": 0, "ignore_eos": True, "cache_prompt": False}
        req = urllib.request.Request(
            self.url + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=600) as r:
            return int(json.loads(r.read())["tokens_predicted"])

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def run_llama(server: LlamaServer, n: int, tokens: int) -> float:
    counts: list[int] = []

    def one(i: int) -> None:
        counts.append(server.complete(chat_prompt(QUESTIONS[i]), tokens))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def run_rkmojo(engine, n: int, tokens: int) -> float:
    from inference.batch import Batcher
    from inference.events import TokenEvent

    b = Batcher(engine, slots=n)
    params = {"max_tokens": tokens, "temperature": 0, "logit_bias": {i: -100 for i in engine.tokenizer.eos_ids}}
    t0 = time.perf_counter()
    seqs = [b.generate(engine.tokenizer.encode(chat_prompt(QUESTIONS[i])), params) for i in range(n)]
    b.run_until_idle()
    wall = time.perf_counter() - t0
    return sum(sum(isinstance(e, TokenEvent) for e in s.events.queue) for s in seqs) / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", required=True, help="a llama-server binary")
    ap.add_argument("--counts", default="1,2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--port", type=int, default=8781)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    counts = [int(x) for x in args.counts.split(",")]

    from inference import kernels
    from inference.convert.gguf import convert_gguf
    from inference.demo import demo_gguf
    from inference.engine import Engine

    gguf = demo_gguf()
    store = convert_gguf(gguf, Path(tempfile.mkdtemp(prefix="parallel-vs-")) / "store", progress=False)
    engine = Engine.open(store, threads=args.threads)
    kernels.set_threads(args.threads)
    servers = {n: LlamaServer(args.server, gguf, n, args.threads, args.port + n) for n in counts}
    res: dict = {n: {"rkmojo": [], "llama.cpp": []} for n in counts}
    try:
        for r in range(args.rounds):
            for n in counts[r % len(counts) :] + counts[: r % len(counts)]:
                sides = [
                    ("rkmojo", lambda n=n: run_rkmojo(engine, n, args.tokens)),
                    ("llama.cpp", lambda n=n: run_llama(servers[n], n, args.tokens)),
                ]
                for name, fn in sides if (r + n) % 2 == 0 else sides[::-1]:
                    res[n][name].append(fn())
            print(
                f"round {r + 1}: "
                + ", ".join(
                    f"N={n} rkmojo {res[n]['rkmojo'][-1]:.1f} llama.cpp {res[n]['llama.cpp'][-1]:.1f}" for n in counts
                ),
                flush=True,
            )
    finally:
        for s in servers.values():
            s.close()
    out = {"counts": counts, "rounds": args.rounds, "tokens": args.tokens, "threads": args.threads, "runs": res}
    print(
        f"{'N':>3}  {'rkmojo tok/s':>12}  {'vs N=1':>6}  {'llama.cpp tok/s':>15}  {'vs N=1':>6}  {'rkmojo / llama.cpp':>18}"
    )
    base = {side: statistics.median(res[counts[0]][side]) for side in ("rkmojo", "llama.cpp")}
    for n in counts:
        a, b = statistics.median(res[n]["rkmojo"]), statistics.median(res[n]["llama.cpp"])
        ratios = [x / y for x, y in zip(res[n]["rkmojo"], res[n]["llama.cpp"])]
        out[str(n)] = {"rkmojo": a, "llama.cpp": b, "ratio": statistics.median(ratios)}
        print(
            f"{n:>3}  {a:>12.1f}  {a / base['rkmojo']:>6.2f}  {b:>15.1f}  {b / base['llama.cpp']:>6.2f}  {statistics.median(ratios):>18.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
