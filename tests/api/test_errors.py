"""Bad input fails before anything is launched, with a message naming the field and the fix;
a user exception on the instance surfaces as JobFailed with the remote traceback."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

import spotnb as spot
from spotnb.errors import ConfigError
from tests.support import jobfns

pytestmark = pytest.mark.jobs

SHIP = ["tests.support.jobfns"]


def test_user_exception_is_jobfailed_with_remote_traceback_and_no_relaunch() -> None:
    job = spot.train(jobfns.fails_at, spot.Config(ship_modules=SHIP))
    with pytest.raises(spot.JobFailed) as info:
        job.result(timeout=120)
    assert "ValueError: bad batch at step 5" in info.value.remote_traceback
    assert "fails_at" in info.value.remote_traceback  # the user's frame is in it
    assert job.status == "failed"
    assert len([e for e in job.events if e["kind"] == "allocated"]) == 1


def test_max_retries_relaunches_after_a_user_error() -> None:
    job = spot.train(jobfns.fails_at, spot.Config(ship_modules=SHIP, max_retries=1))
    with pytest.raises(spot.JobFailed):
        job.result(timeout=120)
    assert len([e for e in job.events if e["kind"] == "allocated"]) == 2


def test_unpicklable_fn_fails_before_launch(spotnb_home) -> None:
    lock = threading.Lock()

    def fit(ctx):
        with lock:
            return 1

    with pytest.raises(ConfigError, match=r"fn: 'fit' cannot be pickled.*create it inside the function"):
        spot.train(fit)
    assert spot.jobs() == []  # nothing was submitted


def test_fn_must_take_ctx() -> None:
    with pytest.raises(ConfigError, match="must accept exactly one positional argument"):
        spot.train(lambda: 1)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("local_mttp", "soon", r"Config.local_mttp: invalid duration 'soon'.*'90s', '2m'"),
        ("local_grace", -3, r"Config.local_grace: duration must be non-negative"),
        ("heartbeat_timeout", [1], r"Config.heartbeat_timeout: expected a duration"),
        ("provider", "oracle", r"Config.provider: unknown provider 'oracle'; choose one of"),
        ("checkpoint", "sometimes", r"Config.checkpoint: .*unknown checkpoint policy 'sometimes'"),
        ("checkpoint", "static:0", r"Config.checkpoint: .*static"),
        ("save_every", 0, r"Config.save_every: .*greater than or equal to 1"),
        ("keep_last", 0, r"Config.keep_last"),
        ("max_cost", -1, r"Config.max_cost"),
        ("local_notice_format", "ibm", r"Config.local_notice_format"),
        ("local_alloc_delay", [3, 1], r"Config.local_alloc_delay: high \(1.0\) is below low"),
        ("local_schedule", [{"step": 3, "phase": "lunch"}], r"Config.local_schedule: .*phase"),
        ("local_capacity_failure", 1.5, r"Config.local_capacity_failure"),
        ("heartbeat_timeout", 0, r"Config.heartbeat_timeout: 0 s is too short"),
        ("notice_poll", 0, r"Config.notice_poll: 0 s would poll the metadata endpoint in a busy loop"),
        (
            "requirements",
            ["lib @ git+https://user:ghp_secret@github.com/o/lib"],
            r"Config.requirements: \[0\] carries credentials in its URL",
        ),
        ("store", "s3://AKIA:secret@bucket/prefix", r"Config.store: the store URL carries credentials"),
        ("instance_type", "x9.mega", r"Config: instance_type 'x9.mega' is not in the price table"),
    ],
)
def test_each_invalid_field_is_named(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        spot.Config(**{field: value})


def test_unknown_field_lists_valid_ones_and_suggests() -> None:
    with pytest.raises(
        ConfigError,
        match=r"unknown Config field 'local_mtp' \(did you mean 'local_mttp'\?\)"
        r".*Valid fields: .*save_every",
    ):
        spot.Config(local_mtp="2m")
    with pytest.raises(ConfigError, match="save_evry"):
        spot.train(jobfns.slow_steps, save_evry=3)


def test_region_and_regions_together_are_ambiguous() -> None:
    with pytest.raises(ConfigError, match=r"give region \(one\) or regions \(candidates\), not both"):
        spot.Config(region="us-east-1", regions=["us-west-2"])


def test_other_providers_fields_are_rejected() -> None:
    with pytest.raises(ConfigError, match=r"local_mttp applies to provider='local'.*provider is 'aws'"):
        spot.Config(provider="aws", local_mttp="2m")


def test_durations_accept_numbers_and_units() -> None:
    c = spot.Config(local_mttp="1h30m", local_grace="90s", heartbeat_timeout=12, notice_poll="500ms")
    assert (c.local_mttp, c.local_grace, c.heartbeat_timeout, c.notice_poll) == (5400, 90, 12, 0.5)


def test_missing_files_and_bad_requirements_fail_before_launch(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"Config.files\[0\]: '/nope/data.csv' does not exist"):
        spot.train(jobfns.slow_steps, files=["/nope/data.csv"])
    with pytest.raises(ConfigError, match=r"Config.requirements\[1\]: 'torch>>2' is not a pip requirement"):
        spot.train(jobfns.slow_steps, requirements=["numpy", "torch>>2"])
    assert spot.jobs() == []


def test_memory_store_is_refused_for_local_instances() -> None:
    with pytest.raises(ConfigError, match=r"Config.store: 'memory://x' cannot be used with provider='local'"):
        spot.train(jobfns.slow_steps, store="memory://x")


def test_import_is_light() -> None:
    code = (
        "import sys, spotnb; bad = [m for m in sys.modules if m.split('.')[0] in "
        "('boto3', 'botocore', 'azure', 'google', 'torch', 'pandas', 'plotly', 'ipywidgets')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
