"""A fuzzer (schemathesis) against /openapi.json on the real stack: no answer ≥ 500, no hung connection, and
every 4xx in the API's own error format naming what was wrong.

Bounded: a fixed number of examples per generation mode and a wall-clock cap. /api/pull and /api/delete
are left out: they install or delete models on the board the other tests use.
"""

import time

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given
from schemathesis.generation import GenerationMode

EXAMPLES = 150  # per mode, over all operations
TIME_CAP = 45.0  # seconds per mode
TIMEOUT = 20.0  # seconds one answer may take before it counts as a hang


def test_the_document_is_openapi_3_1_and_covers_both_apis(stack):
    doc = requests.get(f"{stack.url}/openapi.json", timeout=10).json()
    assert doc["openapi"].startswith("3.1")
    assert {"/v1/chat/completions", "/api/chat", "/api/generate", "/v1/embeddings"} <= set(doc["paths"])
    temp = doc["components"]["schemas"]["Options"]["properties"]["temperature"]
    assert (temp["minimum"], temp["maximum"]) == (0, 2)


def check_error_format(case, resp) -> None:
    assert resp.status_code < 500, f"{case.method} {case.path}: {resp.status_code} {resp.text[:300]}"
    if resp.status_code < 400:
        return
    body = resp.json()
    if case.path.startswith("/v1/"):
        err = body["error"]
        assert set(err) >= {"message", "type", "param", "code"} and err["message"], body
        if resp.status_code == 400 and err["code"] != "invalid_json":
            assert err["param"], f"{case.path}: a 400 that names no field: {body}"
    else:
        assert isinstance(body["error"], str) and body["error"], body


@pytest.mark.slow
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_fuzzing_the_apis_finds_no_server_error_and_no_hang(stack, mode):
    schema = schemathesis.openapi.from_url(f"{stack.url}/openapi.json").exclude(path=["/api/pull", "/api/delete"])
    auth = {"Authorization": f"Bearer {stack.key}"}
    session = requests.Session()
    deadline = time.monotonic() + TIME_CAP
    seen = {"calls": 0}

    @hypothesis.settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=schema.as_strategy(generation_mode=mode))
    def run(case):
        if time.monotonic() > deadline:
            return
        try:
            resp = case.call(base_url=stack.url, session=session, headers=auth, timeout=TIMEOUT)
        except requests.Timeout:
            raise AssertionError(f"{case.method} {case.path} hung for {TIMEOUT} s: {case.body!r:.300}") from None
        seen["calls"] += 1
        seen[resp.status_code] = seen.get(resp.status_code, 0) + 1
        check_error_format(case, resp)

    run()
    print(f"\n{mode.value}: {seen}")
    assert seen["calls"] >= 20
