"""What the periodic passes' scheduler leaves in the database (see `ops.scheduler`).

Every time here is written with the database's clock (`Now()`) and compared with it, never with
a host's: schedulers and workers run on several machines whose clocks disagree.
"""

from django.db import models


class SchedulerLease(models.Model):
    """The right to send the periodic passes, held by one scheduler (`celery beat`) at a time.

    The leader renews it every SCHEDULER_HEARTBEAT_INTERVAL seconds for SCHEDULER_LEASE_SECONDS;
    a standby takes it over once it has expired. `renewed_at` is the scheduler's heartbeat.
    `epoch` counts the changes of hands (1 after the first scheduler took it).
    """

    name = models.CharField(primary_key=True, max_length=64)
    holder = models.CharField(max_length=255, blank=True)
    epoch = models.PositiveBigIntegerField(default=0)
    acquired_at = models.DateTimeField(null=True, blank=True)
    renewed_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name}: {self.holder or 'nobody'} (epoch {self.epoch})"


class PeriodicPass(models.Model):
    """The last run of one periodic pass (a task beat sends), written by the worker that ran it
    (`jobs.periodic`): when it last finished and last finished without an error, how long it
    took, and how many runs ran, failed, or were skipped because another run held its lock."""

    name = models.CharField(primary_key=True, max_length=200)
    runs = models.PositiveBigIntegerField(default=0)
    failures = models.PositiveBigIntegerField(default=0)
    skipped = models.PositiveBigIntegerField(default=0)
    last_started_at = models.DateTimeField(null=True, blank=True)
    last_finished_at = models.DateTimeField(null=True, blank=True)
    last_succeeded_at = models.DateTimeField(null=True, blank=True)
    last_duration = models.FloatField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    last_worker = models.CharField(max_length=255, blank=True)

    def __str__(self) -> str:
        return self.name
