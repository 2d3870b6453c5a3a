"""The appliance's small pieces without the stack: settings helpers, keep-alive, API-key policy."""

import pytest
from django.core.exceptions import ImproperlyConfigured

from appliance import bus, env
from webui.api.common import key_required
from webui.api.ollama import keep_alive_seconds


def test_settings_helpers_fail_loudly_naming_the_variable(monkeypatch):
    monkeypatch.setenv("RKMOJO_QUEUE_LIMIT", "eight")
    with pytest.raises(ImproperlyConfigured, match="RKMOJO_QUEUE_LIMIT='eight'"):
        env.env_int("RKMOJO_QUEUE_LIMIT", 8)
    monkeypatch.setenv("RKMOJO_QUEUE_LIMIT", "-1")
    with pytest.raises(ImproperlyConfigured, match="at least 0"):
        env.env_int("RKMOJO_QUEUE_LIMIT", 8, minimum=0)
    monkeypatch.setenv("RKMOJO_DEBUG", "maybe")
    with pytest.raises(ImproperlyConfigured, match="RKMOJO_DEBUG"):
        env.env_bool("RKMOJO_DEBUG", False)
    monkeypatch.setenv("RKMOJO_KEEP_ALIVE", "5 minutes")
    with pytest.raises(ImproperlyConfigured, match="duration"):
        env.env_duration("RKMOJO_KEEP_ALIVE", 1800)
    monkeypatch.setenv("RKMOJO_PROMPT_CACHE_MAX", "lots")
    with pytest.raises(ImproperlyConfigured, match="size"):
        env.env_size("RKMOJO_PROMPT_CACHE_MAX", None)
    monkeypatch.setenv("RKMOJO_KEEP_ALIVE", "1.5h")
    assert env.env_duration("RKMOJO_KEEP_ALIVE", 0) == 5400
    monkeypatch.setenv("RKMOJO_PROMPT_CACHE_MAX", "512M")
    assert env.env_size("RKMOJO_PROMPT_CACHE_MAX", None) == 512 * 2**20
    monkeypatch.delenv("RKMOJO_QUEUE_LIMIT")
    assert env.env_int("RKMOJO_QUEUE_LIMIT", 8) == 8


def test_ollama_keep_alive_reads_numbers_and_go_durations():
    assert keep_alive_seconds(None) is None
    assert keep_alive_seconds(0) == 0 and keep_alive_seconds("0") == 0
    assert keep_alive_seconds("5m") == 300 and keep_alive_seconds("1h30m") == 5400
    assert keep_alive_seconds("-1") == -1 and keep_alive_seconds(-1) == -1
    assert keep_alive_seconds("500ms") == 0.5


def test_api_keys_are_required_off_loopback_by_default():
    assert not key_required("remote", "127.0.0.1") and not key_required("remote", "::1")
    assert not key_required("remote", "127.3.4.5")
    assert key_required("remote", "192.168.1.20") and key_required("remote", "fe80::1") and key_required("remote", None)
    assert key_required("always", "127.0.0.1") and not key_required("never", "10.0.0.1")


def test_redis_urls_become_kombu_broker_urls():
    assert bus.kombu_url("unix:///data/redis.sock?db=2") == "redis+socket:///data/redis.sock?virtual_host=2"
    assert bus.kombu_url("redis://10.0.0.5:6379/1") == "redis://10.0.0.5:6379/1"


def test_pull_sources_are_repo_ids_urls_or_files_of_the_import_directory(tmp_path):
    from appliance.sources import SourceError, local_path

    imports = tmp_path / "import"
    imports.mkdir()
    (imports / "m.gguf").write_bytes(b"GGUF")
    (imports / "linked.gguf").symlink_to(tmp_path / "elsewhere.gguf")  # the administrator's link may point out
    (tmp_path / "elsewhere.gguf").write_bytes(b"GGUF")
    assert local_path("Qwen/Qwen3-30B-A3B", imports) is None and local_path("https://h/x.gguf", imports) is None
    assert local_path("hf.co/unsloth/Qwen3-30B-A3B-GGUF:Q4_K_M", imports) is None  # one GGUF of a repository
    assert local_path("m.gguf", imports) == imports / "m.gguf" == local_path(str(imports / "m.gguf"), imports)
    assert local_path("linked.gguf", imports) == imports / "linked.gguf"
    for bad, says in [
        ("/etc/passwd", "only from inside"),
        ("../elsewhere.gguf", "only from inside"),
        ("m.gguf/../../elsewhere.gguf", "only from inside"),
        ("file:///etc/passwd", "http"),
        ("ftp://h/x.gguf", "http"),
        ("llama3", "repository id"),
        ("./gone.gguf", "no such file"),
    ]:
        with pytest.raises(SourceError, match=says):
            local_path(bad, imports)
