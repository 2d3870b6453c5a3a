from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("", include("webui.urls")),  # first: it holds admin/login/, throttled, ahead of the admin's own
    path("admin/", admin.site.urls),
]
