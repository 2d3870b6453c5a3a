from django.contrib import admin
from django.http import HttpResponse
from django.urls import include, path


def root(request):
    # Ollama clients probe `GET /` for this exact text
    return HttpResponse("Ollama is running (rkmojo)", content_type="text/plain")


urlpatterns = [
    path("", root),
    path("admin/", admin.site.urls),
    path("", include("webui.urls")),
]
