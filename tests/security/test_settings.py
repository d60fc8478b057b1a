"""Item 1 and 2 of the security posture: production is the default, it fails closed without a
secret key, and Django's own deploy check passes under the production settings."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

BASE_DIR = Path(__file__).resolve().parent.parent.parent
STRONG_KEY = secrets.token_urlsafe(50)


def bare_env(**extra: str) -> dict[str, str]:
    """This process's environment without any Django setting a developer may have exported."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("DJANGO_", "SECURE_")) and name not in {"DATABASE_POOL", "LOG_FORMAT"}}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=BASE_DIR, env=bare_env(**env), capture_output=True,
                          text=True, timeout=120)


def test_the_shared_base_settings_default_to_no_debug_and_no_key():
    result = run_python("from taskplatform.settings import base; print(base.DEBUG, repr(base.SECRET_KEY))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False ''"


@pytest.mark.parametrize("entry_point", ["manage.py", "taskplatform/asgi.py", "taskplatform/celery.py"])
def test_every_entry_point_defaults_to_the_production_settings(entry_point):
    text = (BASE_DIR / entry_point).read_text()
    pattern = r"""os\.environ\.setdefault\(\s*["']DJANGO_SETTINGS_MODULE["']\s*,\s*["']([\w.]+)["']"""
    defaults = re.findall(pattern, text)
    assert defaults == ["taskplatform.settings.production"], entry_point


@pytest.mark.parametrize("code", [
    "import taskplatform.asgi",                            # uvicorn / daphne
    "from taskplatform.celery import app; app.loader.import_default_modules()",  # celery -A taskplatform
])
def test_a_production_start_without_a_secret_key_refuses_with_one_line(code):
    result = run_python(code)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "DJANGO_SECRET_KEY" in lines[0] and "refus" in lines[0]


def test_manage_py_without_a_secret_key_refuses_with_one_line():
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=BASE_DIR, env=bare_env(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "DJANGO_SECRET_KEY" in lines[0], result.stderr


def test_production_refuses_the_development_key():
    from taskplatform.settings.development import DEVELOPMENT_SECRET_KEY

    result = run_python("import taskplatform.asgi", DJANGO_SECRET_KEY=DEVELOPMENT_SECRET_KEY)
    assert result.returncode != 0 and "development" in result.stderr


def test_production_settings_fail_closed_even_with_debug_asked_for():
    code = ("from django.conf import settings; "
            "print(settings.WHITENOISE_AUTOREFRESH, settings.SECURE_SSL_REDIRECT, settings.SECURE_HSTS_SECONDS > 0, "
            "settings.SESSION_COOKIE_SECURE, settings.CSRF_COOKIE_SECURE, settings.SECURE_PROXY_SSL_HEADER)")
    result = run_python(code, DJANGO_SETTINGS_MODULE="taskplatform.settings.production",
                        DJANGO_SECRET_KEY=STRONG_KEY, DJANGO_DEBUG="true")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True", "True", "True", "True", "None"]


def test_the_https_settings_come_from_the_environment():
    code = ("from django.conf import settings; "
            "print(settings.SECURE_SSL_REDIRECT, settings.SECURE_HSTS_SECONDS, settings.SECURE_PROXY_SSL_HEADER, "
            "settings.CSRF_TRUSTED_ORIGINS)")
    result = run_python(code, DJANGO_SETTINGS_MODULE="taskplatform.settings.production", DJANGO_SECRET_KEY=STRONG_KEY,
                        DJANGO_SECURE_SSL_REDIRECT="false", DJANGO_SECURE_HSTS_SECONDS="60",
                        DJANGO_SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto",
                        DJANGO_CSRF_TRUSTED_ORIGINS="https://jobs.example.com")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False 60 ('HTTP_X_FORWARDED_PROTO', 'https') ['https://jobs.example.com']"


def test_the_deploy_check_passes_under_the_production_settings():
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], cwd=BASE_DIR,
        env=bare_env(DJANGO_SETTINGS_MODULE="taskplatform.settings.production", DJANGO_SECRET_KEY=STRONG_KEY),
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_deploy_check_fails_with_debug_on():
    """The check is not silenced wholesale: a real problem still fails it."""
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], cwd=BASE_DIR,
        env=bare_env(DJANGO_SETTINGS_MODULE="taskplatform.settings.production", DJANGO_SECRET_KEY=STRONG_KEY,
                     DJANGO_DEBUG="true"),
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode != 0 and "security.W018" in result.stdout + result.stderr


def test_ci_runs_the_deploy_check():
    assert re.search(r"^make deploy-check$", (BASE_DIR / ".ci" / "run").read_text(), re.MULTILINE)
    makefile = (BASE_DIR / "Makefile").read_text()
    target = makefile.split("\ndeploy-check:", 1)[1].split("\n\n", 1)[0]
    assert "DJANGO_SETTINGS_MODULE=taskplatform.settings.production" in target
    assert "manage.py check --deploy --fail-level WARNING" in target


def test_make_run_and_make_test_opt_into_development_explicitly():
    makefile = (BASE_DIR / "Makefile").read_text()
    assert "DJANGO_SETTINGS_MODULE ?= taskplatform.settings.base" not in makefile
    assert re.search(r"^run:.*\n(?:\t.*\n)*\tDJANGO_SETTINGS_MODULE=taskplatform\.settings\.development ", makefile,
                     re.MULTILINE), makefile
    assert re.search(r"^test:.*\n(?:\t.*\n)*\tDJANGO_SETTINGS_MODULE=taskplatform\.settings\.test ", makefile,
                     re.MULTILINE)


def test_the_readme_scale_out_commands_name_the_production_settings():
    readme = (BASE_DIR / "README.md").read_text()
    section = readme.split("## Scaling out", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    assert "export DJANGO_SETTINGS_MODULE=taskplatform.settings.production" in block
    assert "DJANGO_SECRET_KEY" in block
