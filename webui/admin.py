from django.contrib import admin, messages

from . import throttle
from .models import ApiKey, ChatMessage, ChatSession

admin.site.login_form = throttle.AdminSignInForm  # tries counted per address and user name, as on /login/


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "prefix", "scope", "created", "last_used", "revoked")
    fields = ("name", "prefix", "scope", "created", "last_used", "revoked")
    readonly_fields = ("prefix", "created", "last_used")

    def save_model(self, request, obj, form, change):
        key = None if change else obj.new_secret()
        super().save_model(request, obj, form, change)
        if key:
            messages.warning(request, f"The new API key, shown this once: {key}")


class MessageInline(admin.TabularInline):
    model = ChatMessage
    extra = 0


@admin.register(ChatSession)
class ChatSessionAdmin(admin.ModelAdmin):
    list_display = ("title", "model", "source", "updated")
    inlines = [MessageInline]
