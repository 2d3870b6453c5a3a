"""Option sets declared once. A dataclass field made with `option(...)` carries its name, type (the
annotation), range, default and help; everything else is derived from that one declaration:

- validation: `check(obj)` raises `OptionError` carrying the field's own name, its value and its range
  (nobody parses an error text to find out which field was bad);
- the command line: `add_flags(group, cls)` and `from_flags(cls, namespace)`;
- the environment: `from_env(cls, environ)` reads `RKMOJO_<NAME>` and fails loudly naming the variable;
- the HTTP APIs: `api_type(cls, name)` is the field's type for a pydantic request model, its range
  published in the OpenAPI document;
- each surface's spelling: `Surface` alias tables (OpenAI, Ollama, CLI, environment), so an error names
  the field as that client sent it (`options.num_predict`, `--repeat-penalty`, `RKMOJO_EXPERT_SLOTS`).

Pydantic does the type and range checks (strict: no bool for a number, no NaN); this module only adds
one declaration per field and the spellings. The option sets themselves live beside their users:
`inference.sampler.SamplingParams` and `inference.engine.EngineConfig`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Mapping

from pydantic import Field, TypeAdapter, ValidationError

from .errors import RkmojoError

ENV_PREFIX = "RKMOJO_"


@dataclass(frozen=True)
class Spec:
    """An option's declaration besides its name, type and default (which the dataclass field holds)."""

    help: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[str, ...] | None = None
    parse: Callable[[str], Any] | None = None  # text (a flag, a variable) → value, e.g. "6G" → bytes


def option(default: Any = None, *, help: str, ge=None, gt=None, le=None, lt=None, choices=None, parse=None) -> Any:
    """A dataclass field that is an option (see the module docstring)."""
    spec = Spec(help, ge, gt, le, lt, tuple(choices) if choices else None, parse)
    return dataclasses.field(default=default, metadata={"option": spec})


class OptionError(RkmojoError, ValueError):
    """An option's value is of the wrong type or out of range. `field` is the option's own name."""

    def __init__(self, field: str, value: Any, allowed: str):
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(self.spelled(field))

    def spelled(self, name: str) -> str:
        """The message with the option named as a surface spells it (`options.temperature`, `--temperature`)."""
        return f"{name}={self.value!r} is out of range; allowed: {self.allowed}"


@functools.cache
def specs(cls: type) -> dict[str, tuple[Any, Spec]]:
    """{option name: (its type, its Spec)} of an option set, in declaration order."""
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], f.metadata["option"]) for f in dataclasses.fields(cls) if "option" in f.metadata}


def _base(tp: Any) -> Any:
    """`int | None` → int."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if args else tp


def allowed(tp: Any, spec: Spec) -> str:
    """The range in words: `[0, 2]`, `(0, 1]`, `an integer ≥ 1`, `one of lfu, lru`, `on or off`."""
    if spec.choices:
        return f"one of {', '.join(spec.choices)}"
    if _base(tp) is bool:
        return "on or off"
    lo, lo_open = (spec.gt, True) if spec.gt is not None else (spec.ge, False)
    hi, hi_open = (spec.lt, True) if spec.lt is not None else (spec.le, False)
    kind = "an integer" if _base(tp) is int else "a number"
    if lo is not None and hi is not None:
        text = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        return f"an integer in {text}" if _base(tp) is int else text
    if lo is not None:
        return f"{kind} {'>' if lo_open else '≥'} {lo:g}"
    if hi is not None:
        return f"{kind} {'<' if hi_open else '≤'} {hi:g}"
    return kind


def _constraints(spec: Spec) -> dict:
    return {k: v for k, v in (("ge", spec.ge), ("gt", spec.gt), ("le", spec.le), ("lt", spec.lt)) if v is not None}


@functools.cache
def _adapter(cls: type, name: str) -> TypeAdapter:
    tp, spec = specs(cls)[name]
    if spec.choices:
        optional = type(None) in typing.get_args(tp)
        tp = typing.Optional[typing.Literal[spec.choices]] if optional else typing.Literal[spec.choices]
        return TypeAdapter(tp)  # a Literal is strict already
    nan = {"allow_inf_nan": False} if _base(tp) is float else {}
    return TypeAdapter(Annotated[tp, Field(strict=True, **_constraints(spec), **nan)])


def check_value(cls: type, name: str, value: Any) -> Any:
    """`value` checked as option `name` of `cls`.

    Raises:
        OptionError: wrong type or out of range.
    """
    try:
        return _adapter(cls, name).validate_python(value)
    except ValidationError:
        tp, spec = specs(cls)[name]
        raise OptionError(name, value, allowed(tp, spec)) from None


def check(obj: Any) -> None:
    """Every option field of the dataclass instance `obj` checked (call it from `__post_init__`)."""
    for name in specs(type(obj)):
        check_value(type(obj), name, getattr(obj, name))


def api_type(cls: type, name: str) -> Any:
    """Option `name` as the type of a pydantic request field: its type (ranges left to `check`, so that an
    out-of-range value is refused by the same rule everywhere) with the range and help in the JSON schema."""
    tp, spec = specs(cls)[name]
    bounds = {"minimum": spec.ge, "exclusiveMinimum": spec.gt, "maximum": spec.le, "exclusiveMaximum": spec.lt}
    extra = {k: v for k, v in bounds.items() if v is not None}
    if spec.choices:
        extra["enum"] = list(spec.choices)
    return Annotated[tp | None, Field(description=spec.help, json_schema_extra=extra or None)]


# --- surfaces: how each one spells an option ---------------------------------------------------------
@dataclass(frozen=True)
class Surface:
    """How one surface names options: `aliases` for the names it spells differently, then `style`."""

    name: str
    style: Callable[[str], str] = str
    aliases: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def spell(self, option_name: str) -> str:
        return self.style(self.aliases.get(option_name, option_name))

    def error(self, e: OptionError) -> str:
        return e.spelled(self.spell(e.field))


OPENAI = Surface("openai")
OLLAMA = Surface("ollama", "options.{}".format, {"max_tokens": "num_predict", "repetition_penalty": "repeat_penalty"})
CLI = Surface(
    "cli", lambda n: "--" + n.replace("_", "-"), {"repetition_penalty": "repeat_penalty", "policy": "cache_policy"}
)
ENV = Surface("env", lambda n: ENV_PREFIX + n.upper())


# --- command line and environment ---------------------------------------------------------------------
def add_flags(group, cls: type, *, exclude: tuple[str, ...] = ()) -> None:
    """One argparse flag per option of `cls` (but those in `exclude`), default None: "not given"."""
    for name, (tp, spec) in specs(cls).items():
        if name in exclude:
            continue
        kw = (
            {"choices": list(spec.choices)}
            if spec.choices
            else {
                "type": str if spec.parse else _base(tp) if _base(tp) in (int, float) else str,
                "metavar": "{on,off}" if _base(tp) is bool else CLI.spell(name).lstrip("-").replace("-", "_").upper(),
            }
        )
        group.add_argument(CLI.spell(name), dest=name, default=None, help=f"{spec.help} ({allowed(tp, spec)})", **kw)


def from_flags(cls: type, namespace) -> dict:
    """The options given on the command line, checked.

    Raises:
        ValueError: naming the flag (`--temperature=5.0 is out of range; allowed: [0, 2]`).
    """
    given = {n: getattr(namespace, n) for n in specs(cls) if getattr(namespace, n, None) is not None}
    return {name: read_value(cls, name, value, CLI) for name, value in given.items()}


def read_value(cls: type, name: str, value: Any, surface: Surface) -> Any:
    """`value` (text from a flag, a variable or a saved setting, or already typed) as option `name`, checked.

    Raises:
        ValueError: naming the option as `surface` spells it.
    """
    tp, spec = specs(cls)[name]
    try:
        if isinstance(value, str) and spec.parse is not None:
            return check_value(cls, name, spec.parse(value))
        if isinstance(value, str) and _base(tp) is bool:
            return check_value(cls, name, parse_bool(value))
        if isinstance(value, str) and _base(tp) in (int, float):
            return check_value(cls, name, TypeAdapter(_base(tp)).validate_strings(value))
        return check_value(cls, name, value)
    except (OptionError, ValidationError):  # out of range, or text that is not a number: named as given
        raise ValueError(OptionError(name, value, allowed(tp, spec)).spelled(surface.spell(name))) from None
    except (RkmojoError, ValueError) as e:  # text the option's own parser refuses
        raise ValueError(f"{surface.spell(name)}={value!r}: {e}") from None


def parse_bool(text: str) -> bool:
    """An on/off option written as text: 1/true/yes/on or 0/false/no/off.

    Raises:
        ValueError: saying what it takes.
    """
    word = text.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError("write on or off (1/true/yes or 0/false/no)")


def from_env(cls: type, environ: Mapping[str, str] | None = None, names: tuple[str, ...] | None = None) -> dict:
    """The options set as `RKMOJO_<NAME>` environment variables (empty means unset), parsed and checked.

    Raises:
        ValueError: naming the variable (`RKMOJO_TEMPERATURE='5' is out of range; allowed: [0, 2]`).
    """
    environ = os.environ if environ is None else environ
    given = {n: environ.get(ENV.spell(n), "").strip() for n in specs(cls) if names is None or n in names}
    return {name: read_value(cls, name, raw, ENV) for name, raw in given.items() if raw}
