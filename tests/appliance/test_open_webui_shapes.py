"""Open WebUI's request shapes, replayed against the stack on both of its connections.

What Open WebUI sends (backend/open_webui, read 2026-12: utils/middleware.py, utils/tools.py,
tools/builtin.py, routers/openai.py, routers/ollama.py, utils/payload.py, routers/tasks.py,
utils/task.py, config.py):

- A plain chat with native function calling (its default): its built-in tools — the time tools always,
  chat search and knowledge tools by default — go out as `tools` [{"type": "function", "function": spec}],
  no `tool_choice`. A spec is langchain's `convert_to_openai_function` of the Python function's
  signature, cleaned: {"name", "description", "parameters": {"properties": {...}, "type": "object",
  "required"?}}, properties carrying "default" and "description", an argument-less function an empty
  `properties`. The tool specs below follow that shape; their texts are ours.
- On its OpenAI connection the body is the chat's own (`metadata` popped; `max_completion_tokens`
  renamed `max_tokens` for servers other than api.openai.com). Its tool loop sends the assistant's
  calls back as {"index", "id", "type", "function": {"name", "arguments": JSON text}} and each result
  as {"role": "tool", "tool_call_id", "content"}.
- On its Ollama connection (`convert_payload_openai_to_ollama`, then `GenerateChatCompletionForm`): the
  model named `name:latest`, the same `tools`, calls' arguments as objects with `content` "", and tool
  results with `role` and `content` only (the form's message model drops `tool_call_id`).
- Title, tags and follow-up generation (routers/tasks.py): one user message holding the task's prompt
  (the instructions, "JSON format: {...}", the last messages as "<chat_history>"), `stream` false, the
  title with `max_tokens` 1000. The UI keeps what lies between the first "{" and the last "}" of the
  content, `json.loads` it and reads "title", "tags" or "follow_ups", and falls back when that fails.
  A task model preset with JSON mode (`response_format` json_object, Ollama's `format` "json") makes the
  parse certain.

These run on a stack at the appliance's default context (4096 tokens): the task requests alone ask for
1000 tokens, more than the shared stack's 512.
"""

import json

import httpx
import jsonschema
import pytest
from test_home_assistant_shapes import appliance  # noqa: F401 (the stack at the default context)

MODEL = "smollm2"


def spec(name: str, description: str, properties: dict, required: list | None = None) -> dict:
    parameters = {"properties": properties, "type": "object"}
    if required:
        parameters["required"] = required
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def count(what: str) -> dict:
    return {"default": 0, "description": f"How many {what} before now (default: 0)", "type": "integer"}


BUILTIN_TOOLS = [
    spec("get_current_timestamp", "Get the current time as a Unix timestamp.", {}),
    spec(
        "calculate_timestamp",
        "Get the Unix timestamp of a moment some days, weeks, months or years ago.",
        {
            "days_ago": count("days"),
            "weeks_ago": count("weeks"),
            "months_ago": count("months"),
            "years_ago": count("years"),
        },
    ),
    spec(
        "search_chats",
        "Search the user's earlier chats.",
        {
            "query": {"description": "The words to look for", "type": "string"},
            "count": {"default": 5, "description": "How many chats to return", "type": "integer"},
        },
        ["query"],
    ),
    spec(
        "view_chat",
        "Read one earlier chat whole.",
        {"chat_id": {"description": "The chat's id", "type": "string"}},
        ["chat_id"],
    ),
    spec(
        "query_knowledge_files",
        "Search the user's knowledge files for passages about a question.",
        {"query": {"description": "What to look for", "type": "string"}, "count": {"default": 5, "type": "integer"}},
        ["query"],
    ),
]
QUESTION = "Why is the sky blue?"


@pytest.fixture
def owui(appliance):  # noqa: F811
    with httpx.Client(base_url=appliance.url, headers={"Authorization": f"Bearer {appliance.key}"}, timeout=300) as c:
        yield c


def sse(response: httpx.Response) -> list[dict]:
    """The chunks of an OpenAI stream (an error chunk fails the test)."""
    chunks = []
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            chunks.append(chunk)
    return chunks


def check_calls(calls: list[dict]) -> None:
    for call in calls:
        fn = next(t["function"] for t in BUILTIN_TOOLS if t["function"]["name"] == call["name"])
        jsonschema.validate(call["arguments"], fn["parameters"])


def openai_turn(owui, messages: list) -> dict:
    """One streamed turn on the OpenAI connection: its text, its calls (arguments parsed), why it ended."""
    body = {"model": MODEL, "messages": messages, "stream": True, "tools": BUILTIN_TOOLS}
    with owui.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        chunks = sse(r)
    text, calls, finish = "", {}, None
    for c in chunks:
        choice = c["choices"][0] if c["choices"] else {}
        finish = choice.get("finish_reason") or finish
        text += choice.get("delta", {}).get("content") or ""
        for tc in choice.get("delta", {}).get("tool_calls") or ():
            call = calls.setdefault(tc["index"], {"id": tc.get("id"), "name": "", "arguments": ""})
            call["name"] += tc["function"].get("name") or ""
            call["arguments"] += tc["function"].get("arguments") or ""
    calls = [{**c, "arguments": json.loads(c["arguments"] or "{}")} for _, c in sorted(calls.items())]
    check_calls(calls)
    # an answer that ended by itself says something (the tiny model may also write until the context ends)
    assert text.strip() or calls or finish == "length"
    return {"content": text, "tool_calls": calls}


def ollama_turn(owui, messages: list) -> dict:
    """One streamed turn on the Ollama connection, as Open WebUI's Ollama router sends it."""
    body = {"model": f"{MODEL}:latest", "messages": messages, "stream": True, "tools": BUILTIN_TOOLS}
    with owui.stream("POST", "/api/chat", json=body) as r:
        assert r.status_code == 200, r.read()
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert all("error" not in line for line in lines) and lines[-1]["done"]
    calls = [tc["function"] for line in lines for tc in line["message"].get("tool_calls") or ()]
    check_calls(calls)
    text = "".join(line["message"].get("content", "") for line in lines)
    assert text.strip() or calls or lines[-1]["done_reason"] == "length"
    return {"content": text, "tool_calls": calls}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat"], ids=["openai", "ollama"])
def test_a_plain_question_with_the_builtin_tools_is_served_not_refused(owui, path):
    """The request is valid and computing: 200, the answer's stream in the connection's format. The model
    here has Open WebUI's "Max Tokens" parameter set (sent as `max_tokens`, on the Ollama connection as
    `options.num_predict`): the status line comes with the first bytes, which a free answer of the tiny
    model may not write for a minute (the slow tests below read the free answers)."""
    body = {"messages": [{"role": "user", "content": QUESTION}], "stream": True, "tools": BUILTIN_TOOLS}
    if path == "/api/chat":
        body.update(model=f"{MODEL}:latest", options={"num_predict": 48})
    else:
        body.update(model=MODEL, max_tokens=48)
    with owui.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith(("text/event-stream", "application/x-ndjson"))
        assert "error" not in next(line for line in r.iter_lines() if line)


@pytest.mark.slow
def test_a_plain_question_with_the_builtin_tools_gets_an_answer_on_the_openai_connection(owui):
    openai_turn(owui, [{"role": "user", "content": QUESTION}])


@pytest.mark.slow
def test_a_plain_question_with_the_builtin_tools_gets_an_answer_on_the_ollama_connection(owui):
    ollama_turn(owui, [{"role": "user", "content": QUESTION}])


@pytest.mark.slow
def test_its_tool_loop_gets_the_final_answer_on_the_openai_connection(owui):
    """A result sent back as Open WebUI's native loop sends it; the next turn is served."""
    messages = [{"role": "user", "content": "What time is it?"}]
    call = {"id": "call_owui0", "name": "get_current_timestamp", "arguments": {}}
    assistant = {"role": "assistant", "content": "", "tool_calls": [owui_call(0, call)]}
    result = {"role": "tool", "tool_call_id": call["id"], "content": '{"current_timestamp": 1796645328}'}
    openai_turn(owui, [*messages, assistant, result])


def owui_call(index: int, call: dict) -> dict:
    fn = {"name": call["name"], "arguments": json.dumps(call["arguments"])}
    return {"index": index, "id": call["id"], "type": "function", "function": fn}


@pytest.mark.slow
def test_its_tool_loop_gets_the_final_answer_on_the_ollama_connection(owui):
    """The same loop on the Ollama connection: arguments as objects, the result without tool_call_id."""
    call = {"index": 0, "id": "call_owui0", "function": {"name": "get_current_timestamp", "arguments": {}}}
    ollama_turn(
        owui,
        [
            {"role": "user", "content": "What time is it?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": '{"current_timestamp": 1796645328}'},
        ],
    )


# --- title, tags, follow-ups -------------------------------------------------------------------------
HISTORY = f"USER: {QUESTION}\nASSISTANT: Sunlight scatters off the air; blue light scatters the most."
TASKS = {
    "title": (
        "Write a short title of 3 to 5 words for the chat below.",
        '{ "title": "the title" }',
        {"max_tokens": 1000},
    ),
    "tags": ("Give 1 to 3 broad tags for the themes of the chat below.", '{ "tags": ["tag1", "tag2"] }', {}),
    "follow_ups": (
        "Suggest 3 questions the user might ask next in the chat below.",
        '{ "follow_ups": ["Question 1?", "Question 2?"] }',
        {},
    ),
}
KEY_TYPES = {"title": str, "tags": list, "follow_ups": list}
# free text runs as long as the tiny model likes (Open WebUI sets no limit but the title's 1000 tokens)
JSON_MODES = [pytest.param(False, id="default", marks=pytest.mark.slow), pytest.param(True, id="task-model-json-mode")]


def task_prompt(task: str) -> str:
    what, fmt, _ = TASKS[task]
    history = f"<chat_history>\n{HISTORY}\n</chat_history>"
    return f"### Task:\n{what}\n### Output:\nJSON format: {fmt}\n### Chat History:\n{history}"


def ui_reads(content: str, key: str):
    """What the UI makes of a task's answer: the key's value, or None where it falls back."""
    inner = content[content.find("{") : content.rfind("}") + 1]
    try:
        value = json.loads(inner).get(key)
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, KEY_TYPES[key]) else None


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("json_mode", JSON_MODES)
def test_a_task_request_on_the_openai_connection_gets_an_answer_the_ui_reads(owui, task, json_mode):
    body = {"model": MODEL, "messages": [{"role": "user", "content": task_prompt(task)}], "stream": False}
    body.update(TASKS[task][2])
    if json_mode:
        body["response_format"] = {"type": "json_object"}
    r = owui.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["message"]["content"]
    assert isinstance(content, str)
    ui_reads(content, task)  # never raises: the UI falls back on anything else
    if json_mode:
        assert isinstance(json.loads(content), dict)


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("json_mode", JSON_MODES)
def test_a_task_request_on_the_ollama_connection_gets_an_answer_the_ui_reads(owui, task, json_mode):
    body = {"model": f"{MODEL}:latest", "messages": [{"role": "user", "content": task_prompt(task)}], "stream": False}
    if json_mode:
        body["format"] = "json"
    r = owui.post("/api/chat", json=body)
    assert r.status_code == 200, r.text
    content = r.json()["message"]["content"]
    assert isinstance(content, str)
    ui_reads(content, task)
    if json_mode:
        assert isinstance(json.loads(content), dict)
