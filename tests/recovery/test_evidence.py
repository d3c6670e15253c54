"""Which rank stopped and on which node (heartbeats, srun's error lines), loss spikes, and
the checkpoints trusted after a divergence. Node names of a shape the dev cluster does not
have; the listing's parser fed hostile lines."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from factories import CheckpointFactory
from jobs.models import Job, MetricPoint
from recovery.cycle import recovery_cycle
from recovery.detect import SPIKE_WINDOW, loss_spike
from recovery.evidence import STALE_BEAT_S, crash_suspects, hang_suspects
from recovery.models import Incident, RecoveryPolicy, SuspectNode
from recovery.resume import divergence_bound
from runs.rundir import Beat, RunDirectory, parse_listing

from .test_recovery import _checkpoint, _running_job


def _directory(**beats: int) -> RunDirectory:
    """Heartbeats by rank: ``r<rank>_<node>=<modified>``."""
    found = RunDirectory()
    for key, modified in beats.items():
        rank, node = key[1:].split("_", 1)
        node = node.replace("_", "-")
        found.beats[int(rank)] = Beat(rank=int(rank), node=node, step=300, modified=modified)
    return found


# ----------------------------------------------------------------------------- parser


def test_the_listing_keeps_srun_errors_and_beats_and_drops_what_does_not_parse() -> None:
    listing = "\n".join(
        [
            "D /w/users/u7/runs/j1",
            "E slurm-77.out srun: error: gpu-b-02: task 3: Killed",
            "E slurm-77.out srun: error: gpu-b-01: tasks 0-2: Terminated",
            "E slurm-77.out srun: error: $(reboot): task 1: Killed",  # not a node name
            "E notslurm.out srun: error: gpu-b-01: task 0: Killed",  # not an output file
            'R 1700000100 {"rank":3,"node":"gpu-b-02","pid":9,"step":40,"time":1}',
            'R 1700000130 {"rank":0,"node":"gpu-b-01","pid":8,"step":41,"time":1}',
            'R 1700000130 {"rank":0,"node":"gpu-b-09","pid":8,"step":41,"time":1}',  # dup
            'R 17000x {"rank":1,"node":"gpu-b-01","step":41}',  # bad time
            'R 1700000130 {"rank":-1,"node":"gpu-b-01","step":41}',  # bad rank
            'R 1700000130 {"rank":2,"node":"a b","step":41}',  # bad node
            "R 1700000130 [1, 2]",
        ]
    )
    directory = parse_listing(listing)["/w/users/u7/runs/j1"]
    assert directory.srun_errors == {
        "77": [("gpu-b-02", "3", "Killed"), ("gpu-b-01", "0-2", "Terminated")]
    }
    assert sorted(directory.beats) == [0, 3]
    assert directory.beats[0].node == "gpu-b-01" and directory.beats[3].modified == 1700000100


# --------------------------------------------------------------------------- suspects


def _job(**values: Any) -> Job:
    return Job(slurm_job_id="77", allocated_nodes="gpu-b-[01-04]", **values)


def test_a_stale_heartbeat_names_its_rank_and_node() -> None:
    directory = _directory(r0_gpu_b_01=1000, r1_gpu_b_02=1000, r2_gpu_b_03=950, r3_gpu_b_04=999)
    named = hang_suspects(_job(), directory)
    assert [node for node, _ in named] == ["gpu-b-03"]
    assert "rank 2" in named[0][1] and "50 s" in named[0][1]


@pytest.mark.parametrize(
    "beats",
    [
        # All fresh: every rank alive, waiting on something else (the network, a peer).
        {"r0_gpu_b_01": 1000, "r1_gpu_b_02": 1000 - STALE_BEAT_S},
        # All stale alike: the whole job stopped; nothing singles a node out.
        {"r0_gpu_b_01": 900, "r1_gpu_b_02": 900},
        # One rank alone: no peer to compare with.
        {"r0_gpu_b_01": 900},
        # A stale beat naming a node outside the allocation is not believed.
        {"r0_gpu_b_01": 1000, "r1_gpu_x_77": 900},
    ],
)
def test_no_suspect_without_a_peer_that_kept_beating(beats: dict[str, int]) -> None:
    assert hang_suspects(_job(), _directory(**beats)) == []


def test_no_directory_no_suspect() -> None:
    assert hang_suspects(_job(), None) == [] and crash_suspects(_job(), None) == []


def test_the_first_task_srun_reported_is_the_crash_suspect() -> None:
    directory = RunDirectory()
    directory.srun_errors["77"] = [
        ("gpu-x-99", "0", "Killed"),  # not the job's node: ignored
        ("gpu-b-03", "5", "Killed"),
        ("gpu-b-01", "0-4", "Killed"),
    ]
    directory.srun_errors["76"] = [("gpu-b-02", "1", "Killed")]  # another Slurm job
    named = crash_suspects(_job(), directory)
    assert [node for node, _ in named] == ["gpu-b-03"] and "task 5" in named[0][1]


# ------------------------------------------------------------------------------ spikes


def _losses(values: list[float]) -> list[tuple[int, float | None]]:
    return [(10 * (i + 1), value) for i, value in enumerate(values)]


def test_a_spike_is_the_first_of_two_logged_losses_over_the_bound() -> None:
    steady = [3.0 - 0.01 * i for i in range(40)]
    spike = loss_spike(_losses([*steady, 14.0, 15.0, 2.6]), factor=4.0)
    assert spike is not None and spike.step == 410 and spike.loss == 14.0
    assert spike.median == pytest.approx(sorted(steady[-SPIKE_WINDOW:])[SPIKE_WINDOW // 2])


@pytest.mark.parametrize(
    "values",
    [
        [3.0 - 0.01 * i for i in range(40)] + [14.0, 2.6, 2.6],  # one high point: noise
        [3.0] * 10 + [14.0, 15.0],  # no full window before it
        [3.0] * 40 + [11.0, 11.0],  # under 4 × the median
        [3.0] * 40 + [float("nan"), float("nan")],  # the NaN check's, not a spike
        [3.0] * 40 + [None, None],  # not logged
    ],
)
def test_no_spike(values: list[float | None]) -> None:
    assert loss_spike(_losses(values), factor=4.0) is None  # type: ignore[arg-type]


def test_a_zero_factor_turns_the_spike_check_off() -> None:
    assert loss_spike(_losses([3.0] * 40 + [100.0, 100.0]), factor=0.0) is None


@pytest.mark.django_db
def test_a_spiking_run_resumes_from_a_proven_checkpoint_before_the_spike(
    cluster: Any, researcher: Any, cancels: list[str]
) -> None:
    RecoveryPolicy.objects.create(cluster=cluster, loss_spike_factor=4.0)
    start = timezone.now()
    job = _running_job(cluster, researcher)  # steps 10..590, loss 3.0
    _checkpoint(job, 400, proven=True)  # with points 401..405 at 2.5
    _checkpoint(job, 590, proven=True)  # used by steps 591..595, which logged 2.5: sound
    # Saved after the last sound loss (595) and before the spike: nothing shows it sound.
    CheckpointFactory(job=job, step=598, last_proven_at=start)
    MetricPoint.objects.bulk_create(
        MetricPoint(job=job, step=step, wall_time=start, loss=40.0) for step in (600, 610)
    )
    recovery_cycle(cluster=cluster, seen={job.id}, now=start)
    incident = Incident.objects.get(job=job)
    assert incident.signal == Incident.Signal.LOSS_SPIKE, incident.detail
    assert incident.evidence["spike_step"] == 600 and cancels == [str(job.id)]
    Job.objects.filter(pk=job.pk).update(state="cancelled", ended_at=start, files_final=True)
    recovery_cycle(cluster=cluster, seen=set(), now=start + timedelta(seconds=2))
    incident.refresh_from_db()
    assert incident.outcome == Incident.Outcome.RECOVERED, incident.reason
    assert incident.resumed_from is not None and incident.resumed_from.step == 590


@pytest.mark.django_db
def test_the_checkpoints_after_the_last_sound_loss_are_not_trusted(
    cluster: Any, researcher: Any
) -> None:
    job = _running_job(cluster, researcher)  # finite losses at steps 10..590
    assert divergence_bound(job, 600) == 590
    assert divergence_bound(job, None) is None
    Job.objects.filter(pk=job.pk).update(nonfinite_loss_step=10)
    job.refresh_from_db()
    assert divergence_bound(job, 10) == 1  # none sound: only what it started from


@pytest.mark.django_db
def test_a_hang_names_the_stopped_ranks_node_from_the_cycles_listing(
    cluster: Any, researcher: Any, cancels: list[str]
) -> None:
    RecoveryPolicy.objects.create(cluster=cluster, hang_floor_seconds=60)
    job = _running_job(cluster, researcher, allocated_nodes="gpu-b-[01-02]")
    _checkpoint(job, 500, proven=True)
    start = timezone.now()
    recovery_cycle(cluster=cluster, seen={job.id}, now=start)
    listed = {job.id: _directory(r0_gpu_b_01=2000, r1_gpu_b_02=1900)}
    recovery_cycle(
        cluster=cluster, seen={job.id}, now=start + timedelta(seconds=120), listed=listed
    )
    incident = Incident.objects.get(job=job)
    assert incident.signal == Incident.Signal.HANG
    assert incident.suspect_nodes == ["gpu-b-02"]
    assert SuspectNode.objects.get(incident=incident).node.name == "gpu-b-02"
