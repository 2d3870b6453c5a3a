from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from . import pages, setup_page, throttle
from .api import ollama, openai, openapi, responses

urlpatterns = [
    path("", pages.root),
    path("login/", pages.login, name="login"),
    path("admin/login/", throttle.sign_in(admin.site.login)),  # its form: webui.admin; a locked try is a 429
    path("logout/", pages.logout, name="logout"),
    path("chat/", include("webui.chat.urls")),
    path("panel/", include("webui.panel.urls")),
    path("setup/", setup_page.setup),
    # browsers ask for /favicon.ico on pages that name no icon (Django's admin): the page's own SVG
    path("favicon.ico", RedirectView.as_view(url=static("webui/favicon.svg"), permanent=True)),
    path("openapi.json", openapi.openapi_json),
    path("v1/chat/completions", openai.chat_completions),
    path("v1/completions", openai.completions),
    path("v1/responses", responses.responses),
    path("v1/embeddings", openai.embeddings),
    path("v1/models", openai.models),
    path("v1/models/<path:name>", openai.model_detail),
    path("api/chat", ollama.chat),
    path("api/generate", ollama.generate),
    path("api/embed", ollama.embed),
    path("api/embeddings", ollama.embeddings),
    path("api/tags", ollama.tags),
    path("api/ps", ollama.ps),
    path("api/show", ollama.show),
    path("api/version", ollama.version),
    path("api/delete", ollama.delete),
    path("api/pull", ollama.pull),
]
