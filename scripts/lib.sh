# Shared shell helpers for scripts/run, scripts/test and scripts/bootstrap. Sourced, not run.
# shellcheck shell=bash

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VAR="$REPO/var"
VENV="${GANTRY_VENV:-$REPO/.venv}"
mkdir -p "$VAR"

say() { printf '\033[1;34m==>\033[0m %s\n' "$*"; }
die() { printf 'gantry: %s\n' "$*" >&2; exit 1; }

_apt_updated=0
apt_install() {
  # Install the named Debian packages that are missing; apt-get update once, first.
  local missing=()
  local package
  for package in "$@"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || die "missing packages ${missing[*]}; run as root or install them first"
  say "installing ${missing[*]} (apt-get)"
  if [ "$_apt_updated" -eq 0 ]; then
    apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null || die "apt-get update failed"
    _apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    --no-install-recommends "${missing[@]}" >/dev/null || die "apt-get install ${missing[*]} failed"
}

python_for_venv() {
  local candidate
  for candidate in "${GANTRY_PYTHON:-}" python3.11 python3 /usr/bin/python3; do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      command -v "$candidate"
      return 0
    fi
  done
  die "Python 3.11 or newer is needed (Debian 12's python3 is fine)"
}

ensure_venv() {
  # Create the virtual environment and install the pinned dependencies when pyproject changes.
  local extras="${1:-dev,trainer}"
  local python
  python="$(python_for_venv)"
  if [ ! -x "$VENV/bin/python" ]; then
    if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
      apt_install python3-venv
    fi
    say "creating $VENV"
    "$python" -m venv "$VENV" || die "cannot create a venv with $python"
  fi
  local stamp="$VENV/.gantry-installed"
  local want
  want="$(cat "$REPO/pyproject.toml" | sha256sum | cut -c1-16)-$extras"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    say "installing Python dependencies ($extras)"
    "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$VENV/bin/python" -m pip install -q -e "$REPO[$extras]" || die "pip install failed"
    echo "$want" >"$stamp"
  fi
}

redis_answers() {
  "$VENV/bin/python" - "$1" <<'PY' 2>/dev/null
import sys, redis
redis.Redis.from_url(sys.argv[1], socket_connect_timeout=2).ping()
PY
}

ensure_redis() {
  # Use a Redis that answers; otherwise install one and start it on 127.0.0.1:6379.
  local url="${REDIS_URL:-redis://127.0.0.1:6379/0}"
  redis_answers "$url" && return 0
  case "$url" in
    redis://127.0.0.1:6379* | redis://localhost:6379*) ;;
    *) die "Redis at $url does not answer; start it or change REDIS_URL" ;;
  esac
  apt_install redis-server
  say "starting redis-server on 127.0.0.1:6379"
  mkdir -p "$VAR/redis"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir "$VAR/redis" --pidfile "$VAR/redis/redis.pid" --logfile "$VAR/redis/redis.log"
  local attempt
  for attempt in $(seq 1 50); do
    redis_answers "$url" && return 0
    sleep 0.1
  done
  die "redis-server did not answer on 127.0.0.1:6379 (see $VAR/redis/redis.log)"
}

postgres_answers() {
  "$VENV/bin/python" - "$1" <<'PY' 2>/dev/null
import sys, psycopg
psycopg.connect(sys.argv[1], connect_timeout=3).close()
PY
}

ensure_postgres() {
  # For the PostgreSQL test run: use the server that answers, or install and start one.
  local url="$1"
  postgres_answers "$url" && return 0
  apt_install postgresql
  local version
  version="$(ls /etc/postgresql | sort -V | tail -1)"
  say "starting PostgreSQL $version"
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  local attempt
  for attempt in $(seq 1 50); do
    postgres_answers "$url" && return 0
    sleep 0.2
  done
  # A fresh install allows only peer login; the test run connects over TCP as postgres.
  local hba="/etc/postgresql/$version/main/pg_hba.conf"
  if ! grep -q "gantry-test" "$hba"; then
    sed -i '1i host all all 127.0.0.1/32 trust # gantry-test' "$hba"
    pg_ctlcluster --skip-systemctl-redirect "$version" main reload || true
  fi
  for attempt in $(seq 1 50); do
    postgres_answers "$url" && return 0
    sleep 0.2
  done
  die "PostgreSQL at $url does not answer"
}
