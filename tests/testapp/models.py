from django.db import models


class Effect(models.Model):
    """A row written by a test handler: proof that (and how often) a job ran."""

    label = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.label


class Run(models.Model):
    """One handler run of the flow-control tests, timed by the handler's own clock (epoch
    seconds): when it started and finished, and its lane."""

    label = models.CharField(max_length=200)
    lane = models.CharField(max_length=200, blank=True, default="")
    started = models.FloatField()
    finished = models.FloatField()

    def __str__(self) -> str:
        return self.label
