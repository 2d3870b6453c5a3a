from django.apps import AppConfig


class WebuiConfig(AppConfig):
    name = "webui"
    verbose_name = "rkmojo"
    default_auto_field = "django.db.models.BigAutoField"
