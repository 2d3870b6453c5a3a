"""The pull policy on the real stack: a URL pull never reaches this machine, by any name, and tells nothing
about its ports; a LAN server is reached once the administrator switches `pull_from_lan` on (as the test
does: its server is a LAN neighbour in a network namespace, root only); a refused pull leaves nothing."""

from __future__ import annotations

import shutil
import socket

import pytest

from hub_server import HubServer

REFUSED = "could not download from URL: refused by the pull policy"


def pull(http, url: str):
    return http.post("/api/pull", json={"model": url, "stream": False})


def models_dir_entries(stack) -> set[str]:
    return {p.name for p in (stack.data / "models").iterdir()}


def test_a_pull_of_this_machine_is_refused_alike_for_open_and_closed_ports_and_leaves_nothing(http, stack):
    before = models_dir_entries(stack)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    for url in (
        f"http://127.0.0.1:{stack.port}/x.gguf",  # the web process: open
        f"http://127.0.0.1:{closed_port}/x.gguf",  # closed
        f"http://localhost:{stack.port}/x.gguf",
        f"http://[::1]:{stack.port}/x.gguf",
        f"http://0.0.0.0:{stack.port}/x.gguf",
    ):
        r = pull(http, url)
        assert (r.status_code, r.json()) == (403, {"error": REFUSED}), url
    assert models_dir_entries(stack) == before  # no .x.pull left behind


@pytest.fixture
def nas(lan, smollm2_gguf, tmp_path):
    """A file server at a LAN address, holding a copy of the demo GGUF."""
    shutil.copy(smollm2_gguf, tmp_path / "nas-copy.gguf")
    server = HubServer(tmp_path, lan=lan)
    yield server
    server.close()


def test_a_lan_server_is_reached_once_the_administrator_allows_the_lan(http, stack, nas, pull_from_lan):
    url = f"{nas.url}/cdn/nas-copy.gguf"
    r = pull(http, url)
    assert (r.status_code, r.json()) == (403, {"error": REFUSED}) and nas.requests == []
    assert not (stack.data / "models" / ".nas-copy.pull").exists()
    pull_from_lan(True)
    r = pull(http, url)
    assert r.status_code == 200 and r.json() == {"status": "success"}, r.text
    assert any(m["model"] == "nas-copy" for m in http.get("/api/tags").json()["models"])
    assert http.request("DELETE", "/api/delete", json={"model": "nas-copy"}).status_code == 200


def test_the_settings_page_offers_the_switch_with_its_reason(stack, django_for_stack):
    import json

    from django.contrib.auth import get_user_model
    from django.test import Client

    from appliance import bus
    from webui import config

    staff, _ = get_user_model().objects.get_or_create(username="policy-admin", defaults={"is_staff": True})
    panel = Client(HTTP_HOST="127.0.0.1")
    panel.force_login(staff)
    try:
        page = panel.get("/panel/settings/").content.decode()
        field = page.split('data-setting="pull_from_lan"')[1].split("</div>")[0]
        assert "Pull from the LAN" in field and "192.168.1.10" in field and "probe" in field
        assert panel.post("/panel/settings/", {"pull_from_lan": "on"}).status_code == 302
        assert json.loads(stack.r().get(bus.K_SETTINGS))["pull_from_lan"] is True
    finally:
        config.save({"pull_from_lan": None})
        staff.delete()
