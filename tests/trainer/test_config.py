import json

import pytest
from trainer_testlib import run_trainer, tiny_config, write_config

from trainer.config import PRESETS, Config, ConfigError, validate


def test_defaults_and_presets_validate():
    assert isinstance(validate({}), Config)
    for name, values in PRESETS.items():
        cfg = validate({"preset": name})
        for k, v in values.items():
            assert getattr(cfg, k) == v
    cfg = validate({"preset": "small", "d_model": 128})
    assert cfg.d_model == 128 and cfg.n_layers == PRESETS["small"]["n_layers"]
    assert validate(cfg.to_dict()) == cfg
    assert validate({"lr": 1}).lr == 1.0


@pytest.mark.parametrize(
    ("raw", "key", "why"),
    [
        ({"bogus": 1}, "bogus", "unknown key"),
        ({"data": {"bogus": 1}}, "data.bogus", "unknown key"),
        ({"steps": "10"}, "steps", "expected int"),
        ({"steps": True}, "steps", "expected int"),
        ({"lr": "fast"}, "lr", "expected number"),
        ({"checkpoint_async": 1}, "checkpoint_async", "expected bool"),
        ({"data": {"order": 1.5}}, "data.order", "expected int"),
        ({"d_model": 30, "n_heads": 4}, "d_model", "not divisible"),
        ({"seq_len": 0}, "seq_len", ">= 1"),
        ({"batch_size": 0}, "batch_size", ">= 1"),
        ({"steps": -1}, "steps", ">= 1"),
        ({"lr": 0}, "lr", "> 0"),
        ({"precision": "fp16"}, "precision", "fp32"),
        ({"preset": "huge"}, "preset", "unknown preset"),
        ({"data": {"branching": 99}}, "data.branching", "exceeds vocab_size"),
        ({"vocab_size": 4096, "data": {"order": 3}}, "data.order", "exceeds the limit"),
        ({"seq_len": 2, "data": {"order": 3}}, "seq_len", "data.order"),
        ([1, 2], "<config>", "JSON object"),
    ],
)
def test_rejections_name_key_and_reason(raw, key, why):
    with pytest.raises(ConfigError) as ei:
        validate(raw)
    assert ei.value.key == key
    assert why in ei.value.why


def test_cli_rejects_before_any_work(tmp_path):
    cfg = write_config(tmp_path / "c.json", tiny_config(n_heads=3))
    run_dir = tmp_path / "run"
    p = run_trainer(["train", "--config", str(cfg), "--run-dir", str(run_dir)])
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "d_model" in lines[0] and "divisible" in lines[0]
    assert "Traceback" not in p.stderr
    assert not run_dir.exists()


def test_cli_invalid_json_and_presets(tmp_path, capsys):
    from trainer.cli import main

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["check-config", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert main(["presets"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["presets"]) >= {"tiny", "small"}
    assert out["defaults"]["checkpoint_async"] is True
