"""The Django app: API views (`/v1/*` OpenAI, `/api/*` Ollama), Channels consumers, models (API keys, chat sessions)."""
