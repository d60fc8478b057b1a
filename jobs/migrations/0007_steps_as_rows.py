"""A job's finished steps become rows of their own (`JobStep`), out of the job's `checkpoint`
JSON column: each finished step is copied into its row, then the column goes."""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models

BATCH = 500


def steps_from_checkpoints(apps, schema_editor):
    Job = apps.get_model("jobs", "Job")
    JobStep = apps.get_model("jobs", "JobStep")
    using = schema_editor.connection.alias
    jobs = (Job.objects.using(using).exclude(checkpoint={}).exclude(checkpoint__isnull=True)
            .values_list("pk", "attempts", "checkpoint"))
    rows = []
    for job_id, attempts, checkpoint in jobs.iterator(chunk_size=BATCH):
        # A result of None as JSON's null (the ORM would write SQL's NULL, which the column refuses).
        rows += [JobStep(job_id=job_id, name=name, attempt=attempts,
                         result=models.Value(None, output_field=models.JSONField()) if result is None else result)
                 for name, result in checkpoint.items()]
        if len(rows) >= BATCH:
            JobStep.objects.using(using).bulk_create(rows)
            rows = []
    JobStep.objects.using(using).bulk_create(rows)


def checkpoints_from_steps(apps, schema_editor):
    Job = apps.get_model("jobs", "Job")
    JobStep = apps.get_model("jobs", "JobStep")
    using = schema_editor.connection.alias
    checkpoints: dict = {}
    for job_id, name, result in JobStep.objects.using(using).order_by("id").values_list("job_id", "name", "result"):
        checkpoints.setdefault(job_id, {})[name] = result
    for job_id, checkpoint in checkpoints.items():
        Job.objects.using(using).filter(pk=job_id).update(checkpoint=checkpoint)


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0006_followed"),
    ]

    operations = [
        migrations.CreateModel(
            name="JobStep",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(max_length=200)),
                ("result", models.JSONField(blank=True)),
                ("attempt", models.PositiveIntegerField(default=0)),
                ("finished_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ("job", models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE,
                                          related_name="steps", to="jobs.job")),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("job", "name"), name="jobstep_one_per_name")],
            },
        ),
        migrations.RunPython(steps_from_checkpoints, checkpoints_from_steps, elidable=True),
        migrations.RemoveField(
            model_name="job",
            name="checkpoint",
        ),
    ]
