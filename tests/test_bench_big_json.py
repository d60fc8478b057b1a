"""bench/big_json.py at a small size: every event and step it times is written, and its figures
are there."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_big_json_bench_times_events_by_input_and_steps_as_the_checkpoint_grows():
    from bench import big_json
    from jobs.models import Job, JobEvent

    result = big_json.measure(events=3, input_kb=20, steps=10, step_kb=2, answers=2, document_kb=30)
    assert set(result["events_per_input"]) == {"empty input", "20 kB input"}
    assert all(figures["cpu_ms_per_event"] > 0 and figures["wall_ms_per_event"] > 0
               for figures in result["events_per_input"].values())
    assert result["input_bytes"] > 15_000
    assert [row["steps"] for row in result["steps"]] == ["1-1", "6-6", "10-10"]
    assert result["steps"][-1]["checkpoint_kb"] > result["steps"][0]["checkpoint_kb"]
    # Four jobs' log lines (two each way) and one job's ten steps, all written.
    assert JobEvent.objects.filter(type="log").count() == 4 * 3
    [stepped] = [job for job in Job.objects.all() if job.checkpoint]
    assert len(stepped.checkpoint) == 10
    assert JobEvent.objects.filter(job=stepped, type="step", status="completed").count() == 10
    # Two review jobs answered a round, each way, two rounds: each resumed by its answer.
    assert set(result["answers_per_document"]) == {"a one-line document", "a 30 kB document"}
    assert all(figures["cpu_ms_per_answer"] > 0 for figures in result["answers_per_document"].values())
    reviews = Job.objects.filter(kind="demo.review")
    assert reviews.count() == 8 and all(job.status == "pending" for job in reviews)
    assert sum(len(job.input["document"]) >= 30 * 1024 for job in reviews) == 4
