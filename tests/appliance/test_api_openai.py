"""The OpenAI-compatible API driven by the unmodified `openai` SDK against the real stack."""

import base64

import numpy as np


def ask(text):
    return [{"role": "user", "content": text}]


def test_it_lists_the_served_model(oai):
    ids = [m.id for m in oai.models.list()]
    assert "smollm2" in ids
    assert oai.models.retrieve("smollm2").id == "smollm2"


def test_it_answers_a_chat_without_streaming(oai):
    r = oai.chat.completions.create(
        model="smollm2", messages=ask("What is the capital of France?"), max_tokens=12, temperature=0
    )
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 12 and r.usage.prompt_tokens > 10
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.system_fingerprint == "rkmojo-board-a"


def test_it_streams_a_chat_with_usage_last(oai):
    stream = oai.chat.completions.create(
        model="smollm2",
        messages=ask("What is the capital of France?"),
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [finals[0]] and finals[0] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert len({c.id for c in chunks}) == 1
    plain = oai.chat.completions.create(
        model="smollm2", messages=ask("What is the capital of France?"), max_tokens=12, temperature=0
    )
    assert text == plain.choices[0].message.content


def test_it_continues_raw_text_with_completions(oai):
    r = oai.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=5, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text.strip()
    stream = oai.completions.create(
        model="smollm2", prompt="The capital of France is", max_tokens=5, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == r.choices[0].text


def test_it_embeds_texts_as_floats_and_as_base64(oai):
    r = oai.embeddings.create(model="smollm2", input=["a cat sat on the mat", "quantum chromodynamics"])
    vecs = np.array([d.embedding for d in r.data])
    assert vecs.shape == (2, 576) and np.allclose(np.linalg.norm(vecs, axis=1), 1, atol=1e-4)
    assert r.usage.prompt_tokens > 4
    b = oai.embeddings.create(model="smollm2", input="a cat sat on the mat", encoding_format="base64")
    raw = b.data[0].embedding
    v = np.frombuffer(base64.b64decode(raw), "<f4") if isinstance(raw, str) else np.array(raw)
    assert np.allclose(v, vecs[0], atol=1e-6)


def test_it_stops_at_a_stop_string_and_leaves_it_out(oai):
    question = ask("Count from 1 to 10, separated by commas.")
    free = (
        oai.chat.completions.create(model="smollm2", messages=question, max_tokens=30, temperature=0)
        .choices[0]
        .message.content
    )
    stop = free[len(free) // 2 :][:3]
    r = oai.chat.completions.create(
        model="smollm2", messages=question, max_tokens=30, temperature=0, stop=[stop, "zzz"]
    )
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == free[: free.index(stop)]


def test_the_same_seed_gives_the_same_sample(oai):
    def sample(seed):
        return (
            oai.chat.completions.create(
                model="smollm2", messages=ask("Tell me a word."), max_tokens=10, temperature=1.0, top_p=1.0, seed=seed
            )
            .choices[0]
            .message.content
        )

    a, b = sample(7), sample(7)
    assert a == b
    assert any(sample(s) != a for s in (8, 9, 10))


def test_a_continued_conversation_reuses_its_prompt_cache(oai):
    history = ask("Name a color of the sky.")
    first = oai.chat.completions.create(model="smollm2", messages=history, max_tokens=8, temperature=0)
    # another conversation replaces the engine's KV state in between
    oai.chat.completions.create(
        model="smollm2", messages=ask("Something unrelated: name a fruit."), max_tokens=8, temperature=0
    )
    history += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And at night?"},
    ]
    second = oai.chat.completions.create(model="smollm2", messages=history, max_tokens=8, temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens + first.usage.completion_tokens - 2


def test_it_returns_logprobs_when_asked(oai):
    r = oai.chat.completions.create(
        model="smollm2", messages=ask("Say yes."), max_tokens=3, temperature=0, logprobs=True, top_logprobs=2
    )
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in lp)
    assert lp[0].token == lp[0].top_logprobs[0].token  # greedy: the chosen token is the most likely


def test_chats_are_stored_as_sessions_that_grow_with_the_conversation(oai, stack):
    import sqlite3

    history = ask("Remember the word 'tangerine'.")
    first = oai.chat.completions.create(model="smollm2", messages=history, max_tokens=6, temperature=0)
    history += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Which word?"},
    ]
    oai.chat.completions.create(model="smollm2", messages=history, max_tokens=6, temperature=0)
    db = sqlite3.connect(stack.data / "db.sqlite3")
    rows = db.execute(
        "SELECT s.id, m.idx, m.role, m.content FROM (SELECT id FROM webui_chatsession WHERE title = ?) s "
        'JOIN (SELECT session_id, "index" AS idx, role, content FROM webui_chatmessage) m '
        "ON m.session_id = s.id ORDER BY m.idx",
        (history[0]["content"],),
    ).fetchall()
    assert len({r[0] for r in rows}) == 1
    assert [r[2] for r in rows] == ["user", "assistant", "user", "assistant"]
    assert rows[1][3] == first.choices[0].message.content
