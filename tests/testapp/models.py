from django.db import models


class Effect(models.Model):
    """A row written by a test handler: proof that (and how often) a job ran."""

    label = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.label
