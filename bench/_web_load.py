"""Load generation for the web bench: wrk driven by one Lua script (one client per wrk
thread, each on its own connection with its own state), and a plain Python client for the
unloaded figures (see ``one_client``)."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import _benchlib as lib

# One Lua script for every run. Each wrk thread has one connection and its own Lua state:
# thread i takes client i's requests (a cycle of paths with its headers) and think times.
LUA = r"""
local counter = 0
local think = tonumber(os.getenv("BENCH_THINK_MS") or "0")
local role = os.getenv("BENCH_ROLE")
local threads = {}

function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

function init(args)
  local plan = {}
  for line in io.lines(os.getenv("BENCH_PLAN")) do table.insert(plan, line) end
  -- a plan line: "0|1<TAB>cookie|token<TAB>path1<TAB>path2...": whether the client keeps
  -- ETags and revalidates (a browser's fetch does), its credentials, its cycle of paths
  local mine = plan[(id % #plan) + 1]
  local fields = {}
  for field in string.gmatch(mine, "[^\t]+") do table.insert(fields, field) end
  revalidate = fields[1] == "1"
  auth = fields[2]
  paths = {}
  for i = 3, #fields do table.insert(paths, fields[i]) end
  not_modified = 0
  step = 0
  headers = {}
  if string.sub(auth, 1, 6) == "Token " then
    headers["Authorization"] = auth
  else
    headers["Cookie"] = auth
  end
  -- The browser's cache: the ETag each path last came with (one connection per thread,
  -- so the response that comes back is always that of the path sent last).
  etags = {}
  sent = nil
  -- Clients do not all start polling at the same instant: each starts at its own phase
  -- within the think time (the same phases for every tree: seeded by the thread's id).
  math.randomseed(1000 + id)
  phase = think > 0 and math.random(0, think) or 0
  started = false
end

function request()
  step = step + 1
  local path = paths[((step - 1) % #paths) + 1]
  local sending = {}
  for name, value in pairs(headers) do sending[name] = value end
  if revalidate and etags[path] then sending["If-None-Match"] = etags[path] end
  sent = path
  return wrk.format("GET", path, sending)
end

function response(status, response_headers, body)
  if revalidate and sent then
    local etag = response_headers["ETag"] or response_headers["etag"]
    if etag and status == 200 then etags[sent] = etag end
    if status == 304 then not_modified = not_modified + 1 end
  end
end

function delay()
  if not started then
    started = true
    return phase
  end
  -- think time after the last request of the cycle (a page's poll is its requests at once)
  if think > 0 and step % #paths == 0 then return think end
  return 0
end

function done(summary, latency, requests)
  local revalidated = 0
  for _, thread in ipairs(threads) do
    revalidated = revalidated + (thread:get("not_modified") or 0)
  end
  local out = string.format(
    '{"role": "%s", "requests": %d, "not_modified": %d, "duration_us": %d, "p50_ms": %.2f, ' ..
    '"p95_ms": %.2f, ' ..
    '"p99_ms": %.2f, "mean_ms": %.2f, "max_ms": %.2f, "errors": {"connect": %d, ' ..
    '"read": %d, "write": %d, "status": %d, "timeout": %d}}',
    role, summary.requests, revalidated, summary.duration, latency:percentile(50) / 1000,
    latency:percentile(95) / 1000, latency:percentile(99) / 1000, latency.mean / 1000,
    latency.max / 1000, summary.errors.connect, summary.errors.read, summary.errors.write,
    summary.errors.status, summary.errors.timeout)
  local f = io.open(os.getenv("BENCH_OUT"), "w")
  f:write(out)
  f:close()
end
"""


def wrk(
    port: int,
    work: Path,
    role: str,
    plan: list[str],
    *,
    connections: int,
    seconds: float,
    think_ms: int = 0,
) -> subprocess.Popen[bytes]:
    script, plan_file, out = work / "bench.lua", work / f"{role}.plan", work / f"{role}.json"
    script.write_text(LUA)
    plan_file.write_text("\n".join(plan) + "\n")
    out.unlink(missing_ok=True)
    env = dict(
        os.environ,
        BENCH_PLAN=str(plan_file),
        BENCH_OUT=str(out),
        BENCH_ROLE=role,
        BENCH_THINK_MS=str(think_ms),
    )
    argv = [
        "wrk",
        f"-t{connections}",
        f"-c{connections}",
        f"-d{int(seconds)}s",
        "--timeout",
        "10s",
        "-s",
        str(script),
        f"http://127.0.0.1:{port}",
    ]
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def one_client(
    port: int, path: str, headers: dict[str, str], *, revalidates: bool, seconds: float
) -> dict[str, Any]:
    """One client on one kept-alive connection, a request as soon as the last answer is in
    (the unloaded figures), keeping the ETag like a browser when ``revalidates``.

    Timed here with a monotonic clock rather than by wrk: with one connection wrk's
    latencies on this VM added up to more than the run's length (a mean of 13 ms at 116
    requests/s), while this client's add up to its wall time; its own cost (a few tenths
    of a millisecond) is in every figure, for both trees alike."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    times: list[float] = []
    not_modified = errors = 0
    etag = None
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            sending = dict(headers)
            if etag and revalidates:
                sending["If-None-Match"] = etag
            started = time.monotonic()
            connection.request("GET", path, headers=sending)
            response = connection.getresponse()
            response.read()
            times.append((time.monotonic() - started) * 1000)
            if response.status == 304:
                not_modified += 1
            elif response.status == 200:
                etag = response.getheader("ETag") or etag
            else:
                errors += 1
    finally:
        connection.close()
    return {
        "requests": len(times),
        "not_modified": not_modified,
        "mean_ms": sum(times) / len(times),
        "p95_ms": lib.pct(times, 0.95),
        "error_count": errors,
    }


def wrk_result(proc: subprocess.Popen[bytes], work: Path, role: str) -> dict[str, Any]:
    _, err = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"wrk {role} failed: {err.decode()[-1000:]}")
    result = json.loads((work / f"{role}.json").read_text())
    result["rate"] = result["requests"] / (result["duration_us"] / 1e6)
    result["error_count"] = sum(result["errors"].values())
    return result
