"""Django settings, from environment variables (see `env.py`); safe defaults for one machine.

The data directory (`RKMOJO_DATA`, else `RKMOJO_HOME`, else ~/.local/share/rkmojo) holds models/,
prompt-cache/, db.sqlite3, the generated secret key and logs; on a board it is the NVMe mount.
"""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path

import dj_database_url

from inference.engine import EngineConfig
from inference.sampler import SamplingParams

from .env import env_bool, env_choice, env_duration, env_int, env_list, env_options, env_path, env_str
from .hosts import MachineHosts
from .tunables import SERVICE

DATA_DIR = env_path("RKMOJO_DATA", env_path("RKMOJO_HOME", Path.home() / ".local" / "share" / "rkmojo"))
MODELS_DIR = DATA_DIR / "models"
PROMPT_CACHE_DIR = DATA_DIR / "prompt-cache"


def _secret_key() -> str:
    """`SECRET_KEY` from the environment, else generated once into the data directory (mode 0600)."""
    given = env_str("SECRET_KEY") or env_str("DJANGO_SECRET_KEY")
    if given:
        return given
    path = DATA_DIR / "secret_key"
    if not path.is_file():
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".secret_key.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(50))
        try:
            os.link(tmp, path)  # the first process to get here wins; the others read its key
        except FileExistsError:
            pass
        tmp.unlink()
    return path.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("RKMOJO_DEBUG", False)
# the machine's own names and addresses, refreshed as they change, plus RKMOJO_ALLOWED_HOSTS (names a
# proxy or the LAN's DNS gives it): any other Host header is a 400, any other Origin a 403 (webui.door)
ALLOWED_HOSTS = MachineHosts(env_list("RKMOJO_ALLOWED_HOSTS", []))

INSTALLED_APPS = [
    "daphne",
    "webui",  # before django.contrib.auth: its createsuperuser (password validators under --noinput) wins
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "webui.headers.PageHeadersMiddleware",  # Content-Security-Policy, no-store; static files' too
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "webui.door.LanDoorMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# `django check --deploy` for a LAN appliance served over plain HTTP (no certificate a LAN name could
# carry): HSTS (W004), the HTTPS redirect (W008) and HTTPS-only cookies (W012, W016) would lock every
# client out. Set them in front of a TLS proxy instead. The session and CSRF cookies stay HttpOnly/Lax.
SILENCED_SYSTEM_CHECKS = ["security.W004", "security.W008", "security.W012", "security.W016"]
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
X_FRAME_OPTIONS = "DENY"

ROOT_URLCONF = "appliance.urls"
ASGI_APPLICATION = "appliance.asgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": dj_database_url.parse(env_str("DATABASE_URL", f"sqlite:///{DATA_DIR / 'db.sqlite3'}"), conn_max_age=0)
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # daphne's thread pool and the async ORM write from several threads: wait for the lock instead of failing
    DATABASES["default"]["OPTIONS"] = {"timeout": 20, "transaction_mode": "IMMEDIATE"}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
# every place a password is set (/setup/, the panel's users, Django's admin, `createsuperuser`) checks it
# with these; the page shows their messages. 12 characters: a LAN neighbour may guess online (throttled,
# `webui.throttle`) but a stolen db.sqlite3 is guessed offline, where only length helps
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/chat/"
LOGOUT_REDIRECT_URL = "/login/"
STATIC_URL = "static/"
STATIC_ROOT = None  # no collectstatic step: WhiteNoise serves the apps' static files (the admin's CSS) where installed
WHITENOISE_USE_FINDERS = True
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("RKMOJO_MAX_REQUEST_BYTES", 16 * 2**20, minimum=1024)

# --- Redis: broker, event streams, worker registry, channel layer -------------------------------
REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
# redis-py 8 reads with a 5 s socket timeout by default, and channels_redis waits for a socket's next message
# with a 5 s BZPOPMIN: a socket idle that long raised TimeoutError in its consumer. Wait longer than the pop.
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 15}], "prefix": "rkmojo:channels:"},
    }
}

# Celery reads every CELERY_* name below (appliance/celery.py).
CELERY_BROKER_URL = REDIS_URL
CELERY_TASK_IGNORE_RESULT = True  # results travel over the per-request event stream, not a result backend
CELERY_TASK_ACKS_LATE = False  # a task whose worker died is not run again: its client has had its error
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# a queue's lists by priority, the first non-empty taken (`webui.api.priority`: interactive before background)
CELERY_BROKER_TRANSPORT_OPTIONS = {"queue_order_strategy": "priority"}
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]

# --- the appliance ------------------------------------------------------------------------------
RKMOJO = {
    # the settings the admin panel also edits (`tunables.SERVICE`: queue limit, keep-alive, API-key policy,
    # prompt-cache days and size, chat without sign-in), as the environment gives them; the web process
    # reads the effective values (environment > saved in the panel > default) through `webui.config`
    **{name.upper(): t.from_env() for name, t in SERVICE.items()},
    # sign-in throttling (`webui.throttle`): this many wrong passwords for one user name, or from one
    # address, lock it for LOCKOUT, the right password refused too. 5 forgives a person's slips (caps lock,
    # last year's password) and leaves a guesser 480 tries a day against a 12-character password on no
    # common list. 15 minutes: a guesser gains nothing from waiting it out, while a neighbour who locks the
    # administrator out on purpose only delays them (an administrator clears a lock on the Users page)
    "LOGIN_FAILURES": env_int("RKMOJO_LOGIN_FAILURES", 5, minimum=1),
    "LOCKOUT": env_duration("RKMOJO_LOCKOUT", 15 * 60.0, minimum=1),
    # wrong API keys from one address before it is locked the same way: keys are 32 random bytes nobody
    # guesses, so this only stops a scanner, and a home app left with a revoked key (which retries on its
    # own) has room before it locks out the other apps on its machine
    "API_KEY_FAILURES": env_int("RKMOJO_API_KEY_FAILURES", 20, minimum=1),
    # seconds the API tells a refused client to wait
    "RETRY_AFTER": env_int("RKMOJO_RETRY_AFTER", 5, minimum=1),
    # /api/pull and install take local files only from inside this directory (a file path anywhere else
    # is refused: the web side must not read what the service user can read)
    "IMPORT_DIR": env_path("RKMOJO_IMPORT_DIR", DATA_DIR / "import"),
    # texts one embedding request may carry (each is one forward pass on the only worker)
    "MAX_EMBED_INPUTS": env_int("RKMOJO_MAX_EMBED_INPUTS", 256, minimum=1),
    # the worker: its name (one per board), the model it loads at start, the engine's options
    "WORKER_NAME": env_str("RKMOJO_WORKER_NAME", socket.gethostname()),
    "PRELOAD": env_str("RKMOJO_PRELOAD", ""),
    # the engine's options as RKMOJO_MEMORY_BUDGET, RKMOJO_EXPERT_SLOTS, RKMOJO_THREADS, RKMOJO_CONTEXT, … (see
    # `inference.engine.EngineConfig`)
    "ENGINE": env_options(EngineConfig),
    # sampling defaults for requests that leave a field unset (RKMOJO_TEMPERATURE, RKMOJO_TOP_K, …; see
    # `inference.sampler.SamplingParams`); unset here too: the model's generation config
    "SAMPLING": env_options(SamplingParams),
    # a request still queued with no live worker for its model after this long gets an error
    "NO_WORKER_TIMEOUT": env_duration("RKMOJO_NO_WORKER_TIMEOUT", 60),
    # how often a worker refreshes its registration, and when a silent one counts as gone
    "HEARTBEAT": env_duration("RKMOJO_HEARTBEAT", 1.0),
    "HEARTBEAT_TTL": env_duration("RKMOJO_HEARTBEAT_TTL", 4.0),
    # the one-time token /setup/ takes to create the first administrator: a flashed board's firstboot
    # writes it, on a PC `rkmojo up` does (webui/management/commands/setuptoken.py)
    "SETUP_TOKEN_FILE": env_str("RKMOJO_SETUP_TOKEN_FILE", str(DATA_DIR / "setup-token")),
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {
        "handlers": ["console"],
        "level": env_choice("RKMOJO_LOG_LEVEL", "info", ("debug", "info", "warning", "error")).upper(),
    },
}
