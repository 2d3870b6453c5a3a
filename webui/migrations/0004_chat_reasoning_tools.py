from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("webui", "0003_settings"),
    ]

    operations = [
        migrations.AddField(
            model_name="chatmessage",
            name="reasoning",
            field=models.TextField(blank=True, default=""),
        ),
        migrations.AddField(
            model_name="chatmessage",
            name="tool_calls",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AddField(
            model_name="chatmessage",
            name="tool_call_id",
            field=models.CharField(blank=True, default="", max_length=200),
        ),
        migrations.AddField(
            model_name="chatmessage",
            name="name",
            field=models.CharField(blank=True, default="", max_length=200),
        ),
    ]
