"""How much int8 activations ("q8") change a model's predictions against the exact float path ("f32").

Text: Python's own documentation topics (`pydoc_data.topics`, shipped with every CPython), the first
--tokens tokens, teacher-forced in one prefill, or with `--decode` one token at a time (the decode
step: on Llama models the compiled one, `kernels.llama_decode`, whose last bits differ from the
prefill's Python layers; `f32 decode` then also compares it with the f32 prefill; the tiny models
decode too, and Gemma 4 once more with int8 in its experts only, its dense products float as they were
before they took int8). Reported per model: top-1 agreement of the two paths, each path's perplexity
on the text, and the worst |Δlogit| / logit range. SmolLM2 (the demo GGUF, Q4_1) is a trained model;
the tiny MoE models of the parity tests have random weights (q4 stores), where the text is just ids
and only agreement means something.

    .venv/bin/python benchmarks/activation_agreement.py [--tokens 1024] [--store DIR] [--decode] [--no-repack]

Each model is repacked for its mode as the engine does (`kernels.repack.repack_model`; `--no-repack`:
the store layout, the row-major kernels).
"""

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from inference import kernels  # noqa: E402
from inference.kernels.repack import repack_model  # noqa: E402
from inference.model import load_model  # noqa: E402


def corpus() -> str:
    import pydoc_data.topics

    topics = pydoc_data.topics.topics
    return "\n\n".join(topics[k] for k in sorted(topics))


def logits_by_mode(
    store, ids: np.ndarray, chunk: int = 128, decode: bool = False, repacked: bool = True
) -> dict[str, np.ndarray]:
    out = {}
    for mode in ("f32", "decode" if decode else "q8"):  # decode: the default mode, as a user gets it
        kernels.set_activations(mode)
        m = load_model(store, chunk=chunk)
        if repacked:  # as Engine.open does: the matrices of this mode's int8 one-row products, rows in lanes
            repack_model(m, mode)
        cache = m.new_cache()
        if decode:
            out["q8" if mode == "decode" else mode] = np.concatenate(
                [m.forward(ids[i : i + 1], cache) for i in range(len(ids))]
            )
        else:
            out[mode] = m.forward(ids, cache)
    kernels.set_activations("f32")
    return out


NOISE = 4e-3  # about int8's rounding of a block of 32 (±½ of max|x|/127), as a relative error


def noisy_f32(store, ids: np.ndarray, chunk: int = 16) -> dict[str, np.ndarray]:
    """f32 decode as is ("f32") and with each token's embedding row × (1 + NOISE·N(0, 1)) ("q8"): a model
    this perturbation alone moves far is chaotic, and top-1 agreement there measures the model, not the
    kernels (random tiny models, unlike trained ones, can be)."""
    kernels.set_activations("f32")
    out, rng = {}, np.random.default_rng(0)
    for name, eps in (("f32", 0.0), ("q8", NOISE)):
        m = load_model(store, chunk=chunk)
        if eps:

            def embed_ids(t, embed=m.embed_ids, H=m.args.hidden_size):
                return embed(t) * (1.0 + NOISE * rng.standard_normal((len(t), H))).astype(np.float32)

            m.embed_ids = embed_ids
        cache = m.new_cache()
        out[name] = np.concatenate([m.forward(ids[i : i + 1], cache) for i in range(len(ids))])
    return out


def perplexity(logits: np.ndarray, ids: np.ndarray) -> float:
    z = logits[:-1].astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(np.exp(-logp[np.arange(len(ids) - 1), ids[1:]].mean()))


def report(name: str, lg: dict[str, np.ndarray], ids: np.ndarray) -> None:
    f, q = lg["f32"], lg["q8"]
    agree = float((f.argmax(-1) == q.argmax(-1)).mean())
    err = float((np.abs(q - f).max(-1) / (f.max(-1) - f.min(-1))).max())
    print(
        f"{name:<28}{len(ids):>7}{agree:>10.2%}{perplexity(f, ids):>11.3f}{perplexity(q, ids):>11.3f}{err:>12.2e}",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--store", default=None, help="SmolLM2 store (default: the demo model, converted if needed)")
    p.add_argument("--no-tiny", action="store_true", help="skip the tiny random MoE models")
    p.add_argument(
        "--decode",
        action="store_true",
        help="also one token at a time, in the decode mode (SmolLM2: its compiled step; the tiny models too, "
        "and Gemma 4 with int8 in its experts only, as before its dense products took int8)",
    )
    p.add_argument(
        "--no-repack", action="store_true", help="keep the store layout (the engine repacks, see kernels.repack)"
    )
    a = p.parse_args()
    from inference.demo import demo_gguf
    from inference.store import Store
    from inference.tokenizer import StoreTokenizer

    print(f"kernels {kernels.BACKEND} (int8 dot: {kernels.DOT}); text: pydoc_data.topics")
    print(f"{'model':<28}{'tokens':>7}{'top-1 =':>10}{'ppl f32':>11}{'ppl q8':>11}{'max|Δ|/rng':>12}")
    with tempfile.TemporaryDirectory() as d:
        store = a.store
        if store is None:
            from inference.convert.gguf import convert_gguf

            store = convert_gguf(demo_gguf(), Path(d) / "smollm2", progress=False)
        ids = np.array(StoreTokenizer(Store(store)).encode(corpus())[: a.tokens])
        rp = not a.no_repack
        lg = logits_by_mode(store, ids, repacked=rp)
        report("smollm2-135m (Q4_1)", lg, ids)
        if a.decode:
            dec = logits_by_mode(store, ids, decode=True, repacked=rp)
            report("smollm2-135m, decode", dec, ids)
            report("  f32 decode vs f32 prefill", {"f32": lg["f32"], "q8": dec["f32"]}, ids)
        if a.no_tiny:
            return
        from parity import build_checkpoint
        from test_parity import ARCHS

        from inference.convert import convert

        for arch in ("qwen3_moe", "gemma4", "olmoe"):
            cls, cfg = ARCHS[arch]()
            src = build_checkpoint(cls, cfg, Path(d) / arch / "hf")
            st = convert(src, Path(d) / arch / "q4", "q4", progress=False)
            tids = ids % cfg.vocab_size
            report(f"tiny {arch} (q4, random)", logits_by_mode(st, tids, chunk=16, repacked=rp), tids)
            if a.decode:
                report(f"tiny {arch}, decode", logits_by_mode(st, tids, chunk=16, decode=True, repacked=rp), tids)
            if a.decode and arch == "gemma4":  # its generated tokens' dense products without int8, as before
                from inference.models import gemma4

                gemma4.Model.int8_dense_decode = False
                dec = logits_by_mode(st, tids, chunk=16, decode=True, repacked=rp)
                gemma4.Model.int8_dense_decode = True
                report("  int8 in its experts only", dec, tids)
            if a.decode:  # how far a perturbation of int8's size alone moves this random model
                report(f"  f32, embedding ×(1+{NOISE:g}·N)", noisy_f32(st, tids), tids)


if __name__ == "__main__":
    main()
