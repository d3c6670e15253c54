.PHONY: run test unit faults drill-coverage lint format devcluster-up devcluster-down

# Set up (venv, dependencies, Redis, the dev cluster, database, admin user) and run
# the web UI, a Celery worker and beat in the foreground. Ctrl-C stops all of them.
run:
	scripts/run

# Set up and run every check: ruff, mypy, import contracts, pytest on SQLite and PostgreSQL.
test:
	scripts/test

# The fast loop: lint, types, import contracts and every test that needs no dev cluster,
# Redis, browser or multi-process trainer run (well under 2 minutes). Sets up the venv only.
unit:
	scripts/unit

# The fault-injection and security suite at full length (30 worker-kill trials).
faults:
	scripts/faults

# The corruption-coverage matrix on the dev cluster: every kind of damage x {same shape,
# another allocation}, and the false-alarm count over clean checkpoints (make test runs a
# slice). Prints the table and writes test-artifacts/drill-coverage.md.
drill-coverage:
	GANTRY_DRILL_COVERAGE=full scripts/test -s -q tests/integration/test_drill_coverage.py

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy && .venv/bin/lint-imports

format:
	.venv/bin/ruff format . && .venv/bin/ruff check --fix .

devcluster-up:
	scripts/devcluster up

devcluster-down:
	scripts/devcluster down
