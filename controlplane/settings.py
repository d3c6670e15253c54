"""Gantry settings: everything that differs between machines comes from the environment.

See the configuration table in README.md. Helpers in ``controlplane.env`` refuse bad
values with one line naming the variable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from kombu import Queue

from controlplane import tasknames
from controlplane.env import (
    database_from_url,
    envbool,
    envfloat,
    envint,
    envlist,
    envnetworks,
    envproxies,
    envsecret,
    envstr,
    redis_url,
)

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = envbool("DEBUG", False)

DATA_DIR = Path(envstr("GANTRY_DATA_DIR", str(BASE_DIR / "var" / "data"))).resolve()
try:
    DATA_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
except OSError as _error:
    raise ImproperlyConfigured(
        f"GANTRY_DATA_DIR={str(DATA_DIR)!r} cannot be created: {_error.strerror}."
    ) from None

_secret_key = envsecret("SECRET_KEY")
if _secret_key is None:
    if not DEBUG:
        raise ImproperlyConfigured(
            "SECRET_KEY (or SECRET_KEY_FILE) is required when DEBUG is off; "
            "generate one with: python -c 'import secrets; print(secrets.token_urlsafe(50))'"
        )
    _secret_key = "insecure-development-key-only-for-DEBUG-mode"  # noqa: S105
SECRET_KEY = _secret_key

ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["127.0.0.1", "localhost"] if DEBUG else [])
if not DEBUG and not ALLOWED_HOSTS:
    raise ImproperlyConfigured(
        "ALLOWED_HOSTS is required when DEBUG is off (comma-separated host names)."
    )
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    # Not rest_framework.authtoken: its keys became personal API tokens (core.ApiToken,
    # flagged legacy) in migration core 0004, which reads the old table by name, so the app
    # need not be installed for it; installed, it would bring back an admin page making
    # keys that no longer sign anyone in.
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    # Gantry's apps, lowest layer first (import-linter checks the order).
    "core",
    "controlplane",
    "nodes",
    "runs",
    "health",
    "jobs",
    "drills",
    "recovery",
    "acceptance",
    "watcher",
    "studies",
    "notifications",
    "console",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "core.access.RoleRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "controlplane.urls"

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
                "core.context_processors.gantry",
            ],
        },
    },
]

WSGI_APPLICATION = "controlplane.wsgi.application"
ASGI_APPLICATION = "controlplane.asgi.application"

DATABASE_URL = envstr("DATABASE_URL", f"sqlite:///{DATA_DIR / 'gantry.sqlite3'}")
DATABASES = {"default": database_from_url(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Django's model backend, loading a session's user with its roles in one query.
AUTHENTICATION_BACKENDS = ["core.auth.RoleAwareModelBackend"]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = envstr("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(envstr("GANTRY_STATIC_ROOT", str(BASE_DIR / "var" / "static")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "django.contrib.staticfiles.storage.StaticFilesStorage"
            if DEBUG
            else "whitenoise.storage.CompressedManifestStaticFilesStorage"
        )
    },
}

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "overview"
LOGOUT_REDIRECT_URL = "login"

# Security. TLS is assumed in production (DEBUG off); set GANTRY_TLS=false only when
# Gantry is reached over plain HTTP on a trusted network.
GANTRY_TLS = envbool("GANTRY_TLS", not DEBUG)
SESSION_COOKIE_SECURE = GANTRY_TLS
CSRF_COOKIE_SECURE = GANTRY_TLS
SECURE_SSL_REDIRECT = GANTRY_TLS and envbool("GANTRY_SSL_REDIRECT", True)
SECURE_HSTS_SECONDS = envint("GANTRY_HSTS_SECONDS", 31536000 if GANTRY_TLS else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = GANTRY_TLS
SECURE_HSTS_PRELOAD = GANTRY_TLS and envbool("GANTRY_HSTS_PRELOAD", True)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SESSION_COOKIE_HTTPONLY = True
# Sessions in the database, read from the cache (a copy kept at most a minute): core.sessions.
SESSION_ENGINE = "core.sessions"
X_FRAME_OPTIONS = "DENY"
if envbool("GANTRY_BEHIND_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# Redis and Celery.
REDIS_URL = redis_url(envstr("REDIS_URL", "redis://127.0.0.1:6379/0"), name="REDIS_URL")
CELERY_BROKER_URL = redis_url(envstr("CELERY_BROKER_URL", REDIS_URL), name="CELERY_BROKER_URL")
CELERY_RESULT_BACKEND = redis_url(
    envstr("CELERY_RESULT_BACKEND", CELERY_BROKER_URL), name="CELERY_RESULT_BACKEND"
)
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_EXPIRES = 3600
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = envint("GANTRY_TASK_SOFT_TIME_LIMIT", 240, minimum=10)
CELERY_TASK_TIME_LIMIT = envint("GANTRY_TASK_TIME_LIMIT", 300, minimum=15)
# Above the longest task, so a late-acked task is not redelivered while still running.
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {
    "visibility_timeout": CELERY_TASK_TIME_LIMIT * 3,
    # Publishing (a web request enqueueing work) gives up fast when Redis is down: the
    # watcher re-enqueues queued work once it is back. The worker's own reconnect loop
    # is separate and keeps trying.
    "max_retries": 1,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.5,
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A web request that enqueues while Redis is down must not hang: give up fast; the watcher
# re-enqueues queued work once Redis is back.
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.5,
}
CELERY_BROKER_CONNECTION_TIMEOUT = 2
CELERY_TASK_ALWAYS_EAGER = False
# Deliveries (webhooks, email) have a queue of their own: an endpoint that answers slowly
# holds only the workers that consume it, never those that submit jobs and run the
# watcher. A worker started without -Q consumes every queue listed here; production may
# run one worker per queue (README, Production).
CELERY_TASK_DEFAULT_QUEUE = "celery"
NOTIFICATIONS_QUEUE = "notifications"
# Certificates for the web processes (nodes.access.signer): a queue of its own, so a page waits
# for a signature, not behind a job submission; production may give it a worker of its own.
SIGNER_QUEUE = "signer"
# Each bound by its own name: left out, Celery binds every queue with the default routing
# key, and a message for one queue would land in all of them.
CELERY_TASK_QUEUES = [
    Queue(name, routing_key=name)
    for name in (CELERY_TASK_DEFAULT_QUEUE, NOTIFICATIONS_QUEUE, SIGNER_QUEUE)
]
CELERY_TASK_ROUTES = {
    tasknames.NOTIFICATION_DELIVER: {"queue": NOTIFICATIONS_QUEUE},
    tasknames.USER_CERTIFICATE_SIGN: {"queue": SIGNER_QUEUE},
    tasknames.USER_CA_ENSURE: {"queue": SIGNER_QUEUE},
}
# How often beat looks for clusters whose next watcher cycle is due.
RECONCILE_BEAT_TICK_SECONDS = 1.0
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {
    "clusters-sync-due": {"task": tasknames.CLUSTERS_SYNC_DUE, "schedule": 2.0},
    "clusters-reconcile-due": {
        "task": tasknames.CLUSTERS_RECONCILE_DUE,
        "schedule": RECONCILE_BEAT_TICK_SECONDS,
    },
    "drill-policies": {
        "task": tasknames.DRILL_POLICIES_APPLY,
        "schedule": float(envint("GANTRY_DRILL_POLICY_INTERVAL", 30, minimum=1)),
    },
    # Scaling studies: submit a study's next point once its previous one ended.
    "studies-advance": {"task": tasknames.STUDIES_ADVANCE, "schedule": 2.0},
    # GPU and node health: collect the probe files of each cluster whose turn has come
    # (health.HealthSource.interval_seconds; this is only how often beat looks).
    "health-collect": {"task": tasknames.HEALTH_COLLECT, "schedule": 5.0},
    # Notifications: turn new job/drill/node events and breaches into deliveries.
    "notifications-collect": {
        "task": tasknames.NOTIFICATIONS_COLLECT,
        "schedule": float(envint("GANTRY_NOTIFY_INTERVAL", 10, minimum=1)),
    },
    # Metric retention: roll old steps of long jobs up into buckets (jobs.metric_retention).
    "metrics-rollup": {
        "task": tasknames.METRICS_ROLLUP,
        "schedule": float(envint("GANTRY_METRICS_ROLLUP_INTERVAL", 600, minimum=10)),
    },
}

# Cluster access. Private keys and known_hosts files live here, 0600, never in the database.
SSH_DIR = DATA_DIR / "ssh"
SSH_CONNECT_TIMEOUT = envint("GANTRY_SSH_CONNECT_TIMEOUT", 10, minimum=1)
SSH_COMMAND_TIMEOUT = envint("GANTRY_SSH_COMMAND_TIMEOUT", 60, minimum=1)
# The bytes of a remote command's stdout and stderr a process keeps (slurm.channel): a command
# or a login file that prints more fails with the reason, and the rest is never read, so one
# account's flood cannot exhaust a worker's or web process's memory.
SSH_MAX_OUTPUT_BYTES = envint("GANTRY_SSH_MAX_OUTPUT_BYTES", 16 << 20, minimum=64 << 10)
SSH_MAX_STDERR_BYTES = envint("GANTRY_SSH_MAX_STDERR_BYTES", 1 << 20, minimum=4 << 10)
# Per-user identities (nodes.access.identities): how long a certificate Gantry signs for a cluster
# account is valid, and the SSH connection pool of each worker process (one connection per
# identity in use, closed when idle; at most so many open to one login node).
SSH_CERTIFICATE_MINUTES = envint("GANTRY_SSH_CERT_MINUTES", 10, minimum=1, maximum=1440)
# Who reads the user CA's private key in this process (nodes.access.signer): "local" (the Celery
# workers, manage.py) signs with it; "signer" (the web processes: make run and the README's
# gunicorn line set it) never opens it and asks the signer queue for each certificate.
CA_KEY_ACCESS = envstr("GANTRY_CA_KEY_ACCESS", "local").strip().lower()
if CA_KEY_ACCESS not in ("local", "signer"):
    raise ImproperlyConfigured(
        f"GANTRY_CA_KEY_ACCESS={CA_KEY_ACCESS!r}: 'local' (workers) or 'signer' (web processes)."
    )
SSH_POOL_IDLE_TIMEOUT = envint("GANTRY_SSH_POOL_IDLE_TIMEOUT", 300, minimum=5)
SSH_POOL_MAX_PER_CLUSTER = envint("GANTRY_SSH_POOL_MAX_PER_CLUSTER", 8, minimum=1, maximum=1000)
SYNC_INTERVAL_SECONDS = envint("GANTRY_SYNC_INTERVAL", 30, minimum=2)
RECONCILE_INTERVAL_SECONDS = envint("GANTRY_RECONCILE_INTERVAL", 5, minimum=1)
# How often the watcher asks Slurm (squeue --start) when pending jobs may start.
PENDING_REFRESH_SECONDS = envint("GANTRY_PENDING_REFRESH", 30, minimum=5)
# While a drill is in flight (someone waits for its verdict): this often, no back-off. Below
# beat's tick, each cycle enqueues the next itself (watcher.tasks).
RECONCILE_FAST_INTERVAL_SECONDS = envfloat(
    "GANTRY_RECONCILE_FAST_INTERVAL", 0.5, minimum=0.2, maximum=60
)
# The overview (and its live part, polled every 5 s) shows a snapshot of the fleet at most
# this old: everyone with the same view of the fleet (the operators; each researcher alone)
# shares one computation per period, however many tabs poll. 0: computed on every request.
OVERVIEW_SNAPSHOT_SECONDS = envint("GANTRY_OVERVIEW_SNAPSHOT_SECONDS", 5, minimum=0, maximum=60)
SUBMIT_LEASE_SECONDS = envint("GANTRY_SUBMIT_LEASE", 120, minimum=5)
SUBMIT_REQUEUE_AFTER_SECONDS = envint("GANTRY_SUBMIT_REQUEUE_AFTER", 60, minimum=5)
JOB_LOST_AFTER_SECONDS = envint("GANTRY_JOB_LOST_AFTER", 600, minimum=30)
# An sbatch whose answer never came back may still land: Slurm's own submit retries can
# take about 4-5 minutes (sbatch retries "temporarily unable to accept job" 15 times,
# sleeping 1..15 s, each try waiting MessageTimeout). Absence is proven only after this.
SUBMIT_UNKNOWN_GRACE_SECONDS = envint("GANTRY_SUBMIT_UNKNOWN_GRACE", 330, minimum=1)
# How long after an sbatch the watcher still looks for extra Slurm jobs carrying its tag.
DUPLICATE_WATCH_SECONDS = envint("GANTRY_DUPLICATE_WATCH", 900, minimum=60)
DRILL_DEFAULT_STEPS = envint("GANTRY_DRILL_DEFAULT_STEPS", 5, minimum=1, maximum=10000)
# A drill replays to the original run's next checkpoint when it is at most this far.
DRILL_MAX_REPLAY_STEPS = envint("GANTRY_DRILL_MAX_REPLAY_STEPS", 500, minimum=1, maximum=100000)
DRILL_SUBMIT_RETRIES = envint("GANTRY_DRILL_SUBMIT_RETRIES", 6, minimum=0, maximum=50)
# Metric retention (jobs.metric_retention): a job keeps its newest this many logged steps at
# full resolution, and a job with no more than this many is never rolled up; older steps go
# into roll-ups of this many steps. A power of two: the job page chart's buckets are powers
# of two, so each holds whole roll-ups and its figures stay those of the raw points.
METRICS_FULL_RESOLUTION_STEPS = envint(
    "GANTRY_METRICS_FULL_RESOLUTION_STEPS", 20000, minimum=100, maximum=10**8
)
METRICS_ROLLUP_BUCKET = envint("GANTRY_METRICS_ROLLUP_BUCKET", 128, minimum=2, maximum=65536)
if METRICS_ROLLUP_BUCKET & (METRICS_ROLLUP_BUCKET - 1):
    raise ImproperlyConfigured(
        f"GANTRY_METRICS_ROLLUP_BUCKET={METRICS_ROLLUP_BUCKET} is not a power of two."
    )

# Caches. Login throttling counts failures in Redis, shared by every web worker.
# A Redis failure the default cache ignored is logged (a warning, with the error).
DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS = True

CACHES = {
    # Sessions' copies (core.sessions) and anything else on Django's default cache.
    # Fail-soft: with Redis down or slow (short timeouts) a read is a miss.
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "gantry-cache",
        "TIMEOUT": 300,
        "OPTIONS": {
            "IGNORE_EXCEPTIONS": True,
            "SOCKET_CONNECT_TIMEOUT": 0.25,
            "SOCKET_TIMEOUT": 0.25,
        },
    },
    # What pages, the API and /metrics compute and reuse (job metrics series, goodput
    # figures, placement verdicts, rendered API pages, the overview): core.cache, which names
    # every key and lifetime. Every key names what its value was computed from, so nothing
    # is ever invalidated, and the gunicorn workers share one copy in Redis. Errors are not
    # ignored here: core.cache turns them into misses, logs the first, and leaves Redis
    # alone for a few seconds, so an outage costs no socket timeout per read.
    "computed": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "gantry-cache",
        "TIMEOUT": 300,
        "OPTIONS": {"socket_connect_timeout": 0.25, "socket_timeout": 0.25},
    },
    "ratelimit": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL},
    # Watcher and SSH timings, written by the Celery workers and read by /metrics in the
    # web process (see console.exporter). Short timeouts: Redis being down must not
    # stall a watcher cycle or a scrape.
    "worker_stats": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "gantry-worker-stats",
        "TIMEOUT": None,
        "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
    },
}
LOGIN_MAX_FAILURES = envint("GANTRY_LOGIN_MAX_FAILURES", 5, minimum=1)
LOGIN_FAILURE_WINDOW = envint("GANTRY_LOGIN_FAILURE_WINDOW", 300, minimum=10)
TOKEN_MAX_FAILURES = envint("GANTRY_TOKEN_MAX_FAILURES", 30, minimum=1)
# The reverse proxies in front of Gantry (CIDR networks). Only a request whose direct peer
# is one of them has its client address taken from X-Forwarded-For (core.ratelimit); behind
# a proxy left out of this list, every client shares the proxy's address and its throttles.
TRUSTED_PROXIES = envproxies("GANTRY_TRUSTED_PROXIES")

# Prometheus metrics at /metrics: refused unless the scraper sends this bearer token or
# comes from one of these addresses (REMOTE_ADDR; behind a proxy that is the proxy's).
METRICS_TOKEN = envsecret("GANTRY_METRICS_TOKEN")
METRICS_ALLOW = envnetworks("GANTRY_METRICS_ALLOW")

# Notifications (the notifications app). Webhook URLs are user input: only public
# addresses, unless listed here (CIDR networks), e.g. an internal receiver.
WEBHOOK_ALLOW = envnetworks("GANTRY_WEBHOOK_ALLOW")
WEBHOOK_TIMEOUT_SECONDS = envint("GANTRY_WEBHOOK_TIMEOUT", 5, minimum=1, maximum=60)
# One POST in all (connect, send, the answer), however slowly an endpoint drips bytes; the
# deliver task's time limits and its send lease follow from it (notifications.delivery).
WEBHOOK_DEADLINE_SECONDS = envint(
    "GANTRY_WEBHOOK_DEADLINE",
    max(15, WEBHOOK_TIMEOUT_SECONDS),
    minimum=WEBHOOK_TIMEOUT_SECONDS,
    maximum=120,
)
NOTIFY_RETRY_BASE_SECONDS = envint("GANTRY_NOTIFY_RETRY_BASE", 30, minimum=1, maximum=3600)
NOTIFY_MAX_ATTEMPTS = envint("GANTRY_NOTIFY_MAX_ATTEMPTS", 8, minimum=1, maximum=50)
# Links in notifications: absolute when set (https://gantry.example.org), else paths.
GANTRY_BASE_URL = envstr("GANTRY_BASE_URL", "").rstrip("/")
# Email: SMTP when GANTRY_EMAIL_HOST is set; the console (the web or worker log) in
# development; off otherwise (email subscriptions are refused).
EMAIL_HOST = envstr("GANTRY_EMAIL_HOST", "")
if EMAIL_HOST:
    EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
elif DEBUG:
    EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
else:
    EMAIL_BACKEND = "django.core.mail.backends.dummy.EmailBackend"
EMAIL_PORT = envint("GANTRY_EMAIL_PORT", 587, minimum=1, maximum=65535)
EMAIL_HOST_USER = envstr("GANTRY_EMAIL_USER", "")
EMAIL_HOST_PASSWORD = envsecret("GANTRY_EMAIL_PASSWORD") or ""
EMAIL_USE_TLS = envbool("GANTRY_EMAIL_TLS", True)
EMAIL_TIMEOUT = envint("GANTRY_EMAIL_TIMEOUT", 10, minimum=1, maximum=120)
DEFAULT_FROM_EMAIL = envstr("GANTRY_EMAIL_FROM", "gantry@localhost")

# REST API.
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # Token first: an unauthenticated call then gets 401 with WWW-Authenticate.
        "core.ratelimit.ThrottledTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "core.api.CursorPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "core.schema.AutoSchema",
    "EXCEPTION_HANDLER": "core.errors.api_exception_handler",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_THROTTLE_RATES": {"login": "10/min"},
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Gantry API",
    "DESCRIPTION": (
        "Clusters, nodes, jobs, job templates, checkpoints and restore drills. "
        'Every error has the shape {"message": str, "extra": object}.\n\n'
        "**Authentication.** Send `Authorization: Token <secret>` with a personal API token, "
        "made, listed and revoked at `/account/tokens/` (a name and an optional expiry of at "
        "most 365 days; the secret is shown once and only its SHA-256 is kept); a key an "
        "operator made in the admin before these tokens existed still works, listed there "
        "as a legacy token. A browser session works too. A revoked, expired or "
        "unknown token gets `401` (`Token revoked.`, `Token expired.`, `Invalid token.`); "
        "many bad tokens from one address get `429`.\n\n"
        "Calls that act on a cluster (submit, cancel, hold, release, drills) answer `202` "
        "with the id and a `poll` URL; lists that grow are cursor-paginated. A job's whole "
        "output is at `GET /api/v1/jobs/{id}/output/` (HTTP range requests)."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "JobStateEnum": "jobs.models.Job.State",
        "NodeStateEnum": "nodes.models.Node.State",
        "GpuStateEnum": "nodes.models.Gpu.State",
        "DrillStateEnum": "drills.models.RestoreDrill.State",
        "DrillVerdictEnum": "drills.models.RestoreDrill.Verdict",
        "DrillTriggerEnum": "drills.models.RestoreDrill.Trigger",
        "CheckpointIntegrityEnum": "jobs.models.Checkpoint.Integrity",
        "SyncStatusEnum": "nodes.models.Cluster.SyncStatus",
        "AcceptanceTierEnum": "acceptance.models.Tier",
        "AcceptanceVerdictEnum": "acceptance.models.Verdict",
        "AcceptanceRunStateEnum": "acceptance.models.AcceptanceRun.State",
    },
}

# A quiet console (make run sets it): what changes and what fails, not every periodic
# task's lines (controlplane.logfilters); the Celery worker and beat log through this too.
QUIET_LOGS = envbool("GANTRY_QUIET_LOGS", False)
LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "filters": {"quiet": {"()": "controlplane.logfilters.QuietPeriodic"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["quiet"] if QUIET_LOGS else [],
        }
    },
    "root": {"handlers": ["console"], "level": envstr("GANTRY_LOG_LEVEL", "INFO")},
    "loggers": {
        "paramiko": {"level": "WARNING"},
        "django.db.backends": {"level": "INFO"},
        # Django's own request log otherwise bypasses the console handler and its filter.
        **(
            {"django.server": {"handlers": ["console"], "level": "INFO", "propagate": False}}
            if QUIET_LOGS
            else {}
        ),
    },
}
