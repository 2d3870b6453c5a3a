"""Greedy answers through every API (OpenAI chat and completions, streamed and not; Ollama chat, generate and
raw generate; the CLI) agree with each other and are those recorded on main for the kernel build that runs.

One recording per instruction set (`kernels.BACKEND`): the float prompt path sums in vector-width order, so
the AVX-512, AVX2 and scalar builds round differently, and greedy decoding of a 135M model follows the
rounding. Recorded before the contract refactoring, and again when a GGUF model's Q4_1 matrices were
repacked for int8 decode (sums in another order round differently too).

`RKMOJO_RECORD_GREEDY=1 [RKMOJO_KERNELS=avx2|scalar] pytest tests/appliance/test_greedy_outputs.py` writes
the running build's recording again.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inference import kernels

RECORDED = Path(__file__).parents[1] / "fixtures" / "greedy_outputs.json"
ROOT = Path(__file__).resolve().parents[2]
QUESTION = "Name three colours of the rainbow."
ASK = [{"role": "user", "content": QUESTION}]
N = 20


def _answers(stack, home: Path) -> dict[str, str]:
    oai, oll = stack.openai(), stack.ollama()
    out = {
        "openai_chat": oai.chat.completions.create(model="smollm2", messages=ASK, max_tokens=N, temperature=0)
        .choices[0]
        .message.content,
        "openai_chat_stream": "".join(
            c.choices[0].delta.content or ""
            for c in oai.chat.completions.create(
                model="smollm2", messages=ASK, max_tokens=N, temperature=0, stream=True
            )
            if c.choices
        ),
        "openai_completion": oai.completions.create(model="smollm2", prompt="The sky is", max_tokens=N, temperature=0)
        .choices[0]
        .text,
        "ollama_chat": oll.chat(
            model="smollm2", messages=ASK, options={"num_predict": N, "temperature": 0}
        ).message.content,
        "ollama_generate": oll.generate(
            model="smollm2", prompt=QUESTION, options={"num_predict": N, "temperature": 0}
        ).response,
        "ollama_generate_raw": oll.generate(
            model="smollm2", prompt="The sky is", raw=True, options={"num_predict": N, "temperature": 0}
        ).response,
    }
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "inference.cli",
            "run",
            "smollm2-135m-instruct",
            "-p",
            QUESTION,
            "--temperature",
            "0",
            "--max-tokens",
            str(N),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, RKMOJO_HOME=str(home)),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    out["cli_run"] = r.stdout
    return out


@pytest.mark.slow
def test_greedy_answers_through_every_api_are_those_recorded_on_main(stack, smollm2_store, tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "smollm2-135m-instruct").symlink_to(smollm2_store)
    got = _answers(stack, tmp_path)
    chat = {k: v for k, v in got.items() if k not in ("openai_completion", "ollama_generate_raw")}
    assert len(set(v.rstrip("\n") for v in chat.values())) == 1, chat
    assert got["openai_completion"] == got["ollama_generate_raw"], got
    recorded = json.loads(RECORDED.read_text())
    if os.environ.get("RKMOJO_RECORD_GREEDY"):
        recorded[kernels.BACKEND] = got
        tmp = RECORDED.with_suffix(".tmp")
        tmp.write_text(json.dumps(recorded, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
        tmp.replace(RECORDED)
    assert kernels.BACKEND in recorded, (
        f"no greedy answers recorded for the {kernels.BACKEND} kernel build in {RECORDED}; "
        f"record them with RKMOJO_RECORD_GREEDY=1"
    )
    assert got == recorded[kernels.BACKEND]
