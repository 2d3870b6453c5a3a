"""Top-1 agreement of q8 and q4 stores with the unquantized model (a report, not a test).

For each architecture of the parity tests: a random model, its logits from transformers with the
original float32 weights, and rkmojo's logits from f16, q8 and q4 stores over the same 104 tokens
(chunked prefill, then decode). Random weights are a harsh case: real checkpoints have more
peaked distributions, so their agreement is higher.

    .venv/bin/python benchmarks/quant_agreement.py
"""

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from parity import build_checkpoint  # noqa: E402
from test_parity import ARCHS  # noqa: E402

from inference.convert import convert  # noqa: E402
from inference.model import load_model  # noqa: E402


def main() -> None:
    print(f"{'architecture':<24}{'quant':<7}{'top-1 agreement':>16}{'max |Δ| / range':>18}")
    for arch, make in ARCHS.items():
        cls, cfg = make()
        with tempfile.TemporaryDirectory() as d:
            src = build_checkpoint(cls, cfg, Path(d) / "hf")
            ref_model = cls.from_pretrained(src, dtype=torch.float32).eval()
            ids = np.random.default_rng(0).integers(0, cfg.vocab_size, 104)
            with torch.no_grad():
                ref = ref_model(torch.tensor(ids[None])).logits[0].numpy()
            for quant in ("f16", "q8", "q4"):
                m = load_model(convert(src, Path(d) / quant, quant, progress=False), chunk=16)
                cache = m.new_cache()
                ours = np.concatenate(
                    [m.forward(ids[:40], cache)] + [m.forward(ids[i : i + 1], cache) for i in range(40, 104)]
                )
                agree = float((ours.argmax(-1) == ref.argmax(-1)).mean())
                err = float((np.abs(ours - ref).max(-1) / (ref.max(-1) - ref.min(-1))).max())
                print(f"{arch:<24}{quant:<7}{agree:>15.1%}{err:>18.2e}")


if __name__ == "__main__":
    main()
