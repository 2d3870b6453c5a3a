"""llama.cpp decode speed on a GGUF, by token ids (run with a Python that has llama-cpp-python).

    python benchmarks/llamacpp_decode.py MODEL.gguf --tokens 128 --threads 2 [--no-repack]

Prints one JSON line: {"tok_s", "prefill_tok_s", "tokens", "peak_rss_mib", "repack"}. Greedy
decoding after a fixed prompt of ids, the same workload `smollm2_vs_llamacpp.py` gives rkmojo.
`--no-repack` keeps weights in the mmap (repacked weights are anonymous memory, which a memory
cgroup cannot page out).
"""

import argparse
import json
import resource
import time

import llama_cpp
import numpy as np


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("gguf")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt", default="300,301,302,303,304,305,306,307")
    p.add_argument("--no-repack", action="store_true")
    a = p.parse_args()
    if a.no_repack:
        default = llama_cpp.llama_model_default_params

        def params():
            mp = default()
            mp.use_extra_bufts = False
            return mp

        llama_cpp.llama_model_default_params = params
        llama_cpp.llama.llama_cpp.llama_model_default_params = params
    llm = llama_cpp.Llama(
        model_path=a.gguf,
        n_threads=a.threads,
        n_threads_batch=a.threads,
        n_ctx=2048,
        n_batch=128,
        verbose=False,
        use_mmap=True,
        logits_all=True,
    )
    prompt = [int(t) for t in a.prompt.split(",")]
    t = time.perf_counter()
    llm.eval(prompt)
    prefill = len(prompt) / (time.perf_counter() - t)
    t = time.perf_counter()
    for _ in range(a.tokens):
        llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
    tok_s = a.tokens / (time.perf_counter() - t)
    print(
        json.dumps(
            {
                "tok_s": tok_s,
                "prefill_tok_s": prefill,
                "tokens": a.tokens,
                "repack": not a.no_repack,
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


if __name__ == "__main__":
    main()
