"""`rkmojo run`: a terminal chat over the engine's event API, or one answer with `-p`.

Interactive: the answer streams as it is generated; the conversation is kept (the engine reuses its
KV cache for the common prefix, so each turn costs only the new text); Ctrl-C stops the current
answer (the engine's `cancel()`, from a signal handler) and the chat goes on; a second Ctrl-C
during a long prompt interrupts at once and resets the KV state. Commands: /reset, /stats, /help,
/bye. A stats line follows each answer on stderr.

One-shot (`-p PROMPT`, `-p -` reads stdin): only the answer goes to stdout; `--stats` adds the stats
line on stderr.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from .engine import Engine
from .generate import ContextLengthError, Final, TextDelta
from .sampler import SamplingParams
from .templates import ChatTemplateError

HELP = """commands:
  /reset   forget the conversation (and the KV cache)
  /stats   model, context use and the last answer's numbers
  /help    this text
  /bye     quit (Ctrl-D too); Ctrl-C stops an answer"""


def stats_line(final: Final) -> str:
    """One line of numbers about an answer: tokens, why it ended, TTFT, speeds, expert hit rate."""
    u, t = final.usage, final.timings
    parts = [
        f"{u.completion_tokens} tokens",
        final.finish_reason,
        f"TTFT {t.ttft:.2f} s",
        f"prefill {t.prefill_tps:.0f} tok/s" + (f" ({u.cached_tokens} cached)" if u.cached_tokens else ""),
        f"decode {t.decode_tps:.1f} tok/s",
    ]
    if t.expert_hit_rate is not None:
        parts.append(f"experts {t.expert_hit_rate:.0%} hit")
    return "[" + " · ".join(parts) + "]"


class _CancelOnInterrupt:
    """While active, Ctrl-C cancels the generation; a second Ctrl-C raises KeyboardInterrupt."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.hits = 0

    def _handler(self, signum, frame):
        self.hits += 1
        if self.hits > 1:
            raise KeyboardInterrupt
        self.engine.cancel()

    def __enter__(self):
        self.previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self.previous)


def stream_answer(engine: Engine, messages: list[dict], params: dict, out=sys.stdout, thoughts=sys.stderr) -> Final:
    """Write the answer to `out` as it streams, a thinking model's reasoning to `thoughts`; the `Final` event.

    Raises:
        KeyboardInterrupt: a second Ctrl-C (the engine's KV state is reset first).
    """
    thinking = False
    with _CancelOnInterrupt(engine):
        try:
            for ev in engine.chat(messages, params):
                if isinstance(ev, TextDelta):
                    if ev.channel == "content" and thinking:  # the thoughts end on their own line
                        thoughts.write("\n\n")
                    thinking = ev.channel == "reasoning"
                    to = thoughts if thinking else out
                    to.write(ev.text)
                    to.flush()
                elif isinstance(ev, Final):
                    return ev
        except KeyboardInterrupt:
            engine.reset()  # interrupted inside a forward pass: the KV state may be half-written
            raise
    raise AssertionError("generation ended without a Final event")


def run_chat(
    store_path: Path,
    *,
    prompt: str | None,
    params: dict,
    system: str | None = None,
    show_stats: bool = False,
    engine_options: dict | None = None,
) -> int:
    """The `rkmojo run` command: interactive when `prompt` is None, else one answer. Exit status."""
    engine = Engine.open(store_path, **(engine_options or {}))
    try:
        if prompt is not None:
            return _one_shot(engine, sys.stdin.read() if prompt == "-" else prompt, params, system, show_stats)
        return ChatSession(engine, params, system).loop()
    finally:
        engine.close()


def _one_shot(engine: Engine, prompt: str, params: dict, system: str | None, show_stats: bool) -> int:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    try:
        final = stream_answer(engine, messages, params)
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        return 130
    sys.stdout.write("\n")
    sys.stdout.flush()
    if show_stats:
        print(stats_line(final), file=sys.stderr)
    return 130 if final.finish_reason == "cancelled" else 0


class ChatSession:
    """The interactive loop: history, commands, one answer per line typed."""

    def __init__(self, engine: Engine, params: dict, system: str | None):
        self.engine = engine
        self.params = params
        self.system = system
        self.history: list[dict] = []
        self.last: Final | None = None
        self.answers = 0

    def messages(self) -> list[dict]:
        return ([{"role": "system", "content": self.system}] if self.system else []) + self.history

    def loop(self) -> int:
        try:
            import readline  # noqa: F401 - line editing and history for input()
        except ImportError:
            pass
        st = self.engine.store
        print(
            f"rkmojo · {st.path.name} ({st.architecture}, context {self.engine.context_length}) · "
            "/help for commands, Ctrl-D to quit",
            file=sys.stderr,
        )
        while True:
            try:
                line = input(">>> ")
            except EOFError:
                print(file=sys.stderr)
                return 0
            except KeyboardInterrupt:
                print(file=sys.stderr)
                continue
            text = line.strip()
            if not text:
                continue
            if text.startswith("/"):
                if self.command(text) == "quit":
                    return 0
                continue
            self.answer(line)

    def command(self, text: str) -> str | None:
        cmd = text.split()[0].lower()
        if cmd in ("/bye", "/exit", "/quit"):
            return "quit"
        if cmd == "/reset":
            self.history.clear()
            self.engine.reset()
            print("[conversation reset]", file=sys.stderr)
        elif cmd == "/stats":
            print(self.stats(), file=sys.stderr)
        elif cmd == "/help":
            print(HELP, file=sys.stderr)
        else:
            print(f"unknown command {cmd}; /help lists them", file=sys.stderr)
        return None

    def answer(self, line: str) -> None:
        self.history.append({"role": "user", "content": line})
        while True:
            try:
                final = stream_answer(self.engine, self.messages(), self.params)
                break
            except ContextLengthError as e:
                if len(self.history) <= 1:
                    self.history.pop()
                    print(f"rkmojo: {e}", file=sys.stderr)
                    return
                del self.history[: 2 if len(self.history) > 2 else 1]  # the oldest exchange
                print("[the oldest turn was dropped to fit the context]", file=sys.stderr)
            except (ChatTemplateError, ValueError) as e:
                self.history.pop()
                print(f"rkmojo: {e}", file=sys.stderr)
                return
            except KeyboardInterrupt:
                self.history.pop()
                print("\n[interrupted]", file=sys.stderr)
                return
        sys.stdout.write("\n")
        sys.stdout.flush()
        if final.finish_reason == "cancelled":
            print("[cancelled]", file=sys.stderr)
        self.history.append({"role": "assistant", "content": final.text})
        self.last = final
        self.answers += 1
        print(stats_line(final), file=sys.stderr)

    def sampling(self) -> str:
        p = SamplingParams.from_any(self.params).resolve(self.engine.store.manifest.get("generation"))
        shown = (
            "temperature",
            "top_k",
            "top_p",
            "min_p",
            "repetition_penalty",
            "presence_penalty",
            "frequency_penalty",
            "max_tokens",
            "seed",
            "stop",
        )
        return ", ".join(f"{k}={getattr(p, k)}" for k in shown if getattr(p, k) not in (None, []))

    def stats(self) -> str:
        e = self.engine
        lines = [
            f"model     {e.store.path} ({e.store.architecture})",
            f"context   {len(e.tokens)} of {e.context_length} tokens in the KV cache; "
            f"{len(self.history)} messages, {self.answers} answers",
            "sampling  " + self.sampling(),
        ]
        if self.last is not None:
            lines.append("last      " + stats_line(self.last))
        total = (getattr(e, "expert_stats", None) or {}).get("total")
        if total:
            lines.append(
                f"experts   {total.get('hits', 0)} hits, {total.get('misses', 0)} misses "
                f"({total.get('hit_rate', 0):.0%} hit rate) since the model was opened"
            )
        return "\n".join(lines)
