from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("webui", "0007_answer_dropped"),
    ]

    operations = [
        migrations.AddField(
            model_name="chatsession",
            name="summary",
            field=models.TextField(blank=True, default=""),
        ),
        migrations.AddField(
            model_name="chatsession",
            name="summary_upto",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
    ]
