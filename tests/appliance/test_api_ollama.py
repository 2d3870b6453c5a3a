"""The Ollama-compatible API driven by the unmodified `ollama` client against the real stack."""

import numpy as np
import ollama
import pytest

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "num_predict": 12}


def test_it_answers_a_chat_with_durations_in_nanoseconds(oll):
    r = oll.chat(model="smollm2", messages=QUESTION, options=GREEDY)
    assert "Paris" in r.message.content and r.message.role == "assistant"
    assert r.done and r.done_reason in ("stop", "length")
    assert r.prompt_eval_count > 10 and 0 < r.eval_count <= 12
    assert r.total_duration >= r.eval_duration > 0 and r.prompt_eval_duration > 0
    assert r.total_duration > 1e6  # nanoseconds, not seconds


def test_it_streams_a_chat_as_ndjson(oll):
    parts = list(oll.chat(model="smollm2:latest", messages=QUESTION, options=GREEDY, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    assert parts[-1].done_reason in ("stop", "length") and parts[-1].eval_count > 0
    text = "".join(p.message.content for p in parts)
    assert text == oll.chat(model="smollm2", messages=QUESTION, options=GREEDY).message.content


def test_it_generates_from_a_prompt_templated_or_raw(oll):
    r = oll.generate(model="smollm2", prompt="What is the capital of France?", options=GREEDY)
    assert "Paris" in r.response and r.done
    raw = list(
        oll.generate(
            model="smollm2",
            prompt="The capital of France is",
            raw=True,
            stream=True,
            options={"temperature": 0, "num_predict": 4},
        )
    )
    assert raw[-1].done and raw[-1].eval_count == 4


def test_it_embeds_like_the_openai_endpoint(oll, oai):
    r = oll.embed(model="smollm2", input=["a cat sat on the mat", "hello"])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 576
    o = oai.embeddings.create(model="smollm2", input="a cat sat on the mat", encoding_format="float")
    assert np.allclose(r.embeddings[0], o.data[0].embedding, atol=1e-6)
    assert r.prompt_eval_count > 4


def test_it_lists_shows_and_reports_the_version(oll):
    tags = oll.list()
    m = next(m for m in tags.models if m.model == "smollm2")
    assert m.size > 50e6 and m.details.family == "llama" and m.digest
    info = oll.show("smollm2")
    assert info.modelinfo["general.architecture"] == "llama" and info.modelinfo["llama.block_count"] == 30
    assert "completion" in info.capabilities
    v = oll._client.get("/api/version").json()["version"]
    assert v.count(".") == 2


def test_ps_shows_the_loaded_model_and_keep_alive_zero_unloads_it(oll, stack):
    assert any(m.model == "smollm2" for m in oll.ps().models)
    r = oll.generate(model="smollm2", prompt="", keep_alive=0)
    assert r.done_reason == "unload"
    assert not any(m.model == "smollm2" for m in oll.ps().models)
    r = oll.generate(model="smollm2", prompt="")
    assert r.done_reason == "load"
    loaded = next(m for m in oll.ps().models if m.model == "smollm2")
    assert loaded.expires_at is not None and loaded.size > 0


def test_it_refuses_what_it_cannot_do(oll):
    with pytest.raises(ollama.ResponseError) as e:
        oll.chat(model="smollm2", messages=QUESTION, options={"mirostat": 2})
    assert e.value.status_code == 400 and "mirostat" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        oll.chat(model="smollm2", messages=[{"role": "user", "content": "hi", "images": ["aGk="]}])
    assert e.value.status_code == 400 and "images" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        oll.chat(model="nope", messages=QUESTION)
    assert e.value.status_code == 404


def test_it_pulls_a_file_of_the_import_directory_with_progress_then_deletes(oll, smollm2_gguf, stack):
    (stack.data / "import").mkdir(exist_ok=True)
    (stack.data / "import" / smollm2_gguf.name).symlink_to(smollm2_gguf)
    parts = list(oll.pull(smollm2_gguf.name, stream=True))
    assert parts[0].status == "pulling manifest" and parts[-1].status == "success"
    name = "smollm2-135m-instruct.q4_1"
    assert any(m.model == name for m in oll.list().models)
    r = oll.generate(
        model=name, prompt="The capital of France is", raw=True, options={"temperature": 0, "num_predict": 3}
    )
    assert r.eval_count == 3
    assert oll.delete(name).status == "success"
    assert not any(m.model == name for m in oll.list().models)
    with pytest.raises(ollama.ResponseError) as e:
        oll.delete(name)
    assert e.value.status_code == 404


def test_a_model_idle_past_its_keep_alive_is_unloaded_and_reloads_on_demand(oll, stack):
    oll.generate(model="smollm2", prompt="hi", keep_alive="1s", options={"num_predict": 1})
    stack.wait_until(lambda: not any(m.model == "smollm2" for m in oll.ps().models), 10)
    r = oll.generate(model="smollm2", prompt="hi", options={"num_predict": 1})
    assert r.load_duration > 0
    assert any(m.model == "smollm2" for m in oll.ps().models)


def test_ps_names_what_computes_the_prefill_and_why(http):
    loaded = http.get("/api/ps").json()["models"]
    m = next(m for m in loaded if m["model"] == "smollm2")
    # no librknnrt on this machine: auto falls back to the CPU and says why
    assert m["backend"] == "cpu" and m["backend_reason"]
