"""The servers under test for the web bench: gunicorn (sync workers, production settings,
DEBUG off) for one source tree, behind nginx as in production, and the baseline commit's
tree exported with ``git archive``."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

import _benchlib as lib

# The page cache of the servers under test (a database of its own, emptied for each tree).
REDIS_URL = "redis://127.0.0.1:6379/12"


def server_env(tree: Path, *, database_url: str, secret_key: str) -> dict[str, str]:
    """Production settings for ``tree`` on the bench database; the parent's key, so the
    session cookies it made verify."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DJANGO_SETTINGS_MODULE", "GANTRY_TEST_RUN_ID")
    }
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
            "DEBUG": "false",
            "SECRET_KEY": secret_key,
            "ALLOWED_HOSTS": "127.0.0.1",
            "GANTRY_TLS": "false",
            "DATABASE_URL": database_url,
            "GANTRY_DATA_DIR": str(lib.BENCH_DIR / "data"),
            "GANTRY_STATIC_ROOT": str(lib.BENCH_DIR / f"static-{tree.name}"),
            "REDIS_URL": REDIS_URL,
            "GANTRY_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(tree),
            "PGOPTIONS": "-c jit=off",
        }
    )
    return env


# In production gunicorn's sync workers sit behind a proxy that buffers each request
# (README: "behind a TLS proxy"): a sync worker reads a request only once it is all there.
# Without one, a client's idle keep-alive connection holds a worker until the client
# sends (wrk reconnects at once after each response, then thinks for 3 s on the open
# connection), and every client waits behind it. nginx plays that proxy here, for both
# trees alike; --no-proxy drives gunicorn directly.
NGINX_CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  upstream gantry {{ server 127.0.0.1:{upstream}; }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    keepalive_timeout 75s;
    keepalive_requests 1000000;
    location / {{
      proxy_pass http://gantry;
      proxy_http_version 1.0;
      proxy_set_header Host $http_host;
      proxy_buffer_size 16k;
      proxy_buffers 64 16k;
      proxy_max_temp_file_size 0;
      proxy_read_timeout 60s;
    }}
  }}
}}
"""


def collect_static(tree: Path, env: dict[str, str]) -> None:
    """The tree's static files where its production settings look (manifest storage)."""
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
        cwd=tree,
        env=env,
        check=True,
    )


class Server:
    """gunicorn (sync workers) for one tree, with nginx in front unless ``proxy`` is off;
    ``port`` is where clients connect."""

    def __init__(
        self,
        tree: Path,
        workers: int,
        env: dict[str, str],
        *,
        proxy: bool,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.tree, self.upstream = tree, lib.free_port()
        collect_static(tree, env)
        self.log = (lib.BENCH_DIR / f"gunicorn-{tree.name}.log").open("wb")
        gunicorn = str(Path(sys.executable).parent / "gunicorn")
        argv = [gunicorn, "controlplane.wsgi", "-w", str(workers)]
        argv += ["-b", f"127.0.0.1:{self.upstream}", "--timeout", "60", "--log-level", "warning"]
        argv += extra
        self.process = subprocess.Popen(
            argv,
            cwd=tree,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the workers go with the master
        )
        self.proxy: subprocess.Popen[bytes] | None = None
        self.port = self.upstream
        if proxy:
            self.port = lib.free_port()
            self.proxy = self._start_proxy()
        self._wait_until_up()

    def _wait_until_up(self) -> None:
        """Until the sign-in page answers 200 through ``port``; stops both and exits when
        either process ends or a minute passes first."""
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/accounts/login/", timeout=5
                ) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            stopped = self.process.poll() is not None or (
                self.proxy is not None and self.proxy.poll() is not None
            )
            if time.monotonic() > deadline or stopped:
                self.stop()
                raise SystemExit(f"gunicorn for {self.tree} did not come up; see {self.log.name}")
            time.sleep(0.3)

    def _start_proxy(self) -> subprocess.Popen[bytes]:
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        folder = Path(tempfile.mkdtemp(prefix="web-bench-nginx-"))
        # nginx's workers drop to an unprivileged user when started as root.
        folder.chmod(0o755)
        for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (folder / name).mkdir(mode=0o777)
            (folder / name).chmod(0o777)
        conf = folder / "nginx.conf"
        conf.write_text(NGINX_CONF.format(dir=folder, upstream=self.upstream, port=self.port))
        self.proxy_dir = folder
        return subprocess.Popen(
            [nginx, "-c", str(conf), "-p", str(folder)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self) -> None:
        for process in (self.proxy, self.process):
            if process is None or process.poll() is not None:
                continue
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if self.proxy is not None:
            shutil.rmtree(self.proxy_dir, ignore_errors=True)
        self.log.close()


def export_baseline(rev: str) -> Path:
    """Commit ``rev``'s tree under var/bench/ (kept: later runs reuse it)."""
    target = lib.BENCH_DIR / f"baseline-{rev}"
    if target.exists():
        return target
    tmp = Path(tempfile.mkdtemp(dir=lib.BENCH_DIR))
    archive = subprocess.run(
        ["git", "archive", rev], cwd=lib.REPO, check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tmp, filter="data")
    tmp.rename(target)
    return target
