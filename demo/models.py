from django.db import models


class StepRun(models.Model):
    """How often a `demo.sleep` step body really ran, kept outside the job's own checkpoint so
    that a step repeated after a crash shows up as 2."""

    job_id = models.UUIDField()
    step = models.CharField(max_length=50)
    runs = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job_id", "step"], name="steprun_unique_step")]

    def __str__(self) -> str:
        return f"job {self.job_id} step {self.step}: {self.runs} run(s)"
