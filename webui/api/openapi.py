"""`GET /openapi.json`: an OpenAPI 3.1 document for both APIs, built from the pydantic request models the
views validate with — the document cannot drift from what the server accepts.

Sampling fields carry the engine schema's ranges (`inference.options.api_type`); a 4xx answer is
OpenAI's `{"error": {message, type, param, code}}` under /v1 and Ollama's `{"error": "..."}` under /api.
"""

from __future__ import annotations

import functools

from django.http import JsonResponse
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from . import ollama, openai, responses
from .common import api_view

REF = "#/components/schemas/{model}"
# (path, method, flavor, request body model or None, summary)
ENDPOINTS: list[tuple[str, str, str, type[BaseModel] | None, str]] = [
    ("/v1/chat/completions", "post", "openai", openai.ChatRequest, "A chat completion (SSE when stream is true)"),
    ("/v1/completions", "post", "openai", openai.CompletionRequest, "A text completion (SSE when stream is true)"),
    ("/v1/responses", "post", "openai", responses.ResponsesRequest, "A response, stateless (SSE when stream is true)"),
    ("/v1/embeddings", "post", "openai", openai.EmbeddingRequest, "Embeddings of one or more texts"),
    ("/v1/models", "get", "openai", None, "The models the workers serve"),
    ("/api/chat", "post", "ollama", ollama.ChatRequest, "A chat answer (NDJSON unless stream is false)"),
    ("/api/generate", "post", "ollama", ollama.GenerateRequest, "A completion (NDJSON unless stream is false)"),
    ("/api/embed", "post", "ollama", ollama.EmbedRequest, "Embeddings of one or more texts"),
    ("/api/embeddings", "post", "ollama", ollama.LegacyEmbeddingsRequest, "The embedding of one prompt (older API)"),
    ("/api/tags", "get", "ollama", None, "The installed models"),
    ("/api/ps", "get", "ollama", None, "The loaded models and the requests running or waiting"),
    ("/api/show", "post", "ollama", ollama.ModelRequest, "A model's details"),
    ("/api/version", "get", "ollama", None, "The Ollama API level served"),
    ("/api/delete", "delete", "ollama", ollama.ModelRequest, "Delete a model from every worker"),
    ("/api/pull", "post", "ollama", ollama.PullRequest, "Install a model (NDJSON progress unless stream is false)"),
]
ERRORS = {
    "OpenAIError": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "null"]},
                },
            }
        },
    },
    "OllamaError": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
}


@functools.cache
def document() -> dict:
    models = sorted({m for *_, m, _ in ENDPOINTS if m is not None}, key=lambda m: m.__qualname__)
    refs, defs = models_json_schema([(m, "validation") for m in models], ref_template=REF)
    schemas = {**ERRORS, **defs.get("$defs", {})}
    paths: dict[str, dict] = {}
    for path, method, flavor, model, summary in ENDPOINTS:
        error = {
            "content": {
                "application/json": {
                    "schema": {"$ref": REF.format(model="OpenAIError" if flavor == "openai" else "OllamaError")}
                }
            }
        }
        op = {
            "summary": summary,
            "operationId": f"{flavor}_{path.rsplit('/', 1)[-1]}_{method}",
            "responses": {
                "200": {"description": "the answer"},
                "4XX": {"description": "a request the server refuses", **error},
            },
        }
        if model is not None:
            op["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": refs[(model, "validation")]}},
            }
        paths.setdefault(path, {})[method] = op
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "rkmojo",
            "version": "0.1.0",
            "description": "OpenAI- and Ollama-compatible APIs of an rkmojo appliance",
        },
        "components": {"schemas": schemas, "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}}},
        "security": [{"apiKey": []}, {}],
        "paths": paths,
    }


@api_view("openai", ("GET",), auth=False)
async def openapi_json(request, body):
    return JsonResponse(document())
