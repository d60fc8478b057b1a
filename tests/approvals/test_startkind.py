"""`manage.py startkind app.name`: a typed kind with a question, and a test that uses the
harness; both lint clean, the kind registers through the app's `kinds` module, and the test
passes as generated."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from jobs import registry
from tests.support.processes import VENV_BIN

pytestmark = pytest.mark.django_db


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A throwaway app package on sys.path; its kinds are unregistered afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(registry._kinds)
    modules = set(sys.modules)
    yield tmp_path
    for name in set(registry._kinds) - before:
        del registry._kinds[name]
    for name in set(sys.modules) - modules:
        if name.startswith(("scratchapp", "oldapp", "tests_scaffold")):
            del sys.modules[name]


def run_generated_tests(path: Path) -> int:
    spec = importlib.util.spec_from_file_location(f"tests_scaffold_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tests = [getattr(module, name) for name in dir(module) if name.startswith("test_")]
    for test in tests:
        test()
    return len(tests)


def ruff(*paths: Path) -> subprocess.CompletedProcess:
    # The scratch apps live outside the project: tell ruff they are first-party, as a real app is.
    config = "lint.isort.known-first-party = ['scratchapp', 'oldapp']"
    return subprocess.run([str(VENV_BIN / "ruff"), "check", "--no-cache", "--config", config, *map(str, paths)],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])


def test_startkind_scaffolds_a_typed_kind_and_a_passing_test_with_the_harness(scratch):
    app = scratch / "scratchapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    call_command("startkind", "scratchapp.invoice", "--directory", str(app), "--tests", str(scratch / "tests"))

    module, test = app / "kinds" / "invoice.py", scratch / "tests" / "scratchapp" / "test_invoice_kind.py"
    source = module.read_text()
    assert "class InvoiceInput(BaseModel)" in source and 'ctx.ask("approve"' in source
    assert "The replay rule first" in source
    assert "from . import invoice" in (app / "kinds" / "__init__.py").read_text()
    assert "run_kind(" in test.read_text()
    linted = ruff(module, app / "kinds" / "__init__.py", test)
    assert linted.returncode == 0, linted.stdout

    importlib.import_module("scratchapp.kinds")  # as JobsConfig.ready's autodiscovery would
    kind = registry.kind_get("scratchapp.invoice")
    assert kind.input_model.__name__ == "InvoiceInput" and kind.result_model.__name__ == "InvoiceResult"
    assert run_generated_tests(test) == 2

    again = ["startkind", "scratchapp.refund", "--directory", str(app), "--tests", str(scratch / "tests")]
    call_command(*again)
    with pytest.raises(CommandError, match="exists; pass --force"):
        call_command(*again)
    call_command(*again, "--force")
    assert (app / "kinds" / "__init__.py").read_text().count("from . import refund") == 1


def test_startkind_beside_an_existing_kinds_module(scratch):
    app = scratch / "oldapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "kinds.py").write_text('"""Old kinds."""\n\nVALUE = 1\n')
    call_command("startkind", "oldapp.refund", "--directory", str(app), "--tests", str(scratch / "tests"))
    assert (app / "kinds_refund.py").exists()
    assert "from oldapp import kinds_refund  # noqa: E402, F401" in (app / "kinds.py").read_text()
    assert ruff(app / "kinds.py", app / "kinds_refund.py").returncode == 0
    importlib.import_module("oldapp.kinds")
    assert registry.kind_get("oldapp.refund").name == "oldapp.refund"


def test_startkind_refuses_what_it_cannot_do(scratch):
    with pytest.raises(CommandError, match="APP.NAME"):
        call_command("startkind", "nodot")
    with pytest.raises(CommandError, match="already registered"):
        call_command("startkind", "demo.review")
    with pytest.raises(CommandError, match="no installed app 'nowhere'"):
        call_command("startkind", "nowhere.thing")
