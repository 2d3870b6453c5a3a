"""Greedy answers through every API (OpenAI chat and completions, streamed and not; Ollama chat, generate and
raw generate; the CLI) are identical to those recorded on main before the contract refactoring.

`RKMOJO_RECORD_GREEDY=1 pytest tests/appliance/test_greedy_outputs.py` writes the recording again.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    if os.environ.get("RKMOJO_RECORD_GREEDY"):
        RECORDED.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    assert got == json.loads(RECORDED.read_text())
