"""API keys (stored hashed, each with a scope), chat sessions with their messages, and chat presets."""

from __future__ import annotations

import hashlib
import secrets
import uuid

from django.conf import settings
from django.db import models

KEY_PREFIX = "rkm-"


def hash_key(key: str) -> str:
    # keys are 32 random bytes: a plain SHA-256 is enough (no dictionary to guess from), and fast per request
    return hashlib.sha256(key.encode()).hexdigest()


class Scope(models.TextChoices):
    """What an API key may do; each scope includes the ones before it (`ApiKey.allows`).

    chat: generate and list (/v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings, /v1/models,
          /api/chat, /api/generate, /api/embed(dings), /api/tags, /api/ps, /api/show, /api/version);
    admin: also change what the appliance serves (/api/pull, /api/delete, an explicit load or unload).
    """

    CHAT = "chat"
    ADMIN = "admin"


class ApiKey(models.Model):
    name = models.CharField(max_length=100)
    # new keys and the keys made before scopes existed are chat keys (migration 0005): a key handed to an
    # app on the LAN cannot pull or delete models unless an administrator gave it the admin scope
    scope = models.CharField(max_length=10, choices=Scope.choices, default=Scope.CHAT)
    prefix = models.CharField(max_length=12, help_text="the first characters, to tell keys apart")
    digest = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True)
    revoked = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…{', revoked' if self.revoked else ''})"

    @classmethod
    def create(cls, name: str, scope: str = Scope.CHAT) -> tuple["ApiKey", str]:
        """A new key; the plain key is returned once and never stored.

        Raises:
            ValueError: an unknown scope.
        """
        if scope not in Scope.values:
            raise ValueError(f"scope {scope!r}: give one of {', '.join(Scope.values)}")
        k = cls(name=name, scope=scope)
        key = k.new_secret()
        k.save()
        return k, key

    def allows(self, scope: str) -> bool:
        """Whether this key has `scope` (admin includes chat)."""
        return Scope.values.index(self.scope) >= Scope.values.index(scope)

    def new_secret(self) -> str:
        """Give this (unsaved) key its secret; returns the plain key, which is not kept."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        self.prefix, self.digest = key[:10], hash_key(key)
        return key


class ChatSession(models.Model):
    """A conversation: through the web UI (by id) or the API (found again by its messages' digest).

    A chat page's conversation belongs to its `owner`, or with `RKMOJO_CHAT_OPEN` to an anonymous
    browser's session (`visitor`, its session key); API sessions have neither.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="chats"
    )
    visitor = models.CharField(max_length=64, blank=True, db_index=True)
    system = models.TextField(blank=True, help_text="the system prompt the conversation starts with")
    params = models.JSONField(default=dict, blank=True, help_text="sampling options (SamplingParams fields)")
    model = models.CharField(max_length=200)
    title = models.CharField(max_length=200, blank=True)
    source = models.CharField(max_length=20, default="api")  # openai | ollama | web
    # an API session's key (None: made without one, or the key was deleted since); the panel's owner column
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="sessions")
    # when its owner pinned it to the top of the chat page's list (None: not pinned)
    pinned = models.DateTimeField(null=True, blank=True)
    # "Summarize and continue": the model's summary of messages 0..summary_upto, which the prompt holds in
    # their place (after the system prompt); the messages stay in the conversation (None: no summary)
    summary = models.TextField(blank=True, default="")
    summary_upto = models.PositiveIntegerField(null=True, blank=True)
    digest = models.CharField(max_length=64, db_index=True, help_text="of the messages so far, reply included")
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated"]
        indexes = [models.Index(fields=["owner", "-updated"], name="chats_of_owner")]

    def __str__(self) -> str:
        return self.title or str(self.id)


class ChatMessage(models.Model):
    """One message of a conversation: role user, assistant, tool (an API's tool result) or system (API
    sessions keep their system messages in line; the chat page's is `ChatSession.system`)."""

    session = models.ForeignKey(ChatSession, on_delete=models.CASCADE, related_name="messages")
    index = models.PositiveIntegerField()
    role = models.CharField(max_length=20)
    content = models.TextField()
    created = models.DateTimeField(auto_now_add=True)
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    cached_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    # an answer's measurements (`appliance.events.Timings`) and why it ended (stop, length, cancelled)
    ttft = models.FloatField(null=True, blank=True)
    prefill_tps = models.FloatField(null=True, blank=True)
    decode_tps = models.FloatField(null=True, blank=True)
    expert_hit_rate = models.FloatField(null=True, blank=True)
    finish_reason = models.CharField(max_length=20, blank=True)
    # an answer's: the index of the first message its prompt held when older ones were left out to fit the
    # context (0: none were); the page's marker goes before that message (a conversation's indexes run
    # from 0 without gaps, and a summary's messages count as left out only past it)
    dropped = models.PositiveIntegerField(default=0)
    # an assistant's thinking before its answer, and the tools it called: [{id, name, arguments: dict}]
    reasoning = models.TextField(blank=True, default="")
    tool_calls = models.JSONField(default=list, blank=True)
    # a tool message (role "tool"): the call it answers and the tool's name
    tool_call_id = models.CharField(max_length=200, blank=True, default="")
    name = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["session", "index"]
        constraints = [models.UniqueConstraint(fields=["session", "index"], name="one_message_per_index")]


class Setting(models.Model):
    """A setting the administrator saved in the panel (`appliance.tunables`), by name; the value as JSON.

    Read through `webui.config` (the environment wins over it), never directly."""

    name = models.CharField(max_length=64, primary_key=True)
    value = models.JSONField()
    updated = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name}={self.value!r}"


class Preset(models.Model):
    """A named system prompt and sampling set of one chat page user (or, with `RKMOJO_CHAT_OPEN`, of an
    anonymous browser's session, as `ChatSession.visitor`), which a conversation takes on
    (`webui.chat.presets`). The built-in presets every user sees live in code there, not in this table."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="presets"
    )
    visitor = models.CharField(max_length=64, blank=True, db_index=True)
    name = models.CharField(max_length=100)
    system = models.TextField(blank=True, help_text="the system prompt a conversation starts with")
    params = models.JSONField(default=dict, blank=True, help_text="sampling options, as ChatSession.params")
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["owner", "visitor", "name"], name="one_preset_per_name")]

    def __str__(self) -> str:
        return self.name
