from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("testapp", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="Run",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("label", models.CharField(max_length=200)),
                ("lane", models.CharField(blank=True, default="", max_length=200)),
                ("started", models.FloatField()),
                ("finished", models.FloatField()),
            ],
        ),
    ]
