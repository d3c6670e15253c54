"""Shell injection: hostile strings in every field that reaches the cluster never run.

Each payload embeds ``touch <canary>`` (``;``, ``$()``, backticks, newlines, quotes, NUL,
``&&``, ``|``). The canary is a file in /tmp, which the dev cluster shares with this host.
Every input must be refused with a 400 naming the field, or used literally; and the
canary must never exist. The fast tests use the API's own validation, the argv builders
and the transport's quoting, and run the rendered sbatch script in a local bash with
stand-ins for ``srun``/``scontrol``; the integration tests push what is accepted through
the real sshd and Slurm of the dev cluster.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from security_support import make_private_key_text

from slurm import commands as slurm_commands
from slurm.connect import SshConfig
from slurm.transport import SshTransport

PAYLOADS = (
    ";touch {canary}",
    "x; touch {canary}",
    "$(touch {canary})",
    "`touch {canary}`",
    "x\ntouch {canary}",
    "x\r\ntouch {canary}",
    "x'; touch {canary}; echo '",
    'x"; touch {canary}; echo "',
    "x\x00; touch {canary}",
    "x && touch {canary}",
    "x | touch {canary}",
    "${{IFS}}touch${{IFS}}{canary}",
)


@pytest.fixture
def canary(canary_dir: Path) -> Path:
    path = canary_dir / f"gantry-canary-{uuid.uuid4().hex}"
    yield path
    if path.exists():
        path.unlink()


def payloads(canary: Path) -> list[str]:
    return [template.format(canary=canary) for template in PAYLOADS]


def _record(figures: Any, field: str, payload: str, outcome: str) -> None:
    figures.add("injection.cases")
    figures.member("injection.fields", field)
    figures.member("injection.payloads", payload.split("gantry-canary-")[0])
    figures.add(f"injection.{outcome}")


def _assert_no_canary(canary: Path, figures: Any) -> None:
    if canary.exists():
        figures.add("injection.canary_hits")
    assert not canary.exists(), f"an injected command ran: {canary} exists"


# ---------------------------------------------------------------- transport and argv


def test_transport_joins_argv_with_shlex(canary: Path, security_figures: Any) -> None:
    """``exec`` hands the remote shell ``shlex.join(argv)``: each element one quoted word."""
    transport = SshTransport(
        SshConfig(host="127.0.0.1", port=1, user="nobody", key_path="/x", known_hosts_path="/x")
    )
    sent: list[str] = []

    def fake_run(command: str, argv: list[str], **kwargs: Any) -> Any:
        sent.append(command)
        return None

    transport._run = fake_run  # type: ignore[method-assign]
    for payload in payloads(canary):
        argv = ["scontrol", "update", f"Reason={payload}", payload]
        if "\x00" in payload:
            # A NUL cannot travel in an SSH exec request: refused before anything is sent.
            with pytest.raises(ValueError, match="NUL"):
                transport.exec(argv)
            _record(security_figures, "transport argv", payload, "refused")
            continue
        transport.exec(argv)
        assert sent[-1] == shlex.join(argv)
        assert shlex.split(sent[-1]) == argv
        _record(security_figures, "transport argv", payload, "literal")
    _assert_no_canary(canary, security_figures)


def test_argv_builders_refuse_hostile_identifiers(canary: Path, security_figures: Any) -> None:
    checks = {
        "node name": slurm_commands.check_node_name,
        "partition": slurm_commands.check_partition,
        "node list": slurm_commands.check_hostlist,
        "job id": slurm_commands.check_job_id,
        "tag": slurm_commands.check_tag,
    }
    for what, check in checks.items():
        for payload in payloads(canary):
            with pytest.raises(ValueError):
                check(payload)
            _record(security_figures, f"argv builder {what}", payload, "refused")


def test_drain_reason_is_one_argument_or_refused(canary: Path, security_figures: Any) -> None:
    for payload in payloads(canary):
        if any(ord(char) < 32 for char in payload):
            with pytest.raises(ValueError, match="control characters"):
                slurm_commands.node_update("n1", "drain", payload)
            _record(security_figures, "argv builder reason", payload, "refused")
        else:
            argv = slurm_commands.node_update("n1", "drain", payload)
            assert f"Reason={payload}" in argv
            _record(security_figures, "argv builder reason", payload, "literal")


# ---------------------------------------------------------------- the job API


def _job_body(field: str, payload: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "inject",
        "partition": "batch",
        "nodes": 1,
        "time_limit_minutes": 5,
        "config": {"preset": "tiny", "steps": 5},
    }
    if field.startswith("config.data."):
        body["config"]["data"] = {field.removeprefix("config.data."): payload}
    elif field.startswith("config."):
        body["config"][field.removeprefix("config.")] = payload
    elif field == "config key":
        body["config"][payload] = 1
    else:
        body[field] = payload
    return body


JOB_FIELDS = (
    "name",
    "cluster",
    "partition",
    "gpu_type",
    "nodelist",
    "switches",
    "config.preset",
    "config.precision",
    "config.device",
    "config.data.kind",
    "config key",
)


def _run_script_locally(script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run the sbatch script in bash with stand-ins for the Slurm commands: whatever the
    shell would do with our values on a compute node, it does here."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("srun", "scontrol"):
        stub = bin_dir / name
        stub.write_text('#!/bin/sh\necho stub "$@"\n')
        stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "n1",
        "HOME": str(tmp_path),
    }
    return subprocess.run(
        ["bash", str(path)], env=env, capture_output=True, text=True, timeout=20, check=False
    )


def test_job_fields_refused_or_literal(
    world: dict[str, Any],
    persona_tokens: dict[str, Any],
    canary: Path,
    tmp_path: Path,
    security_figures: Any,
) -> None:
    """Preview (the exact script) for every field × payload: a 400 naming the field, or a
    script where the value is inert, proven by running it."""
    client = Client(HTTP_AUTHORIZATION=f"Token {persona_tokens['researcher']}")
    problems: list[str] = []
    for field in JOB_FIELDS:
        for payload in payloads(canary):
            response = client.post(
                "/api/v1/jobs/preview/",
                data=json.dumps(_job_body(field, payload)),
                content_type="application/json",
            )
            if response.status_code == 400:
                body = response.json()
                named = field.replace("config key", "config")
                fields = " ".join(body["extra"].get("fields", {}))
                if named.split(".")[0] not in fields and named not in body["message"]:
                    problems.append(f"{field} {payload!r}: 400 without the field: {body}")
                _record(security_figures, field, payload, "refused")
                continue
            if response.status_code != 200:
                problems.append(f"{field} {payload!r}: {response.status_code} {response.content!r}")
                continue
            script = response.json()["script"]
            lines_with_value = [line for line in script.splitlines() if "touch" in line]
            if field == "name":
                # Only the comment line carries the name (newlines are refused earlier).
                assert all(line.startswith("# Gantry job ") for line in lines_with_value), script
            result = _run_script_locally(script, tmp_path)
            assert result.returncode == 0, result.stderr
            _assert_no_canary(canary, security_figures)
            _record(security_figures, field, payload, "literal")
    assert not problems, "\n".join(problems)
    _assert_no_canary(canary, security_figures)


REGISTRATION_FIELDS = ("name", "ssh_user", "workdir", "python", "ssh_host")


def test_cluster_registration_fields_refused(
    world: dict[str, Any],
    persona_tokens: dict[str, Any],
    canary: Path,
    security_figures: Any,
) -> None:
    """Names, users and paths that a remote shell or ``sbatch`` line would read are
    refused with the field named, before Gantry connects anywhere."""
    client = Client(HTTP_AUTHORIZATION=f"Token {persona_tokens['operator']}")
    key = make_private_key_text()
    for field in REGISTRATION_FIELDS:
        for payload in payloads(canary):
            body = {
                "name": "hostile",
                "ssh_host": "127.0.0.1",
                "ssh_port": 2,
                "ssh_user": "gantry",
                "private_key": key,
                "workdir": "/srv/gantry",
                "python": "/usr/bin/python3",
                field: payload,
            }
            response = client.post(
                "/api/v1/clusters/register/", data=json.dumps(body), content_type="application/json"
            )
            assert response.status_code == 400, (field, payload, response.content)
            assert field in response.json()["extra"].get("fields", {}), response.json()
            _record(security_figures, f"register {field}", payload, "refused")
    _assert_no_canary(canary, security_figures)


def test_node_drain_reason_through_the_api(
    world: dict[str, Any], persona_tokens: dict[str, Any], canary: Path, security_figures: Any
) -> None:
    """Control characters are refused (400, field ``reason``); everything else goes on to
    the cluster as one argument (here the cluster does not answer: 502/503)."""
    client = Client(HTTP_AUTHORIZATION=f"Token {persona_tokens['operator']}")
    for payload in payloads(canary):
        response = client.post(
            f"/api/v1/nodes/{world['node'].pk}/drain/",
            data=json.dumps({"reason": payload}),
            content_type="application/json",
        )
        if any(ord(char) < 32 for char in payload):
            assert response.status_code == 400, response.content
            assert "reason" in response.json()["extra"]["fields"]
            _record(security_figures, "drain reason", payload, "refused")
        else:
            assert response.status_code in {502, 503}, response.content
            _record(security_figures, "drain reason (API, unreachable cluster)", payload, "literal")
    _assert_no_canary(canary, security_figures)


# ---------------------------------------------------------------- the real dev cluster


@pytest.mark.exclusive
@pytest.mark.integration
def test_hostile_strings_reach_the_real_cluster_literally(
    dev_cluster_registered: Any,
    operator: Any,
    researcher: Any,
    canary: Path,
    security_figures: Any,
) -> None:
    """Through the real sshd and Slurm: echo, drain/resume with hostile reasons, and a
    job whose name is hostile, submitted with ``sbatch``."""
    from core.services import api_token_create
    from nodes.access.cluster import slurm_client_for, transport_for
    from nodes.models import Node

    def token_secret(user: Any) -> str:
        return api_token_create(user=user, name="injection tests", expires_at=None)[1]

    cluster = dev_cluster_registered
    transport = transport_for(cluster)
    problems: list[str] = []
    for payload in payloads(canary):
        if "\x00" in payload:
            # A NUL cannot travel in an SSH exec request: it must be refused, not cut.
            try:
                result = transport.exec(["printf", "%s", payload], check=False)
            except Exception as error:
                # Refused before or by the remote shell (an unbalanced quote): nothing ran.
                security_figures.note("injection NUL over ssh", f"refused: {type(error).__name__}")
                _record(security_figures, "ssh exec argv", payload, "refused")
            else:
                if result.stdout != payload:
                    problems.append(f"NUL payload not refused; remote saw {result.stdout!r}")
                _record(security_figures, "ssh exec argv", payload, "literal")
        else:
            result = transport.exec(["printf", "%s", payload])
            assert result.stdout == payload
            _record(security_figures, "ssh exec argv", payload, "literal")
        _assert_no_canary(canary, security_figures)

    operator_api = Client(HTTP_AUTHORIZATION=f"Token {token_secret(operator)}")
    node = Node.objects.filter(cluster=cluster).order_by("name").last()
    assert node is not None
    client = slurm_client_for(cluster)
    try:
        for payload in payloads(canary):
            if any(ord(char) < 32 for char in payload):
                continue
            response = operator_api.post(
                f"/api/v1/nodes/{node.pk}/drain/",
                data=json.dumps({"reason": payload}),
                content_type="application/json",
            )
            assert response.status_code == 200, response.content
            seen = client.node(node.name)
            assert seen is not None and seen.reason == f"{payload} [{operator.username}]"
            _record(security_figures, "drain reason (Slurm)", payload, "literal")
            _assert_no_canary(canary, security_figures)
    finally:
        operator_api.post(f"/api/v1/nodes/{node.pk}/resume/")

    researcher_api = Client(HTTP_AUTHORIZATION=f"Token {token_secret(researcher)}")
    # Job names hold at most 128 characters: two jobs cover the forms.
    for hostile_name in (f"$(touch {canary}) 'q\" x", f"`touch {canary}`;touch {canary}"):
        _submit_hostile_job(researcher_api, transport, cluster, hostile_name, security_figures)
    _assert_no_canary(canary, security_figures)
    assert not problems, "\n".join(problems)


def _submit_hostile_job(
    researcher_api: Client, transport: Any, cluster: Any, hostile_name: str, figures: Any
) -> None:
    from jobs.models import Job
    from jobs.services import job_submit_to_slurm

    response = researcher_api.post(
        "/api/v1/jobs/submit/",
        data=json.dumps(
            {
                "name": hostile_name,
                "partition": "batch",
                "nodes": 1,
                "time_limit_minutes": 2,
                "config": {"preset": "tiny", "steps": 3},
            }
        ),
        content_type="application/json",
    )
    assert response.status_code == 202, response.content
    job_id = response.json()["id"]
    try:
        outcome = job_submit_to_slurm(job_id=job_id)
        job = Job.objects.get(id=job_id)
        assert job.slurm_job_id, outcome
        assert job.name == hostile_name
        # Slurm knows the job by its tag only; the name is a comment in the script.
        queued = transport.exec(
            ["squeue", "--noheader", "--format=%j", f"--jobs={job.slurm_job_id}"], check=False
        ).stdout.strip()
        assert queued in ("", slurm_commands.job_tag(job_id)), queued
        # The run directory is the job's account's alone: read it as that account.
        from jobs.lifecycle import JOBS

        script = JOBS.transport_of(job).get_bytes(f"{JOBS.run_directory(job)}/job.sbatch").decode()
        name_lines = [line for line in script.splitlines() if hostile_name in line]
        assert name_lines == [f"# Gantry job {job_id}: {hostile_name}"], name_lines
        _record(figures, "job name (sbatch on the cluster)", hostile_name, "literal")
    finally:
        job = Job.objects.get(id=job_id)
        if job.slurm_job_id:
            transport.exec(["scancel", job.slurm_job_id], check=False)


def test_canary_detector_works(canary: Path) -> None:
    """The canary check itself: a real ``touch`` through the same path is seen."""
    subprocess.run(["sh", "-c", f"touch {shlex.quote(str(canary))}"], check=True)
    assert canary.exists()
    os.unlink(canary)


def test_register_api_refuses_an_overlong_host_label(
    world: dict[str, Any], persona_tokens: dict[str, Any]
) -> None:
    """Found by this suite: a 64-character label made the IDNA codec raise (a 500)."""
    client = Client(HTTP_AUTHORIZATION=f"Token {persona_tokens['operator']}")
    body = {
        "name": "longhost",
        "ssh_host": "a" * 64 + ".example.org",
        "ssh_user": "gantry",
        "private_key": make_private_key_text(),
        "workdir": "/srv/gantry",
        "python": "/usr/bin/python3",
    }
    response = client.post(
        "/api/v1/clusters/register/", data=json.dumps(body), content_type="application/json"
    )
    assert response.status_code == 400
    assert "ssh_host" in response.json()["extra"]["fields"]


def test_register_service_refuses_an_overlong_host_label(db: Any, isolated_ssh_dir: Path) -> None:
    from core.errors import FieldError
    from nodes.registration import cluster_register

    with pytest.raises(FieldError):
        cluster_register(
            actor=None,
            name="longhost",
            ssh_host="a" * 64 + ".example.org",
            ssh_port=2,
            ssh_user="gantry",
            private_key=make_private_key_text(),
            workdir="/srv/gantry",
            python="/usr/bin/python3",
            sync=False,
        )
