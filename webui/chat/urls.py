"""The chat page's URLs, under /chat/."""

from django.urls import path

from . import views

urlpatterns = [
    path("", views.index, name="chat"),
    path("act/", views.act, name="chat-new"),
    path("export/", views.export, name="chat-export-all"),
    path("import/", views.import_, name="chat-import"),
    path("bulk/", views.bulk, name="chat-bulk"),
    path("presets/", views.presets_page, name="chat-presets"),
    path("presets/<int:pk>/", views.preset_edit, name="chat-preset"),
    path("presets/<int:pk>/delete/", views.preset_delete, name="chat-preset-delete"),
    path("<uuid:pk>/", views.conversation, name="chat-conversation"),
    path("<uuid:pk>/act/", views.act, name="chat-act"),
    path("<uuid:pk>/rename/", views.rename, name="chat-rename"),
    path("<uuid:pk>/delete/", views.delete, name="chat-delete"),
    path("<uuid:pk>/export/", views.export, name="chat-export"),
    path("<uuid:pk>/pin/", views.pin, name="chat-pin"),
    path("<uuid:pk>/preset/", views.preset_apply, name="chat-preset-apply"),
    path("<uuid:pk>/preset/save/", views.preset_save, name="chat-preset-save"),
    path("<uuid:pk>/model/", views.switch_model, name="chat-model"),
    path("<uuid:pk>/length/", views.answer_length, name="chat-length"),
    path("<uuid:pk>/summarize/", views.summarize, name="chat-summarize"),
]
