"""`spotnb doctor` without a cloud: the local market's checks, a Config spot.train would refuse,
provider='any', `--set`, and a terminal that cannot print ✔ (the clouds' checks:
tests/doctor/test_doctor_aws.py, test_doctor_azure.py, test_doctor_gcp.py)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from spotnb.cli import main
from spotnb.doctor.report import FAIL, OK, SKIP, doctor


def test_the_local_market_checks_its_store(tmp_path: Path) -> None:
    report = doctor(store=(tmp_path / "store").as_uri())
    assert [(n, r.status) for n, r in report.results] == [("config", OK), ("store", OK)]
    assert "--provider aws, azure or gcp" in report.results[0][1].detail
    assert report.exit_code == 0
    assert list((tmp_path / "store").iterdir()) == []  # the probe is gone


def test_a_config_spot_train_refuses(tmp_path: Path) -> None:
    """A Config that cannot be made: one ✘ naming the field, every cloud check skipped;
    provider='any': one cloud at a time."""
    report = doctor(provider="aws", instance_type="")
    lines = dict(report.results)
    assert lines["config"].status == FAIL and "Config.instance_type" in lines["config"].detail
    assert lines["store"].status == SKIP and report.exit_code == 1
    report = doctor(provider="any", instance_type={"aws": "g5.xlarge", "gcp": "g2-standard-4"})
    assert report.results[0][1].status == FAIL and "--provider aws, azure or gcp" in report.results[0][1].fix


def test_cli_set_and_ascii_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store = (tmp_path / "s").as_uri()
    assert main(["doctor", "--set", "store=" + store, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["store"] == store and [c["status"] for c in out["checks"]] == ["ok", "ok"]
    assert main(["doctor", "--set", "nonsense"]) == 2
    assert "expected FIELD=VALUE" in capsys.readouterr().err
    ascii_out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", ascii_out)
    assert main(["doctor", "--store", store]) == 0
    ascii_out.seek(0)
    text = ascii_out.read()
    assert text.startswith("spotnb doctor: local") and "\nok config" in text
