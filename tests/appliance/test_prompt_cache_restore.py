"""Two conversations alternating through the real worker, with an API request between them: each one's
prompt cache is restored when it returns (its cached-token count), none is dropped.

The first turns are longer than 256 tokens, so the full layers' KV grows past its first allocation: the
soak's 233 "dropping prompt cache … other KV settings" came from files written at one capacity and
refused by a fresh cache of another.
"""

from __future__ import annotations

MODEL = "smollm2"


def first_turn(topic: str) -> list[dict]:
    facts = " ".join(f"Fact {i}: the {topic} number {i} is {i * 7 % 13}." for i in range(18))
    return [{"role": "user", "content": f"{facts} Which {topic} number is largest?"}]


def ask(oai, messages: list[dict]):
    return oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)


def follow_up(messages: list[dict], answer, question: str) -> list[dict]:
    return messages + [
        {"role": "assistant", "content": answer.choices[0].message.content},
        {"role": "user", "content": question},
    ]


def test_alternating_conversations_restore_their_prompt_caches(oai, stack):
    log = stack.data / "logs" / "worker-board-a.log"
    seen = log.stat().st_size
    a, b = first_turn("apple"), first_turn("river")
    ra = ask(oai, a)
    assert ra.usage.prompt_tokens > 256  # the KV grew past its first 256 rows
    rb = ask(oai, b)
    for turn in range(2):
        oai.completions.create(model=MODEL, prompt="Unrelated: the capital of France is", max_tokens=4)
        a = follow_up(a, ra, f"And the smallest, turn {turn}?")
        held = ra.usage.prompt_tokens + ra.usage.completion_tokens
        ra = ask(oai, a)
        assert ra.usage.prompt_tokens_details.cached_tokens >= held - 2  # restored, not prefilled again
        oai.completions.create(model=MODEL, prompt="Unrelated: two plus two is", max_tokens=4)
        b = follow_up(b, rb, f"And the smallest, turn {turn}?")
        held = rb.usage.prompt_tokens + rb.usage.completion_tokens
        rb = ask(oai, b)
        assert rb.usage.prompt_tokens_details.cached_tokens >= held - 2
    with open(log, encoding="utf-8", errors="replace") as f:
        f.seek(seen)
        written = f.read()
    assert "dropping prompt cache" not in written
    assert written.count("restored prompt cache") >= 4
