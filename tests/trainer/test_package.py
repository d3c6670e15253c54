import ast
import json
import shutil
import subprocess
import sys

from trainer_testlib import PY, REPO

import trainer
from trainer import dist

PKG = REPO / "trainer"


def test_version_and_digest(tmp_path):
    assert isinstance(trainer.__version__, str)
    d = trainer.source_digest()
    assert len(d) == 64 and d == trainer.source_digest()
    copy = tmp_path / "trainer"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__"))
    code = "import trainer; print(trainer.source_digest())"
    same = subprocess.run([PY, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert same.stdout.strip() == d
    (copy / "config.py").write_text((copy / "config.py").read_text() + "\n# changed\n")
    (copy / "SCHEMA.md").write_text("docs do not count")
    changed = subprocess.run([PY, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert changed.stdout.strip() not in ("", d)


def test_imports_only_torch_numpy_stdlib():
    allowed = set(sys.stdlib_module_names) | {"torch", "numpy", "trainer"}
    for f in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            for n in names:
                assert n.split(".")[0] in allowed, f"{f.name} imports {n}"
    assert (PKG / "__main__.py").exists() and (PKG / "SCHEMA.md").exists()


def test_describe(capsys):
    from trainer.cli import main

    assert main(["describe"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["versions"]["torch"].startswith("2.")
    assert d["versions"]["trainer_digest"] == trainer.source_digest()
    assert d["backend"] in ("gloo", "nccl") and d["devices"]


def _clean(monkeypatch):
    import os

    for k in list(os.environ):
        if k.startswith(("SLURM", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_")):
            monkeypatch.delenv(k)


def test_detect_single_torchrun_slurm(monkeypatch):
    _clean(monkeypatch)
    e = dist.detect()
    assert (e.source, e.rank, e.world_size, e.distributed) == ("single", 0, 1, False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    e = dist.detect()
    assert (e.source, e.rank, e.world_size, e.local_rank) == ("torchrun", 1, 2, 1)
    # Slurm wins over torchrun variables
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURMD_NODENAME", "node-b")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.5")
    monkeypatch.setenv("MASTER_PORT", "12345")
    e = dist.detect()
    assert (e.source, e.rank, e.world_size, e.local_rank, e.node) == ("slurm", 3, 4, 1, "node-b")
    assert (e.master_addr, e.master_port) == ("10.0.0.5", 12345)


def test_slurm_master_fallback_uses_scontrol(monkeypatch, tmp_path):
    _clean(monkeypatch)
    fake = tmp_path / "scontrol"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1 $2" = "show hostnames" ]; then echo node-a; echo node-b; exit 0; fi\n'
        'echo "NodeName=$3 Arch=x86_64 NodeAddr=172.20.0.11 NodeHostName=$3"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node-[a-b]")
    e = dist.detect()
    assert e.master_addr == "172.20.0.11"
    assert e.master_port == 20000 + 4242 % 10000
    assert e.job_id == "4242"
