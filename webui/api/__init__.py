"""HTTP APIs: `openai` (/v1/*) and `ollama` (/api/*) over the shared request plumbing in `jobs`."""
