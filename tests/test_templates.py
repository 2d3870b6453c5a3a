"""Chat templates render exactly as transformers' `apply_chat_template` does, for real templates.

Each template is installed in a small store (the demo tokenizer plus a tokenizer_config.json naming the
model's special tokens and its template); transformers loads the same directory with
`AutoTokenizer.from_pretrained`, so both sides see the same files.
"""

import json
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer
from transformers import AutoTokenizer

from inference.store import Store, StoreWriter
from inference.templates import FALLBACK_TEMPLATE, ChatTemplate, ChatTemplateError
from inference.tokenizer import StoreTokenizer

FIXTURES = Path(__file__).parent / "fixtures" / "chat_templates"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "description": "Forecast days", "nullable": True},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "where": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "now", "description": "The time", "parameters": {"type": "object", "properties": {}}},
    },
]

CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
}
CALL_STR = {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": "{}"}}

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system_user": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
    "multi_turn": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "  And 3+3?  "},
    ],
    "assistant_last": [
        {"role": "system", "content": "Be nice."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
    ],
    "unicode": [{"role": "user", "content": "Ça va ? 👩‍👩‍👧 中文\n\nline two"}],
    "thinking_inline": [
        {"role": "user", "content": "Think first."},
        {"role": "assistant", "content": "<think>\nLet me see.\n</think>\n\nDone."},
        {"role": "user", "content": "Again?"},
    ],
    "reasoning_field": [
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "Because.", "reasoning_content": "I should explain."},
    ],
    "tool_calls": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [CALL, CALL_STR],
            "reasoning_content": "Need the weather.",
        },
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"temp": 21}'},
        {"role": "tool", "tool_call_id": "call_2", "name": "now", "content": "12:00"},
        {"role": "assistant", "content": "It is 21 °C at noon."},
    ],
    "tool_pending": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ],
    "content_parts": [
        {"role": "system", "content": [{"type": "text", "text": "Part one."}, {"type": "text", "text": "Part two."}]},
        {"role": "user", "content": [{"type": "text", "text": " Describe "}, {"type": "text", "text": "this."}]},
    ],
    "alternation_broken": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
}

# plain conversations every template accepts (the others may be refused, by both sides alike)
EVERY_TEMPLATE_RENDERS = {
    "user",
    "system_user",
    "multi_turn",
    "assistant_last",
    "unicode",
    "thinking_inline",
    "reasoning_field",
}
TEMPLATES = {
    "smollm2": None,  # read from the demo GGUF's metadata via the store
    "qwen3": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "gemma4": {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"},
}
VARIANTS = [
    {"add_generation_prompt": True},
    {"add_generation_prompt": False},
    {"add_generation_prompt": True, "tools": TOOLS},
    {"add_generation_prompt": True, "enable_thinking": False},
    {"add_generation_prompt": True, "enable_thinking": True},
]


def make_store(tmp: Path, template: str, special: dict, tokenizer_json: bytes) -> Path:
    """A store holding nothing but tokenizer files (enough for both tokenizers); the model's special
    tokens are added to the demo vocabulary, as the model's own tokenizer has them."""
    out = tmp / "store"
    tok = Tokenizer.from_str(tokenizer_json.decode())
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special.values()])
    tokenizer_json = tok.to_str().encode()
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template, **special}
    with StoreWriter(out, "llama", {"model_type": "llama"}) as w:
        w.add_tokenizer_file("tokenizer.json", tokenizer_json)
        w.add_tokenizer_file("tokenizer_config.json", json.dumps(config).encode())
        w.finish()
    return out


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def pair(request, smollm2_store, tmp_path_factory):
    """(our tokenizer, transformers' tokenizer) over the same store, for one real template."""
    name = request.param
    if name == "smollm2":
        path = smollm2_store
    else:
        template = (FIXTURES / f"{name}.jinja").read_text()
        tj = (smollm2_store / "tokenizer.json").read_bytes()
        path = make_store(tmp_path_factory.mktemp(name), template, TEMPLATES[name], tj)
    ours = StoreTokenizer(Store(path))
    hf = AutoTokenizer.from_pretrained(str(path))
    assert ours.has_template and hf.chat_template == ours.template_source
    return name, ours, hf


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
def test_it_renders_like_transformers(pair, conversation):
    name, ours, hf = pair
    messages = CONVERSATIONS[conversation]
    compared = 0
    for variant in VARIANTS:
        kw = dict(variant)
        try:
            want = hf.apply_chat_template(messages, tokenize=False, **kw)
        except Exception as e:  # the template refused: ours must refuse as well
            with pytest.raises(ChatTemplateError):
                ours.render_chat(messages, **kw)
            assert str(e)  # transformers' reason, for the reader of a failure
            continue
        got = ours.render_chat(messages, **kw)
        assert got == want, f"{name}/{conversation}/{variant}"
        assert ours.encode_chat(messages, **kw) == hf.apply_chat_template(messages, tokenize=True, **kw)["input_ids"]
        compared += 1
    if conversation in EVERY_TEMPLATE_RENDERS:
        assert compared, "every variant failed: the comparison checked nothing"


def test_the_demo_template_renders_the_default_system_prompt(smollm2_store):
    tok = StoreTokenizer(Store(smollm2_store))
    text = tok.render_chat([{"role": "user", "content": "Hi"}])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_raise_exception_becomes_a_chat_template_error():
    t = ChatTemplate("{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok")
    assert t.render([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(ChatTemplateError, match="first must be user"):
        t.render([{"role": "assistant", "content": "x"}])


def test_the_sandbox_blocks_access_to_python_internals():
    t = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError):
        t.render([{"role": "user", "content": "x"}])
    t = ChatTemplate("{% set ns = namespace() %}{% set ns._x = 1 %}")
    with pytest.raises(ChatTemplateError):
        t.render([{"role": "user", "content": "x"}])


def test_tojson_keeps_unicode_and_the_generation_block_renders_its_body():
    t = ChatTemplate("{{ tools | tojson }}|{% generation %}{{ messages[0]['content'] }}{% endgeneration %}")
    assert t.render([{"role": "user", "content": "é"}], tools=[{"name": "café"}]) == '[{"name": "café"}]|é'


def test_a_template_that_does_not_compile_names_the_line():
    with pytest.raises(ChatTemplateError, match="line 2"):
        ChatTemplate("ok\n{% for %}")


def test_a_store_without_a_template_uses_chatml_when_the_vocabulary_has_it(smollm2_store, tmp_path):
    path = tmp_path / "store"
    with StoreWriter(path, "llama", {"model_type": "llama"}) as w:
        w.add_tokenizer_file("tokenizer.json", (smollm2_store / "tokenizer.json").read_bytes())
        w.finish()
    tok = StoreTokenizer(Store(path))
    assert not tok.has_template and tok.template_source == FALLBACK_TEMPLATE
    assert (
        tok.render_chat([{"role": "user", "content": "Hi"}])
        == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_messages_are_validated():
    t = ChatTemplate(FALLBACK_TEMPLATE)
    with pytest.raises(ChatTemplateError, match="empty"):
        t.render([])
    with pytest.raises(ChatTemplateError, match=r"messages\[0\]"):
        t.render([{"content": "no role"}])
