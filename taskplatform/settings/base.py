"""Settings shared by every process (web, worker, beat, Flower, management commands).

Everything comes from the environment (django-environ); `.env.example` lists each variable.
Without `DATABASE_URL` the platform uses a SQLite file under `var/`; without `REDIS_URL` it
uses the embedded Redis server that `make run` and `make test` start (see
`devtools.embedded_redis`).

This module is shared, not run: a process loads `production` (the default of manage.py, the
ASGI application and the Celery app), `development` (`make run`) or `test` (`make test`), which
only override. Its own defaults are the safe ones: no debug, and no signing key at all.
"""

import sys
from pathlib import Path

import environ
from csp.constants import NONE, SELF

from jobs.redis_clients import channel_layer_host
from taskplatform.redis_urls import broker_transport_options_for, redis_url_for_celery
from taskplatform.settings.environment import SettingsEnv

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = BASE_DIR / "var"

# Read strictly: a value it cannot read (`WORKER_CONCURRENCY=four`, `DJANGO_SECURE_COOKIES=ture`)
# stops the process with one line that names it (taskplatform/settings/environment.py).
env = SettingsEnv()
# A `.env` file is optional; real environment variables win over it.
if (BASE_DIR / ".env").exists():
    environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

DEBUG = env.bool("DJANGO_DEBUG", default=False)
# Signs sessions, CSRF tokens and the wake tokens: production requires it, development has its own.
SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="")
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])

# Proxies in front of the platform that append to X-Forwarded-For (a load balancer, a TLS proxy):
# the client's address (the decision ledger, the admin's login throttle) is the right-most
# address past them (accounts/client_address.py). 0: the header is ignored. The older
# APPROVALS_TRUST_X_FORWARDED_FOR=true counts as one proxy.
TRUSTED_PROXY_COUNT = env.int(
    "TRUSTED_PROXY_COUNT", default=1 if env.bool("APPROVALS_TRUST_X_FORWARDED_FOR", default=False) else 0
)

HOST = env.str("HOST", default="127.0.0.1")
PORT = env.int("PORT", default=8000)
FLOWER_PORT = env.int("FLOWER_PORT", default=5555)
# The URL this platform is reachable at from the outside, used in links it sends (wake callbacks,
# e-mails). Defaults to the local server.
PUBLIC_URL = env.str("PUBLIC_URL", default=f"http://{HOST}:{PORT}").rstrip("/")

# `manage.py runserver` serves ASGI (HTTP and websockets) through daphne's runserver, which must
# come before staticfiles'. Only that command loads it: importing daphne imports Twisted and
# installs its reactor, which cost every other process (the web server's, the workers', beat's,
# Flower's, each management command's) about 0.6 s of start-up and 23 MB of memory.
RUNSERVER_APPS = ["daphne"] if sys.argv[1:2] == ["runserver"] else []

INSTALLED_APPS = [
    *RUNSERVER_APPS,
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files, served locally
    "channels",
    "csp",
    "accounts",
    "jobs",
    "approvals",
    "webhooks",
    "waits",
    "demo",
    "ops",
    # Last: its ready() marks the end of the process's loading (taskplatform/apps.py).
    "taskplatform",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Serves the admin's static files under the ASGI server without a separate web server.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # A method the path's view does not declare: 405 with Allow, before sessions or auth.
    "taskplatform.methods.MethodNotAllowedMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
]

# Content-Security-Policy of every response (django-csp): scripts, styles and connections from
# this site only, so an injected <script> or inline handler does not run. The pages, the admin,
# the ops dashboard and the API docs carry no inline script or style (tests/security).
# 'self' covers this site's ws:// and wss:// too (CSP level 3).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}

ROOT_URLCONF = "taskplatform.urls"
ASGI_APPLICATION = "taskplatform.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                # `questions_waiting`: the admin index's count of questions waiting for the user.
                "approvals.context_processors.questions_waiting",
            ],
        },
    },
]

# --- Database ---------------------------------------------------------------------------------
SQLITE_PATH = VAR_DIR / "db.sqlite3"
DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{SQLITE_PATH}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A worker and the web server write at once: WAL lets readers run beside the writer,
    # IMMEDIATE takes the write lock at BEGIN (so a transaction never fails half-way with
    # "database is locked" when it upgrades from read to write) and the timeout queues writers.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # Tests with a real worker process need a file both processes can open, not :memory:.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}
    # SQLite creates its file but not its folder (var/ in a fresh clone): whatever names a file makes its folder.
    for _sqlite_file in (DATABASES["default"]["NAME"], DATABASES["default"]["TEST"]["NAME"]):
        if _sqlite_file and ":memory:" not in _sqlite_file and "mode=memory" not in _sqlite_file:
            Path(_sqlite_file).parent.mkdir(parents=True, exist_ok=True)
elif env.bool("DATABASE_POOL", default=False):
    # The ASGI server (taskplatform/asgi.py turns this on) runs plain HTTP in its request
    # threads (WEB_THREADS) and the websocket consumers' database work in asgiref's threads; a
    # pool shared by all of them bounds the connections a web process holds, where a persistent
    # connection per thread would keep one per thread. Django requires CONN_MAX_AGE 0.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # A pooled connection is checked as it is handed out, so after PostgreSQL restarts (which
    # kills every pooled connection) the dead ones are replaced instead of failing one request
    # each (tests/chaos). With CONN_HEALTH_CHECKS Django gives the pool psycopg's
    # `check_connection`, a round trip per request; the backend `dbkit.postgresql` puts
    # `dbkit.pool.check_quietly` in its place, which asks the socket first and sends that round
    # trip only when in doubt. https://docs.djangoproject.com/en/5.2/ref/databases/#connection-pool
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    # Beside the URL's own options (`?sslmode=require`, `target_session_attrs=read-write`…), never
    # in their place: the web processes connect as every other process does.
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": env.int("DATABASE_POOL_MIN", default=2),
        "max_size": env.int("DATABASE_POOL_MAX", default=10),
        "timeout": 10,
    }
else:
    # Workers and commands keep one connection open between tasks; it is checked before reuse
    # so a restarted PostgreSQL costs one failed check, not a failed job.
    DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=600)
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Django's backend, with the pool's quiet check (above) and timestamps read in C: the same
    # values, 20 times faster to read (dbkit/postgresql/base.py).
    DATABASES["default"]["ENGINE"] = "dbkit.postgresql"
    # PostgreSQL compiles a statement to machine code (JIT) when its estimated cost passes
    # `jit_above_cost`: a reviewer's job list or an admin count on a large table took 480 ms of
    # compiling for 70 ms of running (bench/README.md, "A reviewer's reads at scale"). Nothing
    # the platform sends runs long enough to gain from it, so its connections turn it off (a
    # startup option, added to the URL's own `options`). DATABASE_JIT=true leaves the server's
    # setting, and sends nothing (a pooler that refuses startup options).
    if not env.bool("DATABASE_JIT", default=False):
        _options = DATABASES["default"].setdefault("OPTIONS", {})
        _options["options"] = f"{_options.get('options', '')} -c jit=off".strip()
# The hot paths' statements (a job's moves, the kept reads) are prepared once per connection
# (dbkit/prepared.py). Set false behind a connection pooler in transaction mode that does not
# follow prepared statements (PgBouncer before 1.21).
DATABASE_PREPARED_STATEMENTS = env.bool("DATABASE_PREPARED_STATEMENTS", default=True)
# Under DEBUG (`make run`'s web process) Django records every statement's SQL in
# `connection.queries`; the backend (dbkit/postgresql/base.py) does so only when this asks for it.
DATABASE_RECORD_QUERIES = env.bool("DATABASE_RECORD_QUERIES", default=False)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis ------------------------------------------------------------------------------------
EMBEDDED_REDIS_SOCKET = VAR_DIR / "redis" / "redis.sock"
REDIS_URL = env.str("REDIS_URL", default=f"unix://{EMBEDDED_REDIS_SOCKET}")
# Prepended to every Redis key the platform writes (Celery queues and channel groups), so
# several deployments or test runs can share one Redis server without seeing each other.
REDIS_KEY_PREFIX = env.str("REDIS_KEY_PREFIX", default="")

# Django's ModelBackend, reading a user's permissions in one query instead of two (accounts/backends.py).
AUTHENTICATION_BACKENDS = ["accounts.backends.ModelBackend"]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# The admin's sign-in (accounts/login_throttle.py): after this many failed attempts for one
# username from one address, or four times as many from one address for any usernames, that
# address waits LOGIN_LOCKOUT_SECONDS (counted in Redis, so across web processes).
LOGIN_FAILURE_LIMIT = env.int("LOGIN_FAILURE_LIMIT", default=5)
LOGIN_LOCKOUT_SECONDS = env.int("LOGIN_LOCKOUT_SECONDS", default=900)

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
# Dates and times to the second, year first, everywhere the admin shows one (taskplatform/formats/).
FORMAT_MODULE_PATH = ["taskplatform.formats"]
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATICFILES_DIRS = [BASE_DIR / "static"] if (BASE_DIR / "static").exists() else []
# Whitenoise finds files through the finders when collectstatic has not run (development).
WHITENOISE_USE_FINDERS = True
# Re-scanning the static files on every request is for development only.
WHITENOISE_AUTOREFRESH = False

LOGIN_URL = "/admin/login/"

# --- Jobs -------------------------------------------------------------------------------------
# Default number of runs a job gets before it fails for good (a kind may set its own).
JOBS_DEFAULT_MAX_ATTEMPTS = env.int("JOBS_DEFAULT_MAX_ATTEMPTS", default=3)
# Retry back-off: base * 2**(attempt-1) seconds, capped, with full jitter.
JOBS_RETRY_BACKOFF_BASE = env.float("JOBS_RETRY_BACKOFF_BASE", default=2.0)
JOBS_RETRY_BACKOFF_MAX = env.float("JOBS_RETRY_BACKOFF_MAX", default=300.0)
# A pending job that has not moved for this many seconds and whose message is not on its way
# (no dispatch mark in the broker: see jobs/broker.py) has its message sent again; a slow message
# (still queued) is never sent twice. A broker that lost its data is seen at the next pass and
# every pending job's message is sent again at once.
JOBS_DISPATCH_GRACE = env.float("JOBS_DISPATCH_GRACE", default=30.0)
# How long the broker vouches for a dispatched message (its mark expires after this many
# seconds): past it a job still pending may be sent once more.
# A message that a worker took and died holding before it claimed its job is not covered by
# the mark: it is sent again once the worker is seen dead (JOBS_HELD_STALE_AFTER, below).
JOBS_DISPATCH_MARK_TTL = env.float("JOBS_DISPATCH_MARK_TTL", default=3600.0)
JOBS_RECONCILE_INTERVAL = env.float("JOBS_RECONCILE_INTERVAL", default=10.0)
# Each worker publishes which jobs' messages it holds (running, reserved, waiting for a countdown)
# when that changes, checked every JOBS_HELD_PUBLISH_INTERVAL seconds, and at least every third of
# JOBS_HELD_STALE_AFTER. A worker silent for JOBS_HELD_STALE_AFTER is taken for dead: the
# reconciler's next pass sends its pending jobs again (jobs/broker.py, "Held messages").
JOBS_HELD_PUBLISH_INTERVAL = env.float("JOBS_HELD_PUBLISH_INTERVAL", default=1.0)
JOBS_HELD_STALE_AFTER = env.float("JOBS_HELD_STALE_AFTER", default=15.0)
# Hard ceiling on one run of a job; a kind may ask for less.
JOBS_TIME_LIMIT = env.int("JOBS_TIME_LIMIT", default=3600)
# Check every move statement kept by `jobs.statements` against the ORM's (text and parameters):
# the test settings turn it on, so the whole suite checks them; it costs what it saves.
JOBS_CHECK_MOVE_STATEMENTS = env.bool("JOBS_CHECK_MOVE_STATEMENTS", default=False)
# The same for the reads and the INSERTs built once per connection (dbkit.kept, dbkit.inserts): each
# is also built by the ORM and compared. On in the test settings; costs what it saves.
KEPT_READS_CHECK = env.bool("KEPT_READS_CHECK", default=False)
# A running job holds a lease of this many seconds that its worker renews (every third of it).
# When a worker dies (kill -9, out of memory, a lost machine) its jobs go back to `pending`
# once their lease has expired and the reconciler runs: this bounds how long a job can look
# `processing` with no worker behind it. Longer: fewer heartbeat writes; shorter: faster
# recovery.
JOBS_LEASE_SECONDS = env.float("JOBS_LEASE_SECONDS", default=60.0)
# A cancelled job that is still running this many seconds later (its code reached no `ctx`
# call, so it never saw the cancellation) is terminated through Celery's revoke.
JOBS_CANCEL_GRACE = env.float("JOBS_CANCEL_GRACE", default=30.0)
# A run handed back (its worker shutting down, its database gone) does not count as an attempt,
# this many times per job; past that a hand-back counts as a failed attempt, so a job that keeps
# being handed back ends. The first hand-back goes again at once, later ones after a back-off.
JOBS_HAND_BACK_BUDGET = env.int("JOBS_HAND_BACK_BUDGET", default=10)

# --- Celery -----------------------------------------------------------------------------------
# Read by taskplatform/celery.py with namespace="CELERY".
# https://docs.celeryq.dev/en/stable/userguide/configuration.html
CELERY_BROKER_URL = redis_url_for_celery(REDIS_URL)
# Jobs keep their results and errors in the database, which is the source of truth; a result
# backend would be a second copy that nothing reads.
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
# So the backend is Celery's `DisabledBackend`, which holds nothing: one for every thread of a
# process. Otherwise each thread builds its own at its first message, reading every installed
# package's entry points to find out there is none (the web process builds it as it starts).
CELERY_RESULT_BACKEND_THREAD_SAFE = True
# JSON only: a pickled message from a compromised broker would run code in the worker.
# https://docs.celeryq.dev/en/stable/userguide/security.html#serializers
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
# Acknowledge after the task ran, so a worker that dies mid-task leaves the message to be
# delivered again instead of losing it; the job's atomic claim makes a second delivery harmless.
# https://docs.celeryq.dev/en/stable/userguide/tasks.html#Task.acks_late
CELERY_TASK_ACKS_LATE = True
# ...and also when the worker process is killed (SIGKILL, OOM): re-queue rather than drop.
# The job row counts attempts, so a job that always kills its worker cannot loop forever.
# https://docs.celeryq.dev/en/stable/userguide/configuration.html#task-reject-on-worker-lost
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# One message reserved per worker process: long jobs must not sit unstarted behind another
# job in a busy process while an idle worker elsewhere could run them.
# https://docs.celeryq.dev/en/stable/userguide/optimizing.html#prefetch-limits
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Per-task events (sent, received, started, succeeded, …) feed Flower's task list and the admin's
# links into it. Each job's run costs four more Redis publishes and Flower's CPU to follow them
# (bench/README.md, "The shipped configuration"), so they are off unless WORKER_TASK_EVENTS=true.
# Flower stays useful without them: workers, their heartbeats, and what `inspect` asks each
# worker (active and reserved tasks, pool, queues); the jobs themselves are on /ops/ and in the
# admin. Flower must then not switch them back on (FLOWER_ENABLE_EVENTS, set by make run and
# the compose file from WORKER_TASK_EVENTS).
# https://docs.celeryq.dev/en/stable/userguide/monitoring.html#events
WORKER_TASK_EVENTS = env.bool("WORKER_TASK_EVENTS", default=False)
CELERY_WORKER_SEND_TASK_EVENTS = WORKER_TASK_EVENTS
CELERY_TASK_SEND_SENT_EVENT = WORKER_TASK_EVENTS
# Time limits: the soft limit raises inside the job (which records a `timeout` error), the
# hard limit kills the process if the job ignores it.
CELERY_TASK_SOFT_TIME_LIMIT = JOBS_TIME_LIMIT
CELERY_TASK_TIME_LIMIT = JOBS_TIME_LIMIT + 60
# No acknowledgement emulation: kombu's Redis transport would keep every delivered message in an
# `unacked` hash (a MULTI/EXEC at each delivery and at each ack, about a sixth of a job's CPU:
# bench/README.md, "Celery's late-ack bookkeeping") to give it back after the visibility timeout
# (an hour and more) when its worker dies. The database covers that faster: a claimed job's lease,
# and for a message taken and not yet claimed, the messages each worker publishes as held
# (jobs/broker.py, JOBS_HELD_*). A worker shutting down cleanly still gives its unstarted messages
# back to the queue, and one whose pool process dies requeues that run's message
# (`task_reject_on_worker_lost`): both are kombu's, with or without the emulation. Long waits are
# due times in the database, never ETA messages.
# https://docs.celeryq.dev/en/stable/getting-started/backends-and-brokers/redis.html#visibility-timeout
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "ack_emulation": False,
    "global_keyprefix": REDIS_KEY_PREFIX,
    **broker_transport_options_for(REDIS_URL),  # the master's name, with Sentinels
    # A Redis that stops answering (a broken route, a host cut off) fails a publish in seconds
    # instead of hanging the request that sent it: the job is committed, and the reconciler
    # sends it again once Redis answers (tests/cluster/test_hosts.py).
    "socket_connect_timeout": 2,
    "socket_timeout": 5,
}
# A dispatch that cannot reach the broker gives up after a short retry (the default retries 3
# times, each waiting for the connect timeout): the job stays `pending` in the database and the
# reconciler re-sends it (JOBS_DISPATCH_GRACE).
# https://docs.celeryq.dev/en/stable/userguide/configuration.html#task-publish-retry-policy
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2}
# Keep retrying the broker on start-up (Celery 6 changes the default)...
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# ...and for as long as it takes after a connection loss (Redis restarting): by default a worker
# gives up after 100 attempts (some 50 minutes of outage) and exits. The jobs wait in the
# database, so a worker that keeps trying is never wrong (tests/chaos/test_restarts.py).
# https://docs.celeryq.dev/en/stable/userguide/configuration.html#broker-connection-max-retries
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
# When the broker connection is lost, the runs in flight go on (Celery 6 will cancel them by
# default): a run writes its steps and outcome to the database, which needs no broker, and an
# ack that cannot reach a restarted Redis costs at most a second message, which the atomic claim
# ignores. Cancelling would kill every running job at each Redis blip: the step in flight would
# run again and the job would wait for its lease to expire before going on.
# https://docs.celeryq.dev/en/stable/userguide/configuration.html#worker-cancel-long-running-tasks-on-connection-loss
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
CELERY_WORKER_CONCURRENCY = env.int("WORKER_CONCURRENCY", default=None)
# A pool process whose job code leaks memory is replaced once it holds more than this many MB
# (its peak resident set, checked by Celery after each task: the task finishes first). A new pool
# process is not free: its fork, its connections, the rehearsal of its moves, and the pages it
# copies from its parent as it writes to them cost about 0.1 s of CPU and leave its slot idle
# meanwhile; replacing one every 1,000 jobs took 15 % off the job rate, about 4 % once the pool
# replaced a process the moment it left (bench/README.md, "A pool process's replacement", and
# taskplatform/prefork.py). So processes are replaced for what they hold, not every few seconds.
# A process starts at some 100 MB. 0: no limit (Celery wants None for that).
CELERY_WORKER_MAX_MEMORY_PER_CHILD = env.count("WORKER_MAX_MEMORY_PER_CHILD_MB", default=512) * 1024 or None
# And after this many tasks whatever it holds (a leak of something other than memory: threads,
# files). 0: never (Celery wants None for that, and refuses to start its pool on a 0).
CELERY_WORKER_MAX_TASKS_PER_CHILD = env.count("WORKER_MAX_TASKS_PER_CHILD", default=10_000) or None
# Celery's prefork pool, whose replacement of a process that left for either limit above waited
# up to 5 s now and then, with no job taken meanwhile when every process left at once
# (taskplatform/prefork.py). Used with `--pool prefork` too, Celery's default.
CELERY_WORKER_POOL = "taskplatform.prefork:TaskPool"
CELERY_TASK_DEFAULT_QUEUE = "jobs"
# Beat's housekeeping (the reconciler, due waits, deadlines, webhook retries) has a queue of its
# own, served by a small worker of its own (`platform-worker` under `make run` and in compose):
# with every job slot busy with long jobs, a dead worker's jobs are still taken back, waits still
# wake and deadlines still fire (see taskplatform/celery.py).
JOBS_PLATFORM_QUEUE = "platform"
# Celery's Django fix-up closes the database connection before and after every task unless
# this is set: a new PostgreSQL connection per job cost more than the job itself. Connections
# are still recycled after this many tasks, and Django's own checks (CONN_MAX_AGE, health
# checks, closing after an error) run around each task: with it set, the platform's receivers
# do both in place of the fix-up's (taskplatform/celery.py). 0: a new connection per task.
# https://docs.celeryq.dev/en/stable/django/first-steps-with-django.html
CELERY_DB_REUSE_MAX = env.int("CELERY_DB_REUSE_MAX", default=1000)
# Beat's scheduler: several `celery beat` may run, the one holding a lease in the database sends
# (ops/scheduler.py). Its schedule lives in memory, so beat writes no file (the default
# PersistentScheduler's shelve file needed a folder that only the embedded defaults made).
# https://docs.celeryq.dev/en/stable/userguide/configuration.html#beat-scheduler
CELERY_BEAT_SCHEDULER = "ops.scheduler:LeaderScheduler"
# The leader renews its lease every SCHEDULER_HEARTBEAT_INTERVAL seconds (its heartbeat: /readyz
# calls the scheduler silent after three) for SCHEDULER_LEASE_SECONDS; a standby takes over once
# it has expired, so the passes go on at most one lease after their leader died.
SCHEDULER_HEARTBEAT_INTERVAL = env.float("SCHEDULER_HEARTBEAT_INTERVAL", default=5.0)
SCHEDULER_LEASE_SECONDS = env.float("SCHEDULER_LEASE_SECONDS", default=15.0)
CELERY_BEAT_SCHEDULE: dict = {
    "jobs-reconcile": {"task": "jobs.reconcile", "schedule": JOBS_RECONCILE_INTERVAL},
}

# --- Channels ---------------------------------------------------------------------------------
CHANNEL_LAYERS = {
    "default": {
        # channels-redis with a connection pool that waits for a free connection rather than
        # failing past 100 (a burst of reconnecting websockets); see taskplatform/channel_layer.py.
        "BACKEND": "taskplatform.channel_layer.RedisChannelLayer",
        "CONFIG": {
            # redis-py 8's default socket_timeout (5 s) equals channels-redis's blocking-pop
            # timeout and kills idle websockets with 1011; give the socket more room.
            "hosts": [channel_layer_host(REDIS_URL, socket_timeout=30, max_connections=100, timeout=10)],
            "prefix": f"{REDIS_KEY_PREFIX}asgi",
            "capacity": 1000,
            "expiry": 60,
        },
    }
}

# --- Input limits ---------------------------------------------------------------------------------
# The largest request body, in bytes: the API answers 413 past it (taskplatform/api/parsers.py, and
# the ASGI application before reading a body whose declared length is larger), Django's forms 400.
REQUEST_BODY_MAX_BYTES = env.int("REQUEST_BODY_MAX_BYTES", default=2_621_440)
DATA_UPLOAD_MAX_MEMORY_SIZE = REQUEST_BODY_MAX_BYTES
# The deepest nesting of arrays and objects accepted in JSON from outside (API bodies, the forms'
# JSON fields): deeper is a 400, measured before parsing (jobs/json_input.py).
JSON_MAX_DEPTH = env.int("JSON_MAX_DEPTH", default=64)
# --- Live streams (websockets on /ws/jobs/…, SSE) ----------------------------------------------
# Live streams one user may hold at once, across every web process (0: no cap). Over it a
# websocket is closed with 4429 and an SSE request answers 429.
LIVE_STREAMS_PER_USER = env.int("LIVE_STREAMS_PER_USER", default=100)
# Seconds between two re-checks of every open stream: its user still active, its credential
# (token, session) still valid, its job still visible; a failing stream is closed. A revoked
# API token closes its streams at once.
LIVE_RECHECK_INTERVAL = env.float("LIVE_RECHECK_INTERVAL", default=15.0)
# Bytes that may wait for one websocket client that does not read, beyond what the kernel
# buffers; past it the client is dropped (close 4408) and reconnects with ?after=.
LIVE_SLOW_CLIENT_BYTES = env.int("LIVE_SLOW_CLIENT_BYTES", default=256 * 1024)
# The kernel send buffer of a live websocket, in bytes (0: the kernel's autotuning, up to 4 MB on
# Linux). Bounded, a client that stops reading is found slow sooner and holds less memory.
LIVE_SOCKET_SEND_BUFFER = env.int("LIVE_SOCKET_SEND_BUFFER", default=64 * 1024)
# The longest a web process waits, in milliseconds, for the rest of a burst of a job's events (a
# step's end, its progress, the next step's start come over a few milliseconds) before it hands the
# first one to a crowd of its followers, so that one pass over the crowd carries them all. It waits
# half the pass it is about to make, up to this; a handful of watchers never waits (0: never).
LIVE_BURST_WINDOW_MS = env.float("LIVE_BURST_WINDOW_MS", default=5.0)
# Seconds a websocket ticket (POST /api/ws-tickets/) stays good; at most 60.
WS_TICKET_TTL = env.int("WS_TICKET_TTL", default=30)

# --- REST framework -------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["taskplatform.api.parsers.BoundedJSONParser"],
    # Every error, the platform's and DRF's own, as {"code", "detail", "field"?}.
    "EXCEPTION_HANDLER": "jobs.api_errors.api_exception_handler",
    "DEFAULT_PAGINATION_CLASS": "taskplatform.api.pagination.ApiPagination",
    "PAGE_SIZE": 50,
    # Per-token limits, counted in Redis (the cache below) so they hold across web processes.
    "DEFAULT_THROTTLE_CLASSES": ["taskplatform.api.throttling.TokenRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"api": env.str("API_THROTTLE_RATE", default="6000/min") or None},
}
SPECTACULAR_SETTINGS = {
    "TITLE": "taskplatform API",
    "DESCRIPTION": (
        "Long-running background jobs with people in the loop. Authenticate with "
        "`Authorization: Token <key>` (`python manage.py create_api_token USERNAME`) or a browser session. "
        "Every error body is `{\"code\", \"detail\", \"field\"?}`."
    ),
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI's files come from the drf-spectacular-sidecar package: the docs work offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        "JobStatusEnum": "jobs.models.Job.Status",
        "QuestionStatusEnum": "approvals.models.Question.Status",
        "JobEventTypeEnum": "jobs.models.JobEvent.Type",
        "WebhookEventEnum": "webhooks.models.Webhook.Event",
    },
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "taskplatform.api.schema.add_healthz",
        "taskplatform.api.schema.add_job_kinds",
        "taskplatform.api.schema.single_blank_branch",
        "taskplatform.api.schema.add_request_too_large",
    ],
    # A request's string that may not be blank says `minLength: 1`.
    "ENFORCE_NON_BLANK_FIELDS": True,
}
# Outgoing webhooks (the API's push side): timeout of one attempt, attempts before a delivery
# fails for good, back-off base * 2**(attempt-1) seconds capped at max, and how often beat looks
# for due retries.
WEBHOOK_TIMEOUT = env.float("WEBHOOK_TIMEOUT", default=10.0)
# The most of a receiver's answer that is read (its start is logged on the delivery); the rest is
# never downloaded.
WEBHOOK_RESPONSE_MAX_BYTES = env.int("WEBHOOK_RESPONSE_MAX_BYTES", default=65_536)
WEBHOOK_MAX_ATTEMPTS = env.int("WEBHOOK_MAX_ATTEMPTS", default=8)
WEBHOOK_RETRY_BASE = env.float("WEBHOOK_RETRY_BASE", default=10.0)
WEBHOOK_RETRY_MAX = env.float("WEBHOOK_RETRY_MAX", default=3600.0)
WEBHOOK_SWEEP_INTERVAL = env.float("WEBHOOK_SWEEP_INTERVAL", default=10.0)
CELERY_BEAT_SCHEDULE["webhooks-send-due"] = {"task": "webhooks.send_due", "schedule": WEBHOOK_SWEEP_INTERVAL}
# Where webhooks may go (server-side request forgery, see webhooks/targets.py): a delivery resolves
# the host, refuses it when any address is loopback, private, link-local (cloud metadata), CGNAT,
# multicast or reserved, and connects to the address it checked. True allows every address, for
# on-premise deployments whose receivers are on the internal network.
WEBHOOKS_ALLOW_PRIVATE_NETWORKS = env.bool("WEBHOOKS_ALLOW_PRIVATE_NETWORKS", default=False)
# True refuses plain-http webhook URLs, at registration and at delivery.
WEBHOOKS_REQUIRE_HTTPS = env.bool("WEBHOOKS_REQUIRE_HTTPS", default=False)

# --- Questions to reviewers (approvals) --------------------------------------------------------
# Who is asked when a job's `ctx.ask` names nobody: usernames and "group:name"s.
APPROVALS_DEFAULT_ASSIGNEES = env.list("APPROVALS_DEFAULT_ASSIGNEES", default=["group:reviewers"])
# Seconds between two looks (Celery beat) for questions past their deadline: a deadline's
# policy (default answer, fail, cancel, escalate) applies within one such interval.
APPROVALS_DEADLINE_INTERVAL = env.float("APPROVALS_DEADLINE_INTERVAL", default=10.0)
CELERY_BEAT_SCHEDULE["approvals-enforce-deadlines"] = {
    "task": "approvals.enforce_deadlines",
    "schedule": APPROVALS_DEADLINE_INTERVAL,
}
# HMAC-SHA256 key of the webhooks a job kind names (`notify_webhook`) for its questions; empty:
# those webhooks are not sent.
APPROVALS_WEBHOOK_SECRET = env.str("APPROVALS_WEBHOOK_SECRET", default="")

# --- Waits on external work (ctx.wait_for) ----------------------------------------------------
# Backup checks, in seconds after the service accepted the work; still pending at the last: fail.
WAITS_DEFAULT_MARKS = env.list("WAITS_DEFAULT_MARKS", cast=float, default=[60.0, 180.0, 300.0])
# Runs of a job through one wait before it is stopped as a runaway loop.
WAITS_MAX_EXECUTIONS = env.int("WAITS_MAX_EXECUTIONS", default=20)
# Answers of 429 honoured (each after its Retry-After) before the job fails as `throttled`.
WAITS_MAX_THROTTLE_BOUNCES = env.int("WAITS_MAX_THROTTLE_BOUNCES", default=10)
# Transport failures in a row (timeouts, resets, bad bodies) before `gateway_unavailable`; each
# retried after WAITS_TRANSPORT_BACKOFF * 2**(n-1) seconds.
WAITS_MAX_TRANSPORT_FAILURES = env.int("WAITS_MAX_TRANSPORT_FAILURES", default=3)
WAITS_TRANSPORT_BACKOFF = env.float("WAITS_TRANSPORT_BACKOFF", default=2.0)
# Polling mode (services without callbacks): first interval, cap, and how long before giving up.
WAITS_POLL_MIN_INTERVAL = env.float("WAITS_POLL_MIN_INTERVAL", default=5.0)
WAITS_POLL_MAX_INTERVAL = env.float("WAITS_POLL_MAX_INTERVAL", default=300.0)
WAITS_POLL_MAX_DURATION = env.float("WAITS_POLL_MAX_DURATION", default=3600.0)
# Seconds one HTTP call to an outside service (and the simulator's callback) may take.
WAITS_HTTP_TIMEOUT = env.float("WAITS_HTTP_TIMEOUT", default=10.0)
# Seconds between two looks (Celery beat) for due waits: a backup check is late by at most this.
# Due times live in the database; no long ETA messages (see the Redis visibility timeout above).
WAITS_DUE_INTERVAL = env.float("WAITS_DUE_INTERVAL", default=1.0)
CELERY_BEAT_SCHEDULE["waits-due"] = {"task": "waits.due", "schedule": WAITS_DUE_INTERVAL}
# The simulated generation service (`demo`, development and tests only): its sweep for callbacks
# whose countdown task was lost. The production settings drop it together with the app.
CELERY_BEAT_SCHEDULE["demo-simulator-callbacks"] = {
    "task": "demo.simulator_callbacks",
    "schedule": WAITS_DUE_INTERVAL,
}

# --- E-mail -----------------------------------------------------------------------------------
# Reviewers are e-mailed when a question waits for them. The console backend (the default, and
# under `make run`) prints each message in the worker's output.
EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env.str("EMAIL_HOST", default="localhost")
EMAIL_PORT = env.int("EMAIL_PORT", default=25)
EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env.str("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=False)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="taskplatform@localhost")
# DRF's throttles count in Django's cache: Redis, so every web process shares the counts.
CACHES = {
    "default": {
        # Django's RedisCache, which also follows a master through Sentinels (jobs.redis_clients).
        "BACKEND": "jobs.redis_clients.SentinelAwareRedisCache",
        "LOCATION": REDIS_URL,
        # The throttle lets a request through when Redis cannot be asked; these bound the asking.
        "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
        "KEY_PREFIX": REDIS_KEY_PREFIX,
    }
}

# --- Logging ----------------------------------------------------------------------------------
# One configuration for every process: Celery's worker and beat apply it too instead of their own
# (ops.signals), so a worker's lines look like the web server's. Lines a job causes carry its id
# and kind (ops/logging.py): `[demo.sleep 8c1e…]` in the readable format, `job_id` and
# `job_kind` fields in JSON. `readable` here (make run), `json` (one object a line) under the
# production settings.
LOG_LEVEL = env.str("LOG_LEVEL", default="INFO")
LOG_FORMAT = env.str("LOG_FORMAT", default="readable")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "job": {"()": "ops.logging.JobContextFilter"},
        # Wake tokens, websocket tickets and `token=` values in logged URLs become [redacted].
        "redact": {"()": "ops.logging.SecretsRedactFilter"},
    },
    "formatters": {
        "readable": {
            "()": "ops.logging.ReadableFormatter",
            "format": "%(asctime)s %(levelname)-7s %(name)s%(job)s: %(message)s",
        },
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(levelname)s %(name)s %(process)d %(message)s",
            "rename_fields": {"levelname": "level", "name": "logger", "process": "pid"},
            "timestamp": "time",
        },
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["job", "redact"]},
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "INFO"},
        # Without handlers of its own: Django's default ones (a console handler under DEBUG, which
        # wrote each request warning a second time, unredacted) give way to the root's.
        "django": {"level": "INFO"},
    },
}
# Celery's two lines per task, `Task … received` (the worker's main process) and `Task … succeeded
# in …s` (its pool process), each relayed by `make run`'s supervisor too: about 0.3 ms of CPU per
# job, a twelfth of a no-op job's cost under `make run` (bench/README.md, "Celery's line per
# task"). A job's own log says more (its events, with times, in the admin and the API), and
# failures, retries of the database's outages and the platform's own lines are logged whatever
# this says. WORKER_TASK_LOG=true brings them back.
WORKER_TASK_LOG = env.bool("WORKER_TASK_LOG", default=False)
if not WORKER_TASK_LOG:
    LOGGING["loggers"].update({name: {"level": "WARNING"} for name in ("celery.app.trace", "celery.worker.strategy")})
# Celery beat's line per pass it sends (`Scheduler: Sending due task …`): with `waits.due` due every
# second (and the demo's sweep in development), two lines a second, most of what `make run` or a
# quiet deployment logs. Whether beat is alive is /readyz's scheduler check (its lease's
# heartbeat); beat's leadership, its errors and the passes' own results are logged whatever this
# says. BEAT_SEND_LOG=true brings the lines back.
BEAT_SEND_LOG = env.bool("BEAT_SEND_LOG", default=False)
if not BEAT_SEND_LOG:
    LOGGING["filters"]["beat_sends"] = {"()": "ops.logging.BeatSendsFilter"}
    LOGGING["loggers"]["celery.beat"] = {"filters": ["beat_sends"]}

# --- Operations (ops: /metrics, /readyz, Flower links) -------------------------------------------
# Bearer token that may read GET /metrics (`Authorization: Bearer ...`); staff may always. Empty:
# staff only.
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")
# Seconds back that the /metrics histograms look (run durations, answer and wake latencies): they
# describe the jobs that finished, the questions answered and the wakes of that window.
METRICS_WINDOW = env.int("METRICS_WINDOW", default=3600)
# Seconds between two heartbeats a worker writes to Redis (its queues, that it is alive) ...
OPS_HEARTBEAT_INTERVAL = env.float("OPS_HEARTBEAT_INTERVAL", default=10.0)
# ... and the age past which /readyz counts a worker as gone (503 when no worker is fresher).
OPS_WORKER_STALE_AFTER = env.float("OPS_WORKER_STALE_AFTER", default=30.0)
# Seconds between two passes that drop the cancelled entries of a worker's timer (each task's
# time limit, cancelled when it ends, would otherwise stay there for JOBS_TIME_LIMIT: ops.signals).
# 0 turns the passes off.
WORKER_TIMER_COMPACT_INTERVAL = env.float("WORKER_TIMER_COMPACT_INTERVAL", default=60.0)
# Flower as a browser reaches it, for the admin's links to a job's Celery tasks.
FLOWER_URL = env.str("FLOWER_URL", default=f"http://{HOST}:{FLOWER_PORT}").rstrip("/")
# Every request for a job (its page, its API, its admin page) logs with the job's id and kind
# (ops/middleware.py). Last, around the view; the context lasts until the response is closed, so
# Django's own "Not Found: /api/jobs/..." line names the job too.
MIDDLEWARE = [*MIDDLEWARE, "ops.middleware.JobLogContextMiddleware"]
