.PHONY: run test faults lint format devcluster-up devcluster-down

# Set up (venv, dependencies, Redis, the dev cluster, database, admin user) and run
# the web UI, a Celery worker and beat in the foreground. Ctrl-C stops all of them.
run:
	scripts/run

# Set up and run every check: ruff, mypy, import contracts, pytest on SQLite and PostgreSQL.
test:
	scripts/test

# The fault-injection and security suite at full length (30 worker-kill trials).
faults:
	scripts/faults

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy && .venv/bin/lint-imports

format:
	.venv/bin/ruff format . && .venv/bin/ruff check --fix .

devcluster-up:
	scripts/devcluster up

devcluster-down:
	scripts/devcluster down
