"""One schema, four surfaces: the same out-of-range temperature is refused by each with the same bound
([0, 2], `SamplingParams`) and with the field named as that surface spells it."""

import os
import subprocess
import sys
from pathlib import Path

import ollama
import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]
TOO_HOT = 5
BOUND = "allowed: [0, 2]"


def test_the_cli_refuses_it_naming_the_flag():
    r = subprocess.run(
        [sys.executable, "-m", "inference.cli", "run", "any-model", "-p", "hi", "--temperature", str(TOO_HOT)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert r.stderr.strip() == f"rkmojo: error: --temperature={float(TOO_HOT)!r} is out of range; {BOUND}"


def test_the_environment_refuses_it_naming_the_variable(tmp_path):
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="appliance.settings",
        RKMOJO_DATA=str(tmp_path),
        RKMOJO_TEMPERATURE=str(TOO_HOT),
    )
    r = subprocess.run(
        [sys.executable, "-c", "from django.conf import settings; settings.RKMOJO"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert f"ImproperlyConfigured: RKMOJO_TEMPERATURE='{TOO_HOT}' is out of range; {BOUND}" in r.stderr


def test_the_openai_api_refuses_it_naming_the_field(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=TOO_HOT
        )
    assert e.value.body["param"] == "temperature"
    assert e.value.body["message"] == f"temperature={float(TOO_HOT)} is out of range; {BOUND}"


def test_the_ollama_api_refuses_it_naming_the_option(oll):
    with pytest.raises(ollama.ResponseError) as e:
        oll.chat(model="smollm2", messages=[{"role": "user", "content": "hi"}], options={"temperature": TOO_HOT})
    assert e.value.status_code == 400
    assert e.value.error == f"options.temperature={float(TOO_HOT)} is out of range; {BOUND}"
