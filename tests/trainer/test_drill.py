import json

from trainer_testlib import ckpt, cli, losses


def drill(tmp_path, checkpoint, reference, steps=3, *extra):
    out = tmp_path / "drill" / "drill.json"
    code = cli(
        [
            "drill",
            "--checkpoint",
            str(checkpoint),
            "--reference",
            str(reference),
            "--steps",
            str(steps),
            "--out",
            str(out),
            *extra,
        ]
    )
    return code, json.loads(out.read_text())


def test_drill_passes_on_good_checkpoint(base_run, tmp_path):
    before = sorted(p.name for p in (base_run / "checkpoints").iterdir())
    size = (base_run / "metrics.jsonl").stat().st_size
    code, doc = drill(tmp_path, ckpt(base_run, 3), base_run / "metrics.jsonl")
    assert code == 0, doc
    assert doc["verdict"] == "passed" and doc["reason"] is None and doc["reason_code"] is None
    assert doc["mode"] == "exact" and doc["first_divergence"] is None
    assert [s["step"] for s in doc["steps"]] == [4, 5, 6]
    assert all(s["ok"] and s["abs_diff"] == 0 for s in doc["steps"])
    assert doc["checkpoint"]["step"] == 3 and doc["checkpoint"]["world_size_at_save"] == 1
    assert doc["allocation"]["world_size"] == 1 and len(doc["allocation"]["nodes"]) == 1
    r = doc["ranks"][0]
    # the rank's index and its data file(s), each re-hashed while loading
    assert r["ok"] and r["files"] == ["rank-00000.pt", "rank-00000-0000.bin"]
    assert r["files_verified"] == 2 and r["bytes"] > 0
    for k in ("integrity_s", "load_s", "steps_s", "per_step_s", "total_s"):
        assert doc["timings"][k] >= 0
    assert "torch" in doc["versions"]
    # the drill wrote nothing into the run
    assert sorted(p.name for p in (base_run / "checkpoints").iterdir()) == before
    assert (base_run / "metrics.jsonl").stat().st_size == size


def test_drill_fails_on_perturbed_reference(base_run, tmp_path):
    lines = (base_run / "metrics.jsonl").read_text().splitlines()
    out = []
    for line in lines:
        rec = json.loads(line)
        if rec.get("step") == 5 and "event" not in rec:
            rec["loss"] = rec["loss"] * (1 + 1e-6)
        out.append(json.dumps(rec))
    ref = tmp_path / "ref.jsonl"
    ref.write_text("\n".join(out) + "\n")
    code, doc = drill(tmp_path, ckpt(base_run, 3), ref)
    assert code == 1 and doc["verdict"] == "failed" and doc["reason_code"] == "loss_diverged"
    assert doc["first_divergence"]["step"] == 5 and "step 5" in doc["reason"]
    assert [s["ok"] for s in doc["steps"]] == [True, False, True]
    # a loose tolerance accepts the small perturbation
    code, doc = drill(
        tmp_path, ckpt(base_run, 3), ref, 3, "--mode", "tolerance", "--tolerance", "1e-4"
    )
    assert code == 0 and doc["mode"] == "tolerance"


def test_drill_reference_missing_and_partial(base_run, tmp_path):
    """What the drill cannot judge is inconclusive (exit 5): it neither proves nor blocks."""
    code, doc = drill(tmp_path, ckpt(base_run, 6), base_run / "metrics.jsonl")
    assert code == 5 and doc["verdict"] == "inconclusive"
    assert doc["reason_code"] == "reference_missing"
    assert "reference has no steps after 6" in doc["reason"]
    code, doc = drill(tmp_path, ckpt(base_run, 3), tmp_path / "nope.jsonl")
    assert code == 5 and doc["reason_code"] == "reference_missing"
    # K beyond the reference: the steps present are compared, but fewer than asked
    code, doc = drill(tmp_path, ckpt(base_run, 3), base_run / "metrics.jsonl", 5)
    assert code == 5 and doc["verdict"] == "inconclusive" and doc["reason_code"] == "steps_short"
    assert doc["steps_compared"] == 3 and doc["steps"][-1]["ok"] is None


def test_reference_tolerates_half_written_last_line(base_run, tmp_path):
    ref = tmp_path / "ref.jsonl"
    ref.write_text((base_run / "metrics.jsonl").read_text() + '{"step": 7, "lo')
    code, doc = drill(tmp_path, ckpt(base_run, 3), ref)
    assert code == 0
    assert losses(base_run)[4] == doc["steps"][0]["reference"]
