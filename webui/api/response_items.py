"""The Responses API's output side (`/v1/responses`, `webui.api.responses`): an answer as output items,
the Response object, and the stream of events that builds them.

Items, in the order the model writes them:
- `reasoning` {id "rs_…", summary [], content [{type "reasoning_text", text}]}: a thinking model's thoughts;
- `message` {id "msg_…", role "assistant", content [{type "output_text", text, annotations [], logprobs}]};
- `function_call` {id "fc_…", call_id (the engine's "call_…"), name, arguments (the JSON text written)}.
Each has `status` completed, or incomplete when `max_output_tokens` cut the answer. An answer that is
only tool calls has no message; an answer with neither text nor calls has an empty message (as OpenAI's).

`ItemStream.feed(event)` turns the worker's events into the stream events of those items, without
sequence numbers: per item response.output_item.added, then [response.content_part.added,
response.(reasoning_text|output_text).delta…, .done, response.content_part.done] or
[response.function_call_arguments.delta…, .done], then response.output_item.done. Whitespace the answer
starts with waits for text after it, so that an answer of tool calls gets no message of blanks.
"""

from __future__ import annotations

import json
import uuid

from appliance.events import Delta, Final, ToolCallDelta, Usage, logprob_dicts

from .common import Answer


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def incomplete(final: Final) -> bool:
    """Whether the answer was cut: by max_output_tokens, or a client that left."""
    return final.finish_reason in ("length", "cancelled")


def reasoning_item(text: str = "", status: str = "completed") -> dict:
    content = [{"type": "reasoning_text", "text": text}]
    return {"id": item_id("rs"), "type": "reasoning", "summary": [], "content": content, "status": status}


def message_item(text: str = "", lps: list | None = None, status: str = "completed") -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": lps or []}
    return {"id": item_id("msg"), "type": "message", "role": "assistant", "content": [part], "status": status}


def call_item(call_id: str, name: str, arguments: str = "", status: str = "completed") -> dict:
    item = {"id": item_id("fc"), "type": "function_call", "call_id": call_id, "name": name}
    return {**item, "arguments": arguments, "status": status}


def output(answer: Answer, logprobs: bool) -> list[dict]:
    """A whole answer's items (the non-streamed response)."""
    status = "incomplete" if incomplete(answer.final) else "completed"
    items = [reasoning_item(answer.thinking, status)] if answer.reasoning else []
    calls = []
    for i, (cid, name, args) in enumerate(answer.tool_calls()):
        pieces = "".join(answer.calls[i]["arguments"]) if i in answer.calls else ""
        calls.append(call_item(cid, name, pieces or json.dumps(args, ensure_ascii=False), status))
    if answer.text.strip() or not calls:
        items.append(message_item(answer.text, answer.lps if logprobs else [], status))
    return items + calls


class ItemStream:
    """The output items of one answer as its events arrive, and the stream events that build them."""

    def __init__(self, logprobs: bool):
        self.logprobs = logprobs
        self.items: list[dict] = []  # the output so far, in order
        self.open: dict | None = None  # the item being written
        self.spaces = ""  # the answer's leading whitespace, not yet shown
        self.calls: dict[int, dict] = {}  # tool call index → its item

    def _at(self, item: dict) -> dict:
        at = {"item_id": item["id"], "output_index": self.items.index(item)}
        return at if item["type"] == "function_call" else {**at, "content_index": 0}

    def _start(self, item: dict) -> list[dict]:
        """Close the open item and open `item`, its content part empty."""
        out = self.close()
        self.items.append(item)
        self.open = item
        out.append({"type": "response.output_item.added", "output_index": len(self.items) - 1, "item": _copy(item)})
        if item["type"] != "function_call":
            out.append({"type": "response.content_part.added", **self._at(item), "part": _copy(item["content"][0])})
        return out

    def close(self, status: str = "completed") -> list[dict]:
        item, self.open = self.open, None
        if item is None:
            return []
        item["status"] = status
        if item["type"] == "function_call":
            out = [{"type": "response.function_call_arguments.done", **self._at(item), "arguments": item["arguments"]}]
        else:
            part = item["content"][0]
            extra = {"logprobs": part["logprobs"]} if part["type"] == "output_text" else {}
            out = [
                {"type": f"response.{part['type']}.done", **self._at(item), "text": part["text"], **extra},
                {"type": "response.content_part.done", **self._at(item), "part": _copy(part)},
            ]
        index = self.items.index(item)
        return out + [{"type": "response.output_item.done", "output_index": index, "item": _copy(item)}]

    def output(self) -> list[dict]:
        return _copy(self.items)

    def _writing(self, kind: str) -> bool:
        return self.open is not None and self.open["type"] == kind

    def feed(self, ev) -> list[dict]:
        out: list[dict] = []
        if isinstance(ev, Delta) and ev.channel == "reasoning":
            if not self._writing("reasoning"):
                out = self._start(reasoning_item(status="in_progress"))
            self.open["content"][0]["text"] += ev.text
            return out + [{"type": "response.reasoning_text.delta", **self._at(self.open), "delta": ev.text}]
        if isinstance(ev, Delta):
            text, lps = ev.text, logprob_dicts(ev) if self.logprobs else []
            if not self._writing("message"):
                if not (self.spaces + text).strip() and not lps:
                    self.spaces += text
                    return []
                text, self.spaces = self.spaces + text, ""
                out = self._start(message_item(status="in_progress"))
            part = self.open["content"][0]
            part["text"] += text
            part["logprobs"] += lps
            return out + [{"type": "response.output_text.delta", **self._at(self.open), "delta": text, "logprobs": lps}]
        if isinstance(ev, ToolCallDelta):
            if ev.index not in self.calls:
                self.calls[ev.index] = call_item(ev.id, ev.name or "", status="in_progress")
                out = self._start(self.calls[ev.index])
            call = self.calls[ev.index]
            if ev.arguments:
                call["arguments"] += ev.arguments
                out.append({"type": "response.function_call_arguments.delta", **self._at(call), "delta": ev.arguments})
        return out

    def finish(self, final: Final) -> list[dict]:
        """Close the last item: a call the stream did not show is added whole, an answer with no item gets
        an empty message."""
        out: list[dict] = []
        for tc in final.tool_calls or ():
            call = next((c for c in self.calls.values() if c["call_id"] == tc.id), None)
            if call is None:
                out += self.feed(ToolCallDelta(index=len(self.calls), id=tc.id, name=tc.name))
                call = self.calls[len(self.calls) - 1]
            if not call["arguments"]:
                call["arguments"] = json.dumps(tc.arguments, ensure_ascii=False)
        if not self.items:
            out += self._start(message_item(status="in_progress"))
        return out + self.close("incomplete" if incomplete(final) else "completed")


def _copy(value):
    return json.loads(json.dumps(value))


def usage(final: Final) -> dict:
    u = final.usage or Usage()
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    }


def response_object(rid: str, created: int, req, fmt: dict, status: str, items: list, **extra) -> dict:
    """The Response object: what `req` asked echoed, the items answered, `store` false (nothing is kept)."""
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": req.model,
        "output": items,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": None,
        "reasoning": {"effort": (req.reasoning or {}).get("effort"), "summary": None},
        "store": False,
        "background": False,
        "temperature": req.temperature,
        "text": {"format": fmt},
        "tool_choice": req.tool_choice or "auto",
        "tools": req.tools or [],
        "top_p": req.top_p,
        "top_logprobs": req.top_logprobs,
        "truncation": "disabled",
        "usage": None,
        "user": req.user,
        "metadata": req.metadata or {},
        **extra,
    }
