"""The deployment files: docker-compose.yml (parsed, as there is no Docker engine here), the
Dockerfile and .env.example."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

BASE_DIR = Path(__file__).resolve().parent.parent
COMPOSE_FILE = BASE_DIR / "docker-compose.yml"
APP_SERVICES = ["web", "worker", "platform-worker", "beat", "flower"]
# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}
INTERPOLATION = re.compile(r"\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def interpolate(value: str) -> str:
    """Resolve compose's `${...}` as with an empty environment (a required one becomes `set`)."""
    def resolve(match: re.Match) -> str:
        op = match["op"] or ""
        return match["arg"] if op.endswith("-") else "set"

    return INTERPOLATION.sub(resolve, value)


@pytest.fixture(scope="module")
def services() -> dict:
    # safe_load resolves the `<<: *app` merge keys.
    return yaml.safe_load(COMPOSE_FILE.read_text())["services"]


def argv(service: dict) -> list[str]:
    command = service["command"]
    return shlex.split(command) if isinstance(command, str) else [str(arg) for arg in command]


def env_of(service: dict) -> dict[str, str]:
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    return {key: interpolate(str(value)) for key, value in environment.items()}


def test_every_service_is_there(services):
    assert {"postgres", "redis", *APP_SERVICES} <= set(services)
    assert str(services["postgres"]["image"]).startswith("postgres:16")
    assert str(services["redis"]["image"]).startswith("redis:7")
    for name in ("postgres", "redis"):
        assert services[name].get("healthcheck", {}).get("test"), f"{name} has no healthcheck"


def test_app_services_share_one_definition(services):
    first = services[APP_SERVICES[0]]
    assert first.get("build") and first.get("image")
    for name in APP_SERVICES[1:]:
        for key in ("build", "image", "environment", "env_file", "depends_on"):
            assert services[name].get(key) == first.get(key), f"{name}.{key} differs from {APP_SERVICES[0]}.{key}"


def test_app_services_run_the_right_commands(services):
    web = argv(services["web"])
    assert Path(web[0]).name in {"uvicorn", "daphne"}
    assert "taskplatform.asgi:application" in web
    for name in ("worker", "beat", "flower"):
        assert argv(services[name])[:4] == ["celery", "-A", "taskplatform", name], argv(services[name])
    platform = argv(services["platform-worker"])
    assert platform[:4] == ["celery", "-A", "taskplatform", "worker"]
    assert platform[platform.index("-Q") + 1] == "platform" and platform[platform.index("--concurrency") + 1] == "1"
    assert any(str(port).endswith(":8000") for port in services["web"]["ports"])
    assert any(str(port).endswith(":5555") for port in services["flower"]["ports"])


def test_the_workers_yield_the_cpu_to_the_web_as_make_run_gives_them(services):
    """Containers on one host share the CPU by weight (Docker's default 1024): both workers weigh
    what a process at `make run`'s WORKER_NICE weighs against one at nice 0 (the kernel's table:
    110 against 1024), every other container the default."""
    from devtools.priority import DEFAULT_WORKER_NICE

    weight_of_nice = {0: 1024, 5: 335, 10: 110, 15: 36, 19: 15}  # sched_prio_to_weight
    for name in ("worker", "platform-worker"):
        assert services[name]["cpu_shares"] == weight_of_nice[DEFAULT_WORKER_NICE], name
    for name in ("web", "beat", "flower", "postgres", "redis"):
        assert "cpu_shares" not in services[name], name


def test_app_services_use_the_compose_postgres_and_redis(services):
    env = env_of(services["web"])
    database = urlsplit(env["DATABASE_URL"])
    assert database.scheme in {"postgres", "postgresql", "pgsql"}
    assert (database.hostname, database.port or 5432) == ("postgres", 5432)
    redis = urlsplit(env["REDIS_URL"])
    assert redis.scheme == "redis"
    assert (redis.hostname, redis.port or 6379) == ("redis", 6379)
    assert env["DJANGO_SETTINGS_MODULE"] == "taskplatform.settings.production"
    # Flower's login comes from the environment and is required, never defaulted.
    assert "FLOWER_BASIC_AUTH" in (services["flower"].get("environment") or {})
    assert ":?" in str(services["flower"]["environment"]["FLOWER_BASIC_AUTH"])
    depends = services["web"]["depends_on"]
    assert depends["postgres"]["condition"] == "service_healthy"
    assert depends["redis"]["condition"] == "service_healthy"


def test_the_schema_is_migrated_before_the_app_starts(services):
    migrate = services.get("migrate")
    if migrate is None:  # the other way to do it: web migrates first
        assert "migrate" in " ".join(argv(services["web"]))
        return
    assert "migrate" in argv(migrate)
    assert services["web"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_dockerfile_builds_the_production_image():
    dockerfile = (BASE_DIR / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\s*$", dockerfile, re.MULTILINE)
    assert "pip install --require-hashes --no-deps -r requirements.lock" in dockerfile  # tests/security
    assert "DJANGO_SETTINGS_MODULE=taskplatform.settings.production" in dockerfile
    assert "collectstatic --noinput" in dockerfile
    # The image writes no bytecode at run time, so it compiles the sources when it is built.
    assert "PYTHONDONTWRITEBYTECODE=1" in dockerfile and "python -m compileall" in dockerfile


def test_env_example_lists_every_setting():
    read = set()
    for path in [*(BASE_DIR / "taskplatform" / "settings").glob("*.py"), BASE_DIR / "devtools" / "supervisor.py"]:
        text = path.read_text()
        read |= set(re.findall(r"\benv\.(?:str|int|bool|list|float|db|json|url)\(\s*[\"'](\w+)[\"']", text))
        read |= set(re.findall(r"\benv(?:\.get)?\(\s*[\"'](\w+)[\"']", text))
        read |= set(re.findall(r"\benv\[[\"'](\w+)[\"']\](?!\s*=[^=])", text))  # reads, not writes
        read |= set(re.findall(r"\bos\.environ(?:\.get\(|\[)\s*[\"'](\w+)[\"']", text))
    assert {"DATABASE_URL", "REDIS_URL", "HOST", "FLOWER_BASIC_AUTH"} <= read  # the scan itself works
    example = (BASE_DIR / ".env.example").read_text()
    names = re.findall(r"^#?\s*(\w+)=", example, re.MULTILINE)
    listed = set(names)
    assert len(names) == len(listed), f"listed twice: {sorted({n for n in names if names.count(n) > 1})}"
    assert not read - listed, f"missing from .env.example: {sorted(read - listed)}"


def test_docker_compose_accepts_the_file():
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker command here; the file is checked by parsing it above")
    if subprocess.run([docker, "compose", "version"], capture_output=True).returncode != 0:
        pytest.skip("`docker compose` (the compose plugin) is not installed here; the file is checked by parsing it")
    result = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE_FILE), "config", "-q"],
        cwd=BASE_DIR, capture_output=True, text=True,
        env={"DJANGO_SECRET_KEY": "x", "FLOWER_BASIC_AUTH": "a:b", **os.environ},  # the required ones
    )
    assert result.returncode == 0, result.stderr


def test_the_sentinel_override_points_every_app_service_at_the_sentinels(services):
    """docker-compose.sentinel.yml: a replica and three Sentinels, and every app service's
    REDIS_URL (merged over the base file's, as compose merges `environment`) names them."""
    from jobs.redis_clients import sentinel_target

    override = yaml.safe_load((BASE_DIR / "docker-compose.sentinel.yml").read_text())["services"]
    sentinels = [name for name in override if name.startswith("sentinel-")]
    assert len(sentinels) == 3
    for name in sentinels:
        script = " ".join(argv(override[name]))
        assert "sentinel monitor taskplatform redis 6379 2" in script and "--sentinel" in script
    assert argv(override["redis-replica"])[argv(override["redis-replica"]).index("--replicaof") + 1] == "redis"
    for name in [*APP_SERVICES, "migrate"]:
        merged = {**env_of(services[name]), **env_of(override[name])}
        target = sentinel_target(merged["REDIS_URL"])
        assert target is not None and target.master_name == "taskplatform", (name, merged["REDIS_URL"])
        assert sorted(host for host, _ in target.sentinels) == sorted(sentinels)
