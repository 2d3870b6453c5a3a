"""Request pieces both APIs share: chat messages and sampling parameters, checked at the edge."""

from __future__ import annotations

from typing import Any

from inference.options import OptionError, Surface, api_type
from inference.sampler import SamplingParams

from .common import ApiError

ROLES = ("system", "developer", "user", "assistant")


def chat_messages(messages: list[Any], *, allow_images: bool = False) -> list[dict]:
    """OpenAI/Ollama messages as {"role", "content": str} dicts.

    Content is a string or a list of text parts; anything else (image or audio parts, tool messages)
    is refused with 400 naming the field, e.g. `messages[2].content[1].type`.
    """
    if not messages:
        raise ApiError(400, "messages must hold at least one message", param="messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"{where} must be an object with a role and content", param=where)
        role = m.get("role")
        if role not in ROLES:
            raise ApiError(
                400, f"{where}.role {role!r} is not supported; use one of {', '.join(ROLES)}", param=f"{where}.role"
            )
        for key in ("tool_calls", "images", "audio", "function_call"):
            if m.get(key):
                raise ApiError(
                    400,
                    f"{where}.{key} is not supported by this server",
                    param=f"{where}.{key}",
                    code="unsupported_value",
                )
        content = m.get("content")
        if content is None and role != "assistant":  # an assistant turn may be empty; a question may not
            raise ApiError(
                400, f"{where}.content must be a string or a list of text parts, not null", param=f"{where}.content"
            )
        if content is None:
            content = ""
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                pwhere = f"{where}.content[{j}]"
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise ApiError(
                        400,
                        f"{pwhere}: only text parts are supported, got {kind!r}",
                        param=f"{pwhere}.type",
                        code="unsupported_value",
                    )
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise ApiError(400, f"{where}.content must be a string or a list of text parts", param=f"{where}.content")
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


def check_embed_batch(texts: list[str]) -> None:
    """At most RKMOJO_MAX_EMBED_INPUTS texts per request: each is a forward pass on the only worker."""
    from django.conf import settings

    limit = settings.RKMOJO["MAX_EMBED_INPUTS"]
    if len(texts) > limit:
        raise ApiError(
            400,
            f"input holds {len(texts)} texts; this server embeds at most {limit} per request "
            "(RKMOJO_MAX_EMBED_INPUTS): split the batch",
            param="input",
            code="too_many_inputs",
        )


def seed_value(seed: int | None) -> int | None:
    """Any integer seed (OpenAI's are signed 64-bit) as the engine's non-negative one."""
    return None if seed is None else seed % 2**64


def check_sampling(params: dict, surface: Surface) -> dict:
    """`params` (SamplingParams fields) checked by the schema's own rules (`inference.options`).

    Raises:
        ApiError: 400 naming the field as `surface`'s clients spell it (`options.num_predict`).
    """
    params = {k: v for k, v in params.items() if v is not None}
    try:
        SamplingParams.from_any(params)
    except OptionError as e:
        raise ApiError(400, surface.error(e), param=surface.spell(e.field), code="invalid_value") from None
    return params


def sampling_field(name: str):
    """The type of a request field that is sampling option `name` (its range in the OpenAPI document)."""
    return api_type(SamplingParams, name)
