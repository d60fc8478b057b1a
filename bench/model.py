"""The stateful model's long profile: the Hypothesis model of `tests/model/` (random interleavings
of submit, claim, steps, questions and answers, waits and wakes, cancel, retry, deadlines, lease
expiry, hand-back and duplicate messages, every invariant checked after each move) run for many
more steps than `make test` runs.

    DATABASE_URL=postgres://... python bench/model.py [--steps 10000] [--steps-per-example 50]

It runs the same pytest test with MODEL_EXAMPLES / MODEL_STEPS set (pytest-django makes its own
test database from DATABASE_URL, which must be PostgreSQL), and reports how many examples and
steps ran, how many service calls were made and how many of them were refused with the
platform's own errors (4xx-class: the expected answer to, say, cancelling a finished job).
Exit status 1 when an invariant broke (the failing interleaving is printed). Writes
bench/results/model-<UTC timestamp>.json and rewrites bench/results/model-latest.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:
    sys.path.insert(0, str(BASE_DIR))

from bench.throughput import RESULTS_DIR, code_revision  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000, help="steps in all (default 10,000)")
    parser.add_argument("--steps-per-example", type=int, default=50, help="the longest interleaving (default 50)")
    parser.add_argument("--no-write", action="store_true", help="print only; write nothing under bench/results/")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        raise SystemExit("the model runs against PostgreSQL: set DATABASE_URL=postgres://...")

    # Hypothesis ends some interleavings early: run again (new random draws) until the steps are in.
    counts: dict[str, int] = {}
    runs, examples_asked = 0, 0
    started = time.monotonic()
    result = None
    while counts.get("steps", 0) < args.steps:
        remaining = args.steps - counts.get("steps", 0)
        examples = max(1, -(-remaining * 11 // (args.steps_per_example * 10)))
        with tempfile.TemporaryDirectory() as folder:
            report = Path(folder) / "report.json"
            env = {
                **os.environ, "DJANGO_SETTINGS_MODULE": "taskplatform.settings.test", "MODEL_EXAMPLES": str(examples),
                "MODEL_STEPS": str(args.steps_per_example), "MODEL_REPORT": str(report), "MODEL_SHRINK": "1",
            }
            result = subprocess.run(
                [sys.executable, "-m", "pytest", "tests/model", "-q", "-p", "no:cacheprovider", "--timeout", "0"],
                cwd=BASE_DIR, env=env, capture_output=True, text=True,
            )
            done = json.loads(report.read_text()) if report.exists() else {}
        runs += 1
        examples_asked += examples
        for key, value in done.items():
            counts[key] = counts.get(key, 0) + value
        if result.returncode != 0 or not done.get("steps"):
            break
    seconds = time.monotonic() - started
    passed = result.returncode == 0
    figures = {
        "when": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "passed": passed, "seconds": round(seconds, 1),
        "asked": {"steps": args.steps, "steps_per_example": args.steps_per_example}, "pytest_runs": runs, **counts,
        "revision": code_revision(),
    }
    print(json.dumps(figures, indent=2))
    if not passed:
        print(result.stdout[-20000:])
    if not args.no_write:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        (RESULTS_DIR / f"model-{stamp}.json").write_text(json.dumps(figures, indent=2) + "\n")
        (RESULTS_DIR / "model-latest.md").write_text(
            "# The stateful model, long profile (`bench/model.py`)\n\n"
            f"- when: {figures['when']}, revision {figures['revision']}\n"
            f"- outcome: {'every invariant held' if passed else 'AN INVARIANT BROKE (see the JSON)'}\n"
            f"- examples run: {counts.get('examples', '?')}, steps: {counts.get('steps', '?')} "
            f"(asked: {args.steps} steps, interleavings of up to {args.steps_per_example} steps, in {runs} run(s))\n"
            f"- service calls: {counts.get('service_calls', '?')}, of which refused with the platform's own "
            f"(4xx-class) errors: {counts.get('platform_errors', '?')}; server errors: "
            f"{'none' if passed else 'see the failure'}\n"
            f"- time: {seconds:.0f} s against PostgreSQL\n"
        )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
