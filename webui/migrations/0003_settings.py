from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("webui", "0002_chat"),
    ]

    operations = [
        migrations.CreateModel(
            name="Setting",
            fields=[
                ("name", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("value", models.JSONField()),
                ("updated", models.DateTimeField(auto_now=True)),
            ],
        ),
    ]
