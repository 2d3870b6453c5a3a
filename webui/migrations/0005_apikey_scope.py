"""API keys get a scope. Keys made before it are chat keys: an upgrade closes "any key may pull and delete"
for the keys already handed to apps on the LAN; an administrator gives a key the admin scope in the panel."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("webui", "0004_chat_reasoning_tools"),
    ]

    operations = [
        migrations.AddField(
            model_name="apikey",
            name="scope",
            field=models.CharField(choices=[("chat", "Chat"), ("admin", "Admin")], default="chat", max_length=10),
        ),
    ]
