"""The chat page's forms: a new conversation (model, system prompt, sampling) and a message.

The sampling fields are made from the engine's option schema (`SamplingParams`: help, range) and
checked by it (`webui.api.params.check_sampling`), the same rule the APIs apply; the browser gets the
ranges as min/max hints only. The WebSocket takes the same form for a new conversation.
"""

from __future__ import annotations

import typing

from django import forms

from inference.options import OPENAI, specs
from inference.sampler import SamplingParams

from ..api.common import ApiError
from ..api.params import check_sampling

SAMPLING = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "seed")


def _sampling_field(name: str) -> forms.Field:
    tp, spec = specs(SamplingParams)[name]
    lo = spec.ge if spec.ge is not None else spec.gt
    hi = spec.le if spec.le is not None else spec.lt
    attrs = {
        "placeholder": "default",
        **({"min": lo} if lo is not None else {}),
        **({"max": hi} if hi is not None else {}),
    }
    if int in (tp, *typing.get_args(tp)):
        return forms.IntegerField(required=False, help_text=spec.help, widget=forms.NumberInput(attrs=attrs))
    return forms.FloatField(required=False, help_text=spec.help, widget=forms.NumberInput({**attrs, "step": "any"}))


def model_defaults(generation: dict | None) -> dict:
    """What an empty sampling field means for a model: its generation config, else the engine's default
    (the engine's own rule, `SamplingParams.resolve`); fields without one (max tokens, seed) left out."""
    resolved = SamplingParams().resolve(generation or {})
    return {name: getattr(resolved, name) for name in SAMPLING if getattr(resolved, name) is not None}


class NewChatForm(forms.Form):
    model = forms.ChoiceField()
    system = forms.CharField(
        required=False,
        max_length=20000,
        label="System prompt",
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "You are a helpful assistant."}),
    )
    locals().update({name: _sampling_field(name) for name in SAMPLING})
    stop = forms.CharField(
        required=False,
        max_length=2000,
        help_text="strings that end the answer, one a line",
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": "strings that end the answer, one a line"}),
    )
    text = forms.CharField(
        required=False,
        max_length=300000,
        label="Message",
        strip=False,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "Ask something"}),
    )

    def __init__(self, *args, models: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["model"].choices = [(m, m) for m in models]
        for name, f in self.fields.items():
            if name != "text":
                f.widget.attrs["form"] = "composer"  # the page's one composer form sends them with the message

    def sampling(self, defaults: dict) -> list[tuple]:
        """(bound field, its default for the chosen model) in the page's order."""
        return [(self[name], defaults.get(name)) for name in (*SAMPLING, "stop")]

    def clean(self):
        data = super().clean()
        params = {k: data.get(k) for k in SAMPLING if data.get(k) is not None}
        stop = [s for s in (data.get("stop") or "").splitlines() if s]
        if stop:
            params["stop"] = stop
        try:
            data["params"] = check_sampling(params, OPENAI)
        except ApiError as e:
            self.add_error(e.param if e.param in self.fields else None, str(e))
        return data

    def first_error(self) -> ApiError:
        """The form's first error as the API error the WebSocket sends."""
        field, errs = next(iter(self.errors.items()))
        return ApiError(400, f"{field}: {errs[0]}" if field != "__all__" else errs[0], param=field)


class MessageForm(forms.Form):
    text = forms.CharField(max_length=300000, strip=False, widget=forms.Textarea(attrs={"rows": 3}))


class RenameForm(forms.Form):
    title = forms.CharField(max_length=200)


class ImportForm(forms.Form):
    file = forms.FileField(help_text="a JSON export of this page")
