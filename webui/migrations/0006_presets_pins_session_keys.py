"""Chat presets (a user's named system prompt and sampling sets), pinned conversations, and the API key an
API session was made with (the panel's Sessions page names it as the owner). Sessions made before this have
no key on record: the page says "API" for them."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("webui", "0005_apikey_scope"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="chatsession",
            name="api_key",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="sessions",
                to="webui.apikey",
            ),
        ),
        migrations.AddField(
            model_name="chatsession",
            name="pinned",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name="Preset",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("visitor", models.CharField(blank=True, db_index=True, max_length=64)),
                ("name", models.CharField(max_length=100)),
                ("system", models.TextField(blank=True, help_text="the system prompt a conversation starts with")),
                (
                    "params",
                    models.JSONField(blank=True, default=dict, help_text="sampling options, as ChatSession.params"),
                ),
                ("created", models.DateTimeField(auto_now_add=True)),
                ("updated", models.DateTimeField(auto_now=True)),
                (
                    "owner",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="presets",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "ordering": ["name"],
                "constraints": [
                    models.UniqueConstraint(fields=("owner", "visitor", "name"), name="one_preset_per_name")
                ],
            },
        ),
    ]
