"""The real dev cluster (scripts/devcluster): daemons, SSH, Slurm, accounting, torch."""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from pathlib import Path

import paramiko
import pytest

from devcluster_support import DevCluster, run_script, wait_for

pytestmark = pytest.mark.integration

DAEMONS = [
    "munged",
    "mariadb",
    "slurmdbd",
    "slurmctld",
    "slurmd-n1",
    "slurmd-n2",
    "slurmd-n3",
    "slurmd-n4",
    "sshd",
]
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"}


def _proc_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _ssh(cluster: DevCluster, client: paramiko.SSHClient, cmd: str, timeout: float = 30):
    _, stdout, stderr = client.exec_command(cmd, timeout=timeout)
    out = stdout.read().decode()
    err = stderr.read().decode()
    rc = stdout.channel.recv_exit_status()
    return rc, out, err


@pytest.fixture()
def ssh(devcluster: DevCluster):
    client = devcluster.ssh_client()
    yield client
    client.close()


def _sacct_job(ssh: paramiko.SSHClient, cluster: DevCluster, job_id: str) -> dict | None:
    rc, out, err = _ssh(cluster, ssh, f"sacct -j {job_id} --json")
    assert rc == 0, err
    for job in json.loads(out)["jobs"]:
        if str(job["job_id"]) == job_id and job["state"]["current"] in FINAL_STATES:
            return job
    return None


@pytest.mark.nodes(0)
def test_status_reports_all_up(devcluster: DevCluster) -> None:
    proc = devcluster.status()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in DAEMONS:
        assert re.search(rf"^{name}\s+\d+\s+running$", proc.stdout, re.M), proc.stdout
    assert set(devcluster.pids()) == set(DAEMONS)
    assert all(_proc_alive(pid) for pid in devcluster.pids().values())


@pytest.mark.nodes(0)
def test_second_up_is_idempotent_and_fast(devcluster: DevCluster) -> None:
    before = devcluster.pids()
    env_before = (devcluster.dir / "gantry.env").read_text()
    t0 = time.monotonic()
    out = run_script("up", dir=devcluster.dir).stdout
    elapsed = time.monotonic() - t0
    assert "already up" in out
    assert "started" not in out.replace("nothing started", "")
    assert devcluster.pids() == before
    assert (devcluster.dir / "gantry.env").read_text() == env_before
    assert elapsed < 10, f"a second 'up' took {elapsed:.1f}s"


@pytest.mark.nodes(0)
def test_env_file_describes_the_cluster(devcluster: DevCluster) -> None:
    assert devcluster.name == "devcluster"
    assert (devcluster.host, devcluster.port, devcluster.user) == ("127.0.0.1", 2222, "gantry")
    assert devcluster.key.is_file() and (devcluster.key.stat().st_mode & 0o077) == 0
    assert devcluster.known_hosts.read_text().startswith("[127.0.0.1]:2222 ssh-ed25519 ")
    assert devcluster.host_fingerprint.startswith("SHA256:")
    assert devcluster.default_partition == "batch"
    assert Path(devcluster.slurm_conf).is_file()
    assert Path(devcluster.workdir).is_dir()


@pytest.mark.nodes(0)
def test_ssh_login_and_sinfo(devcluster: DevCluster, ssh: paramiko.SSHClient) -> None:
    # the server's key is the one the env file's fingerprint names
    transport = ssh.get_transport()
    assert transport is not None
    key = transport.get_remote_server_key()
    assert key.fingerprint == devcluster.host_fingerprint
    rc, out, err = _ssh(devcluster, ssh, "id -un; echo $SLURM_CONF; sinfo -h -N -o '%N|%P|%G|%T'")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == "gantry"
    assert lines[1] == devcluster.slurm_conf
    nodes = {tuple(line.split("|")[:3]) for line in lines[2:]}
    assert nodes == {
        ("n1", "batch*", "gpu:a100:2"),
        ("n2", "batch*", "gpu:a100:2"),
        ("n3", "gpu", "gpu:h100:2"),
        ("n4", "gpu", "gpu:h100:2"),
    }


@pytest.mark.nodes(0)
def test_ssh_rejects_unknown_host_key(devcluster: DevCluster, tmp_path: Path) -> None:
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.RejectPolicy())  # empty known_hosts
    with pytest.raises(paramiko.SSHException):
        client.connect(
            devcluster.host,
            port=devcluster.port,
            username=devcluster.user,
            key_filename=str(devcluster.key),
            look_for_keys=False,
            allow_agent=False,
            timeout=10,
        )
    client.close()


@pytest.mark.nodes(0)
def test_topology(devcluster: DevCluster, ssh: paramiko.SSHClient) -> None:
    rc, out, err = _ssh(devcluster, ssh, "scontrol show topology")
    assert rc == 0, err
    assert re.search(r"SwitchName=leaf1 .*Nodes=n\[1-2\]", out)
    assert re.search(r"SwitchName=leaf2 .*Nodes=n\[3-4\]", out)
    assert re.search(r"SwitchName=spine .*Switches=leaf\[1-2\]", out)


@pytest.mark.nodes(2, "batch")
def test_two_node_gpu_job_is_accounted(devcluster: DevCluster, ssh: paramiko.SSHClient) -> None:
    rc, out, err = _ssh(
        devcluster,
        ssh,
        "cd ~ && sbatch --parsable --nodes=2 --ntasks-per-node=1 --gpus-per-node=1 -t 2 "
        "-J devcluster-test-2n --output=/dev/null "
        "--wrap 'srun bash -c \"echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES\"'",
    )
    assert rc == 0, err
    job_id = out.strip().split(";")[0]
    assert job_id.isdigit(), out
    job = wait_for(
        lambda: _sacct_job(ssh, devcluster, job_id),
        timeout=60,
        message=f"job {job_id} final in sacct",
    )
    assert job["state"]["current"] == "COMPLETED", job["state"]
    # sacct may show the final state for a few seconds with only the batch host
    # as node list ("n1") before the job's start record lands: poll for it
    job = wait_for(
        lambda: (j := _sacct_job(ssh, devcluster, job_id)) and j["nodes"] == "n[1-2]" and j,
        timeout=30,
        message=f"job {job_id} node list n[1-2] in sacct",
    )
    tres = {(t["type"], t["name"]): t["count"] for t in job["tres"]["allocated"]}
    assert tres.get(("gres", "gpu")) == 2, tres
    assert tres.get(("node", None)) == 2, tres


ALLREDUCE = r"""
import os, sys
import torch
import torch.distributed as dist

rank = int(os.environ["SLURM_PROCID"])
world = int(os.environ["SLURM_NTASKS"])
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['PORT']}",
                        rank=rank, world_size=world)
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
dist.barrier()
print(f"ALLREDUCE rank={rank} world={world} node={os.environ['SLURMD_NODENAME']} "
      f"sum={t.item()}", flush=True)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # skip interpreter teardown (a rare abort at shutdown, DEVCLUSTER.md #14)
"""


@pytest.mark.nodes(2, "batch")
def test_torch_gloo_allreduce_on_two_nodes(devcluster: DevCluster, ssh: paramiko.SSHClient) -> None:
    if not devcluster.python_ready:
        pytest.skip(
            f"job Python not built ({devcluster.python}); run 'scripts/devcluster up' "
            "without --no-python"
        )
    rundir = f"{devcluster.workdir}/tests/allreduce-{os.getpid()}-{time.time_ns()}"
    sftp = ssh.open_sftp()
    _ssh(devcluster, ssh, f"mkdir -p {shlex.quote(rundir)}")
    with sftp.open(f"{rundir}/allreduce.py", "w") as f:
        f.write(ALLREDUCE)
    sftp.close()
    port = 20000 + (time.time_ns() // 1000) % 20000
    rc, out, err = _ssh(
        devcluster,
        ssh,
        f"cd {shlex.quote(rundir)} && PORT={port} sbatch --parsable --nodes=2 "
        f"--ntasks-per-node=1 -t 2 -J devcluster-test-ddp --output=out.txt "
        f"--wrap 'srun --export=ALL {devcluster.python} allreduce.py'",
    )
    assert rc == 0, err
    job_id = out.strip().split(";")[0]
    job = wait_for(
        lambda: _sacct_job(ssh, devcluster, job_id),
        timeout=80,
        message=f"job {job_id} final in sacct",
    )
    _, output, _ = _ssh(devcluster, ssh, f"cat {shlex.quote(rundir)}/out.txt")
    assert job["state"]["current"] == "COMPLETED", output
    lines = sorted(line for line in output.splitlines() if line.startswith("ALLREDUCE"))
    assert len(lines) == 2, output
    assert "rank=0 world=2" in lines[0] and "sum=3.0" in lines[0]
    assert "rank=1 world=2" in lines[1] and "sum=3.0" in lines[1]
    assert {line.split("node=")[1].split()[0] for line in lines} == {"n1", "n2"}


@pytest.mark.exclusive
def test_sshd_stop_start(devcluster: DevCluster) -> None:
    devcluster.sshd_stop()
    try:
        assert "sshd" not in devcluster.pids()
        with pytest.raises((OSError, paramiko.SSHException)):
            devcluster.ssh_client(timeout=3).close()
    finally:
        devcluster.sshd_start()
    client = devcluster.ssh_client()
    client.close()


@pytest.mark.exclusive
def test_down_up_cycle_leaves_no_strays(devcluster: DevCluster) -> None:
    before = devcluster.pids()
    assert set(before) == set(DAEMONS)
    t0 = time.monotonic()
    run_script("down", dir=devcluster.dir, timeout=120)
    down_s = time.monotonic() - t0
    stray = {name: pid for name, pid in before.items() if _proc_alive(pid)}
    assert not stray, f"still running after down: {stray}"
    assert devcluster.pids() == {}
    # no daemon of ours left, whatever its pid
    leftovers = []
    daemons = {"munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd", "sshd"}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            # Debian's slurm binaries are alternatives: /usr/sbin/slurmd-wlm
            exe = os.path.basename(os.readlink(proc / "exe")).removesuffix("-wlm")
            if exe not in daemons:
                continue
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (proc / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if exe == "sshd":
            # the listener; per-connection session processes may outlive it
            ours = f"-f {devcluster.dir}/ssh/sshd_config" in cmdline
        else:
            ours = str(devcluster.dir) in cmdline or f"={devcluster.dir}/" in environ
        if ours:
            leftovers.append((proc.name, cmdline))
    assert not leftovers, leftovers
    status = devcluster.status()
    assert status.returncode == 3
    t0 = time.monotonic()
    run_script("up", dir=devcluster.dir, timeout=300)
    up_s = time.monotonic() - t0
    after = devcluster.pids()
    assert set(after) == set(DAEMONS)
    assert all(_proc_alive(pid) for pid in after.values())
    assert devcluster.status().returncode == 0
    out = devcluster.slurm(["sinfo", "-h", "-N", "-o", "%N %T"]).stdout
    states = dict(line.split() for line in out.splitlines())
    assert sorted(states) == ["n1", "n2", "n3", "n4"], out
    assert set(states.values()) <= {"idle", "mixed", "allocated", "completing"}, out
    print(f"down {down_s:.1f}s, up {up_s:.1f}s")
    assert up_s < 30, f"bring-up took {up_s:.1f}s"


@pytest.mark.exclusive
def test_stale_pid_files_are_handled(devcluster: DevCluster) -> None:
    """A pid file naming a process that is not ours must not be taken for a daemon."""
    run = devcluster.dir / "run"
    real_pid = (run / "sshd.pid").read_text()
    # pretend sshd's pid file names this test process: the start time will not match
    (run / "sshd.pid").write_text(f"{os.getpid()}\n")
    try:
        status = devcluster.status()
        assert status.returncode == 3
        assert "stale" in status.stdout
    finally:
        (run / "sshd.pid").write_text(real_pid)
    assert devcluster.status().returncode == 0
