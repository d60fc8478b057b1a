"""The README's example kind ("Writing a job kind": it asks a person, parks on an outside service
and reports progress) fits in 25 lines, and runs as written: registered and played with
`jobs.testing`, and its test example passes too."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from jobs import registry
from jobs.testing import run_kind

pytestmark = pytest.mark.django_db

README = Path(__file__).resolve().parents[2] / "README.md"


def blocks() -> list[str]:
    section = README.read_text().split("## Writing a job kind", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


@pytest.fixture
def shop_kind(monkeypatch):
    """The example's kind, registered from the README's text; its carrier calls are stand-ins
    (the harness's service double answers instead of them)."""
    carrier = types.ModuleType("shop.carrier")
    carrier.book_pickup = lambda order, token, url: "P-1"
    carrier.pickup_status = lambda external_id: None
    monkeypatch.setitem(sys.modules, "shop", types.ModuleType("shop"))
    monkeypatch.setitem(sys.modules, "shop.carrier", carrier)
    namespace: dict = {"__name__": "readme_example"}
    exec(compile(blocks()[0], str(README), "exec"), namespace)  # noqa: S102 (our own README)
    yield namespace
    registry._kinds.pop("shop.ship", None)


def test_the_example_fits_in_25_lines():
    example = blocks()[0].strip().splitlines()
    assert "ctx.ask(" in blocks()[0] and "ctx.wait_for(" in blocks()[0] and "ctx.progress(" in blocks()[0]
    assert len(example) <= 25, len(example)


def test_the_example_runs_as_written(shop_kind):
    run = run_kind("shop.ship", shop_kind["Order"](customer="Ann", amount=12),
                   answers={"approve": {"approved": True}}, wait_results={"pickup": {"tracking": "T-1"}})
    assert run.status == "completed" and run.value == shop_kind["Shipment"](tracking="T-1")
    progress = [e["message"]["text"] for e in run.events if e["type"] == "progress"]
    # Run 2 (answered) reports 0.5 and parks; run 3 (called back) reports it again, then 1.0.
    assert progress == ["approved; booking the carrier", "approved; booking the carrier", "shipped: T-1"]
    rejected = run_kind("shop.ship", {"customer": "Bob", "amount": 5},
                        answers={"approve": {"approved": False, "reason": "no stock"}})
    assert rejected.error == {"code": "rejected", "message": "no stock"}


def test_the_readme_test_example_passes(shop_kind):
    namespace: dict = {"__name__": "readme_test_example"}
    exec(compile(blocks()[2], str(README), "exec"), namespace)  # noqa: S102 (our own README)
    namespace["test_a_shipment"]()
