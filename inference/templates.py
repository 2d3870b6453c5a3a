"""Chat templates: the model's own jinja template, rendered the way transformers' `apply_chat_template` does.

Templates come from model repositories, so they are untrusted code: they run in jinja2's
`ImmutableSandboxedEnvironment` (no attribute access to internals, no mutation of the inputs), with
the conventions transformers established and every published template relies on:

- variables: `messages`, `add_generation_prompt`, `tools`, `documents`, the special tokens
  (`bos_token`, `eos_token`, `unk_token`, `pad_token`) and any extra keyword (`enable_thinking`, …);
- `trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, and a `{% generation %}` block that
  renders its body unchanged;
- globals `raise_exception(msg)` (→ `ChatTemplateError`), `strftime_now(fmt)`, `namespace` (which
  refuses underscore names), a `tojson` filter that keeps non-ASCII text and takes `indent`,
  `separators`, `sort_keys`;
- `continue_final_message`: the prompt ends inside the last message (an assistant's answer cut off),
  not after it: rendered without a generation prompt and cut right after that message's text, as
  transformers does;
- messages are normalised first: keys whose value is None are dropped, and a message's reasoning
  (`reasoning_content`, `thinking` or `reasoning`) is offered under both `reasoning_content` and
  `thinking`, the names templates read.

A store without a template gets `FALLBACK_TEMPLATE` (ChatML: `<|im_start|>{role}\\n{content}<|im_end|>\\n`
per message, then `<|im_start|>assistant\\n` as the generation prompt) when the vocabulary has the ChatML
tokens, else `PLAIN_TEMPLATE` (`{Role}: {content}` paragraphs ending in `Assistant:`).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import RkmojoError

FALLBACK_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
PLAIN_TEMPLATE = (
    "{{ bos_token or '' }}"
    "{% for message in messages %}"
    "{{ message['role'] | capitalize }}: {{ message['content'] }}\n\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(RkmojoError, ValueError):
    """The template refused the conversation (its `raise_exception`) or failed to render."""


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}…{% endgeneration %}` marks assistant text for training masks; here it renders as is."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """jinja's `namespace()`, refusing underscore attributes (a way into object internals)."""

    def __init__(*args, **kwargs):  # noqa: N805 - jinja's own signature trick: `self` may be a keyword
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat template may not set namespace attribute {name!r}")


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # jinja's own tojson escapes HTML characters, which would change what the model sees
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(
        raise_exception=_raise_exception, namespace=_Namespace, strftime_now=lambda fmt: datetime.now().strftime(fmt)
    )
    return env


def _plain(value: Any) -> Any:
    """A copy made of JSON types only: the template never sees the caller's objects (or mutates them)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):  # numpy scalars
        return _plain(value.item())
    return f"<{type(value).__name__}>"


def normalize_messages(messages: list[dict]) -> list[dict]:
    """Messages as templates expect them: None values dropped, reasoning offered under both names.

    Raises:
        ChatTemplateError: a message is not a dict with a role.
    """
    if not messages:
        raise ChatTemplateError("messages is empty; give at least one message")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise ChatTemplateError(f"messages[{i}] must be a dict with a 'role', got {m!r:.80}")
        m = {k: _plain(v) for k, v in m.items() if v is not None}
        reasoning = next((m[k] for k in REASONING_KEYS if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


class ChatTemplate:
    """One compiled chat template.

    Args:
        source: the jinja text.
        special_tokens: the tokenizer's special token strings (`bos_token`, `eos_token`, …) offered
            to the template as variables.
    Raises:
        ChatTemplateError: the template does not compile.
    """

    def __init__(self, source: str, special_tokens: dict[str, str] | None = None):
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        try:
            self._template = _environment().from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise ChatTemplateError(f"chat template does not compile (line {e.lineno}: {e.message})") from None

    def render(
        self,
        messages: list[dict],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        documents: list[dict] | None = None,
        continue_final_message: bool = False,
        **kwargs,
    ) -> str:
        """The prompt text for `messages`.

        Args:
            messages: [{"role": ..., "content": ..., optional "tool_calls", "reasoning_content", …}].
            add_generation_prompt: end with the header of an assistant turn.
            continue_final_message: end inside the last message instead, right after its text, so that
                the model writes on (`add_generation_prompt` is then ignored).
            tools: JSON schemas of functions ({"type": "function", "function": {...}}), for templates that use them.
            documents: retrieval documents, for templates that use them.
            kwargs: further template variables (`enable_thinking=False`, …); they override special tokens.
        Raises:
            ChatTemplateError: the template's `raise_exception`, or any error while rendering.
        """
        variables = {**self.special_tokens, **_plain(kwargs)}
        if continue_final_message:
            return self._continued(messages, tools, documents, variables)
        try:
            return self._template.render(
                messages=normalize_messages(messages),
                tools=_plain(tools),
                documents=_plain(documents),
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except ChatTemplateError:
            raise
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"chat template: {e}") from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
            raise ChatTemplateError(f"chat template failed on these messages: {type(e).__name__}: {e}") from None

    def _continued(self, messages: list[dict], tools, documents, variables: dict) -> str:
        final = (messages[-1].get("content") if messages else None) or ""
        if not isinstance(final, str) or not final.strip():
            raise ChatTemplateError("continue_final_message needs a last message with text to continue")
        text = self.render(messages, add_generation_prompt=False, tools=tools, documents=documents, **variables)
        at = text.rfind(final.strip())  # templates often strip the content; the model goes on from its end
        if at < 0:
            raise ChatTemplateError(
                "continue_final_message: the chat template does not write the last "
                "message's text as it is, so the prompt cannot end inside it"
            )
        return text[: at + len(final.strip())]
