from django.apps import AppConfig


class WebuiConfig(AppConfig):
    name = "webui"
    verbose_name = "rkmojo"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import socket_auth

        socket_auth.connect_signals()  # a socket ends with its session, whichever process ends that
