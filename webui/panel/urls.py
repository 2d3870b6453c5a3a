"""The admin panel's URLs, under /panel/ (staff only: `access.staff_only` on every view)."""

from django.urls import path

from . import live, models_page, people, sessions_page, settings_page

urlpatterns = [
    path("", live.live, name="panel"),
    path("models/", models_page.models),
    path("models/pull/", models_page.pull),
    path("models/<str:name>/", models_page.detail),
    path("models/<str:name>/delete/", models_page.delete),
    path("models/<str:name>/load/", models_page.load),
    path("models/<str:name>/default/", models_page.default),
    path("models/<str:name>/verify/<str:worker>/", models_page.verify),
    path("settings/", settings_page.settings_page),
    path("keys/", people.keys),
    path("keys/<int:pk>/revoke/", people.revoke_key),
    path("keys/<int:pk>/scope/", people.set_key_scope),
    path("users/", people.users),
    path("users/<int:pk>/active/", people.set_active),
    path("users/<int:pk>/password/", people.password),
    path("users/locks/clear/", people.clear_lock),
    path("sessions/", sessions_page.sessions),
    path("sessions/prompt-cache/clear/", sessions_page.clear_prompt_cache),
    path("sessions/<uuid:pk>/", sessions_page.session),
]
