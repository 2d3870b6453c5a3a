"""The chat page's URLs, under /chat/."""

from django.urls import path

from . import views

urlpatterns = [
    path("", views.index, name="chat"),
    path("act/", views.act, name="chat-new"),
    path("export/", views.export, name="chat-export-all"),
    path("import/", views.import_, name="chat-import"),
    path("<uuid:pk>/", views.conversation, name="chat-conversation"),
    path("<uuid:pk>/act/", views.act, name="chat-act"),
    path("<uuid:pk>/rename/", views.rename, name="chat-rename"),
    path("<uuid:pk>/delete/", views.delete, name="chat-delete"),
    path("<uuid:pk>/export/", views.export, name="chat-export"),
]
