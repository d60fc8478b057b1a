"""The kept move statements (`jobs.statements`), as tests watch them."""

from __future__ import annotations

from jobs import statements


def count_builds(monkeypatch) -> list:
    """A list that gets an item each time the ORM builds a move statement."""
    built: list = []
    real_build = statements._build
    monkeypatch.setattr(statements, "_build", lambda *a, **k: built.append(1) or real_build(*a, **k))
    return built
