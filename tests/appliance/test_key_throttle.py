"""API keys under webui/throttle.py: wrong keys lock the address, the right key refused too until the lockout ends;
a key that looks like ours (`rkm-…`) is checked from loopback too, a placeholder is not. The off-loopback case,
keys and sign-in both, from a client in a network namespace against a daphne listening on the LAN side."""

import os
import time

import pytest

STRONG = "a long passphrase 7"


def get(address: str, path: str, key: str | None):
    from django.test import Client

    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key is not None else {}
    return Client(REMOTE_ADDR=address, HTTP_HOST="127.0.0.1").get(path, **headers)


def test_wrong_keys_lock_the_address_and_the_right_key_waits_for_the_lockout(no_failures, stack):
    from django.conf import settings
    from django.test import override_settings

    with override_settings(RKMOJO={**settings.RKMOJO, "API_KEY_FAILURES": 3, "LOCKOUT": 2.0}):
        for path in ("/v1/models", "/api/tags", "/v1/models"):
            assert get("10.30.0.1", path, "rkm-guess").status_code == 401
        r = get("10.30.0.1", "/v1/models", stack.key)
        assert r.status_code == 429 and r["Retry-After"] == "2"
        assert (
            r.json()["error"]["code"] == "too_many_wrong_keys" and "from this address" in r.json()["error"]["message"]
        )
        assert get("10.30.0.1", "/api/tags", stack.key).status_code == 429  # Ollama's side too
        assert get("10.30.0.2", "/v1/models", stack.key).status_code == 200  # another address is not locked
        time.sleep(2.2)
        assert get("10.30.0.1", "/v1/models", stack.key).status_code == 200


def test_a_key_like_ours_is_checked_from_loopback_and_a_placeholder_is_not(no_failures, stack):
    from webui import config

    config.save({"api_keys": "remote"})  # loopback clients need no key
    try:
        for placeholder in (None, "ollama", "sk-no-key", "none", ""):
            assert get("127.0.0.1", "/v1/models", placeholder).status_code == 200, placeholder
        for path in ("/v1/models", "/api/tags"):
            assert get("127.0.0.1", path, "rkm-bogus").status_code == 401
            assert get("::1", path, "rkm-bogus").status_code == 401
        assert get("127.0.0.1", "/v1/models", stack.key).status_code == 200
        config.save({"api_keys": "never"})
        assert get("10.30.1.1", "/v1/models", "rkm-bogus").status_code == 401  # everywhere
        assert get("10.30.1.1", "/v1/models", "anything").status_code == 200
    finally:
        config.save({"api_keys": None})


LAN_CLIENT = r"""
import json, re, sys, time
import httpx
a = json.loads(sys.argv[1])
url, key, out = a["url"], {"Authorization": "Bearer " + a["key"]}, {}
def sign_in(password):
    with httpx.Client(base_url=url) as c:
        tok = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', c.get("/login/").text).group(1)
        return c.post("/login/", data={"csrfmiddlewaretoken": tok, "username": "lan-user", "password": password})
out["wrong_keys"] = [httpx.get(url + "/v1/models", headers={"Authorization": "Bearer rkm-guess"}).status_code
                     for _ in range(3)]
out["right_key_locked"] = httpx.get(url + "/v1/models", headers=key).status_code
out["wrong_passwords"] = [sign_in("not the password").status_code for _ in range(3)]
locked = sign_in(a["password"])
out["right_password_locked"] = [locked.status_code, locked.headers.get("retry-after")]
time.sleep(3.2)
out["right_key_after"] = httpx.get(url + "/v1/models", headers=key).status_code
out["right_password_after"] = sign_in(a["password"]).status_code
print(json.dumps(out))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the LAN client's network namespace needs root")
def test_a_lan_client_is_locked_out_for_wrong_keys_and_passwords_until_the_lockout_ends(no_failures, stack):
    from django.contrib.auth import get_user_model
    from lan_netns import Lan

    from appliance import processes

    get_user_model().objects.filter(username="lan-user").delete()
    get_user_model().objects.create_user("lan-user", password=STRONG)
    lan = Lan().up()
    port = processes.free_port()
    env = {**stack.env, "RKMOJO_API_KEY_FAILURES": "3", "RKMOJO_LOGIN_FAILURES": "3", "RKMOJO_LOCKOUT": "3s"}
    log = stack.data / "logs" / "daphne-lan.log"
    web = processes.Child("daphne-lan", processes.daphne_argv(lan.host_ip, port), env, log, cwd=os.getcwd()).start()
    try:
        processes.wait_for(lambda: processes.tcp_open(lan.host_ip, port), 30, "daphne", child=web)
        got = lan.python(LAN_CLIENT, url=f"http://{lan.host_ip}:{port}", key=stack.key, password=STRONG)
    finally:
        web.stop()
        lan.down()
    assert got == {
        "wrong_keys": [401, 401, 401],
        "right_key_locked": 429,
        "wrong_passwords": [200, 200, 200],
        "right_password_locked": [429, "3"],
        "right_key_after": 200,
        "right_password_after": 302,
    }
