"""How the batch script starts the ranks: nothing of the account's environment or home runs
before the trainer. Python starts isolated (``-I``: no PYTHON* variable, no user
site-packages, not the working directory on sys.path), every shell without BASH_ENV/ENV
start-up files or imported functions, and the trainer still runs with its arguments.

The second test runs the rendered script in a local bash with a stand-in ``srun`` and the
system Python, with a hook planted in each place an account controls: $BASH_ENV, a
usercustomize under $PYTHONUSERBASE, a sitecustomize on $PYTHONPATH, and a ``trainer.py``
in the run directory. None may run."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from runs.runtime import TRAINER_BOOTSTRAP, ScriptSpec, render_sbatch

SYSTEM_PYTHON = "/usr/bin/python3"


def _spec(tmp_path: Path, python: str = "/opt/py/bin/python") -> ScriptSpec:
    return ScriptSpec(
        job_id="j",
        job_name="isolated",
        run_dir=str(tmp_path / "run"),
        trainer_dir=str(tmp_path / "shipped"),
        python=python,
        partition="batch",
        nodes=1,
        tasks_per_node=1,
        cpus_per_task=1,
        gpus_per_node=0,
        gpu_type="",
        memory_mb=None,
        time_limit_minutes=5,
        nodelist="",
        switches="",
        trainer_args=("train", "--config", "c.json"),
        environment=(("NCCL_DEBUG", "INFO"),),
        rank_output=True,
    )


@pytest.mark.parametrize("rank_output", [True, False])
def test_the_script_starts_python_isolated_and_bash_without_start_up_hooks(
    tmp_path: Path, rank_output: bool
) -> None:
    script = render_sbatch(replace(_spec(tmp_path), rank_output=rank_output))
    lines = script.splitlines()
    # The batch shell itself: privileged mode reads neither $BASH_ENV nor $ENV.
    assert lines[0] == "#!/bin/bash -p"
    unset = lines.index("unset BASH_ENV ENV")
    srun = next(i for i, line in enumerate(lines) if line.startswith("srun "))
    assert unset < lines.index("export NCCL_DEBUG=INFO") < srun
    # No search path for Python is exported: the trainer's directory is an argument.
    assert "PYTHONPATH" not in script and "PYTHONUNBUFFERED" not in script
    python = (
        f"/opt/py/bin/python -I -u -c '{TRAINER_BOOTSTRAP}' {tmp_path}/shipped "
        "train --config c.json"
    )
    assert lines[srun].endswith(python), lines[srun]
    rank_shell = "/bin/bash --noprofile --norc -p -c "
    assert (rank_shell in lines[srun]) is rank_output
    assert " bash -c " not in script


def _plant_hooks(tmp_path: Path, canaries: Path) -> dict[str, str]:
    """A hook in each place an account controls; each writes its name into ``canaries``."""
    canaries.mkdir()

    def hook(name: str) -> str:
        return f"open({str(canaries / name)!r}, 'w').write('ran')\n"

    userbase = tmp_path / "userbase"
    found = subprocess.run(
        [SYSTEM_PYTHON, "-c", "import site; print(site.getusersitepackages())"],
        env={"PYTHONUSERBASE": str(userbase), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    user_site = Path(found.stdout.strip())
    user_site.mkdir(parents=True)
    (user_site / "usercustomize.py").write_text(hook("usercustomize"))
    on_path = tmp_path / "on-path"
    on_path.mkdir()
    (on_path / "sitecustomize.py").write_text(hook("sitecustomize"))
    bash_env = tmp_path / "bash_env.sh"
    bash_env.write_text(f"echo ran > {canaries / 'bash_env'}\n")
    # A module in the run directory (the working directory) named like the trainer.
    (tmp_path / "run" / "trainer.py").write_text(hook("run_directory_module"))
    return {
        "BASH_ENV": str(bash_env),
        "ENV": str(bash_env),
        "PYTHONUSERBASE": str(userbase),
        "PYTHONPATH": str(on_path),
        "PYTHONSTARTUP": str(bash_env),
        "HOME": str(tmp_path),
    }


def _stand_ins(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text('#!/bin/bash -p\nwhile [[ $1 == --* ]]; do shift; done\nexec "$@"\n')
    scontrol = bin_dir / "scontrol"
    scontrol.write_text("#!/bin/sh\necho n1\n")
    for tool in (srun, scontrol):
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return bin_dir


@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason="needs the system Python")
def test_no_hook_of_the_account_runs_before_the_trainer(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    # The shipped trainer, as far as this test cares: it records how it was started.
    package = tmp_path / "shipped" / "trainer"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(
        "import sys\n"
        f"open({str(tmp_path / 'trainer-ran')!r}, 'w').write("
        "' '.join(sys.argv[1:]) + f' isolated={sys.flags.isolated}')\n"
    )
    canaries = tmp_path / "canaries"
    hooks = _plant_hooks(tmp_path, canaries)
    bin_dir = _stand_ins(tmp_path)
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(_spec(tmp_path, python=SYSTEM_PYTHON)))
    script.chmod(0o755)
    # Run as Slurm does: the script executed (its #! line applies), in the run directory.
    done = subprocess.run(
        [str(script)],
        cwd=tmp_path / "run",
        env={
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "SLURM_JOB_ID": "99",
            "SLURM_JOB_NODELIST": "n1",
            "SLURM_PROCID": "0",
            **hooks,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in canaries.iterdir()) == [], done.stdout + done.stderr
    assert (tmp_path / "trainer-ran").read_text() == "train --config c.json isolated=1"
    shutil.rmtree(tmp_path / "userbase")
