"""`manage.py startkind app.name`: scaffold a job kind with a typed input, a step, a question and a
typed result, and a test of it that runs it with `jobs.testing` (no worker needed).

Where the kind goes, so that the app's `kinds` module (imported at start-up) registers it:
- `app/kinds/` is a package (or the app has no kinds yet: it becomes one): `app/kinds/name.py`,
  imported by `app/kinds/__init__.py`;
- `app/kinds.py` is a module: `app/kinds_name.py`, imported at the end of `app/kinds.py`.
The test goes to `tests/app/test_name_kind.py`.
"""

from __future__ import annotations

from pathlib import Path
from string import Template

from django.apps import apps
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from jobs.registry import kinds_all

KIND_TEMPLATE = Template('''"""The `$kind` job kind, scaffolded by `manage.py startkind`. Its test:
$test_path

The replay rule first: this handler runs again from the top after every answer, retry and crash.
A finished `ctx.step` is not run again (its stored result is returned); code outside steps is,
so keep it cheap and deterministic, and put every side effect (a payment, an e-mail, a call to
another system) inside a step.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

$kind_imports


class ${model}Input(BaseModel):
    """The job's input: the API validates it against the JSON Schema derived from this model."""

    model_config = ConfigDict(extra="forbid")

    title: str = Field(min_length=1, description="What the reviewer decides about.")
    amount: float = Field(gt=0)


class ${model}Result(BaseModel):
    approved: bool
    reference: str | None = None
    reason: str | None = None


@job_kind("$kind")
def $function(ctx: JobContext, input: ${model}Input) -> ${model}Result:
    """TODO: say in one line what a $kind job does (shown in the admin and the API)."""
    summary = ctx.step("summarise", lambda: f"{input.title}: {input.amount:.2f}")
    decision = ctx.ask("approve", "Approve this?", answer=ApprovalWithReason, details={"summary": summary})
    if not decision.approved:
        return ${model}Result(approved=False, reason=decision.reason)
    reference = ctx.step("record", lambda: f"REF-{ctx.job_id}")  # the side effect, in a step
    return ${model}Result(approved=True, reference=reference)
''')

# The generated kind's own imports. It asks a question, so it uses approvals, and this command
# lives here rather than in the jobs core: the core knows nothing of questions.
KIND_IMPORTS = [
    "from approvals.schemas import ApprovalWithReason",
    "from jobs.registry import job_kind",
    "from jobs.runtime import JobContext",
]

TEST_TEMPLATE = Template('''"""Tests of the `$kind` job kind, run in-process by `jobs.testing` (no worker needed)."""

from __future__ import annotations

import pytest

$imports

pytestmark = pytest.mark.django_db


def test_approved():
    run = run_kind("$kind", ${model}Input(title="Laptop", amount=1200),
                   answers={"approve": {"approved": True}})
    assert run.status == "completed", run.error
    assert run.value == ${model}Result(approved=True, reference=f"REF-{run.job.pk}")
    assert run.step_runs == {"summarise": 1, "record": 1}  # each once, though the handler ran twice


def test_rejected_with_a_reason():
    run = run_kind("$kind", {"title": "Laptop", "amount": 1200},
                   answers={"approve": Answer({"approved": False, "reason": "too dear"}, by="rita")})
    assert run.value == ${model}Result(approved=False, reason="too dear")
    assert run.step_runs == {"summarise": 1}
''')


class Command(BaseCommand):
    help = "Scaffold a job kind APP.NAME: a typed input, a question, a typed result, and a test with jobs.testing."

    def add_arguments(self, parser):
        parser.add_argument("kind", help="APP.NAME: the app (its label) and the kind's name, e.g. billing.invoice")
        parser.add_argument("--directory", help="the app's package directory (default: the installed app's)")
        parser.add_argument("--tests", help="the tests directory (default: tests/ of the project)")
        parser.add_argument("--force", action="store_true", help="overwrite files that exist")

    def handle(self, kind, directory, tests, force, **options):
        app, _, name = kind.partition(".")
        if not (app.isidentifier() and name.isidentifier()):
            raise CommandError(f"{kind!r}: give APP.NAME, both Python identifiers (billing.invoice)")
        if kind in {known.name for known in kinds_all()}:
            raise CommandError(f"a job kind {kind!r} is already registered")
        if directory:
            app_dir, package = Path(directory), app
            if not app_dir.is_dir():
                raise CommandError(f"{app_dir} is not a directory")
        else:
            try:
                config = apps.get_app_config(app)
            except LookupError:
                raise CommandError(f"no installed app {app!r}: add it to INSTALLED_APPS, or pass --directory") from None
            app_dir, package = Path(config.path), config.name
        tests_dir = Path(tests) if tests else Path(settings.BASE_DIR) / "tests"

        if (app_dir / "kinds.py").exists():
            module_path, module = app_dir / f"kinds_{name}.py", f"{package}.kinds_{name}"
            register_in, register_line = app_dir / "kinds.py", f"from {package} import kinds_{name}  # noqa: E402, F401"
        else:
            module_path, module = app_dir / "kinds" / f"{name}.py", f"{package}.kinds.{name}"
            register_in, register_line = app_dir / "kinds" / "__init__.py", f"from . import {name}  # noqa: F401"
        test_path = tests_dir / app / f"test_{name}_kind.py"
        for path in (module_path, test_path):
            if path.exists() and not force:
                raise CommandError(f"{path} exists; pass --force to overwrite it")

        model = "".join(part.capitalize() for part in name.split("_"))
        imports = sorted([f"from {module} import {model}Input, {model}Result",
                          "from jobs.testing import Answer, run_kind"])
        words = {"kind": kind, "model": model, "function": name, "imports": "\n".join(imports),
                 "kind_imports": "\n".join(KIND_IMPORTS), "test_path": _shown(test_path)}
        module_path.parent.mkdir(parents=True, exist_ok=True)
        module_path.write_text(KIND_TEMPLATE.substitute(words))
        _register(register_in, register_line, kind)
        test_path.parent.mkdir(parents=True, exist_ok=True)
        for folder in (tests_dir, test_path.parent):
            if not (folder / "__init__.py").exists():
                (folder / "__init__.py").write_text("")
        test_path.write_text(TEST_TEMPLATE.substitute(words))
        self.stdout.write(f"wrote {_shown(module_path)} (the kind {kind}) and {_shown(test_path)} (its test)")
        self.stdout.write(f"run its test: python -m pytest {_shown(test_path)}")


def _register(path: Path, line: str, kind: str) -> None:
    """Make `path` (the app's kinds module) import the new module, once."""
    text = path.read_text() if path.exists() else '"""Job kinds of this app: each module registers its own."""\n'
    if line not in text:
        text = text.rstrip("\n") + f"\n\n# registers {kind}\n{line}\n"
    path.write_text(text)


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path(settings.BASE_DIR).resolve()))
    except ValueError:
        return str(path)
