"""Providers own their settings (issue 12): a third-party provider registers through the
`spotnb.providers` entry point and needs no edit in spotnb.

The toy provider in `tests/support/toy_provider/` is packaged as another project would be: a module
with its settings and a `ProviderInfo`, and a `.dist-info` whose `entry_points.txt` names it.
Putting that folder on the path is what `pip install spotnb-toy` would do; each check runs in
a fresh interpreter, because `spot.Config` is composed from the registered providers when
spotnb is imported. Its instances are the local market's real processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import spotnb as spot
from spotnb.settings.config import provider_prefixes
from spotnb.settings.registry import provider_info, registry
from tests.support.paths import REPO, TOY_PROVIDER

TOY = TOY_PROVIDER
ROOT = REPO


def _run(code: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TOY), str(ROOT)]), "SPOTNB_FAST": "1"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def test_config_fields_come_from_each_providers_settings() -> None:
    for name, info in registry().items():
        assert info.settings.model_fields, name
        for field in info.settings.model_fields:
            assert field.startswith(f"{name}_") and field in spot.Config.model_fields
    assert set(provider_prefixes()) >= {"local_", "aws_", "azure_", "gcp_"}
    assert provider_info("local").settings.market_priors(spot.Config(local_mttp="2m")) == {
        "prior_restart": pytest.approx(0.55 + 2.0),
        "prior_mttp": 120.0,
    }
    assert provider_info("aws").settings.market_priors(spot.Config()) == {}


def test_a_provider_from_another_package_is_validated_listed_and_runs(tmp_path: Path) -> None:
    done = _run("""
        import json, sys
        import spotnb as spot
        from spotnb.errors import ConfigError

        out = {}
        config = spot.Config(provider="toy", toy_color="blue", name="toy-job")
        out["fields"] = [config.toy_color, config.toy_speed]
        for bad in (dict(toy_color="blue"), dict(provider="toy", toy_color="green"),
                    dict(provider="toy", toy_color="blue", instance_type="p3.2xlarge")):
            try:
                spot.Config(**bad)
            except ConfigError as exc:
                out.setdefault("refused", []).append(str(exc))
        plan = spot.train(lambda ctx: 1, config, dry_run=True)
        out["dry_run_providers"] = plan["providers"]

        def fit(ctx):
            total = 0
            for step in ctx.steps(30):
                total += step
                ctx.log(total=total)
            return total

        job = spot.train(fit, config)          # a detached controller reads the JSON spec back
        out["result"] = job.result(timeout=240)
        out["provider"] = job.state.provider
        out["kinds"] = [e.kind for e in job.events]
        print(json.dumps(out))
        """)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["fields"] == ["blue", 1.0]
    assert [r.split(":")[0] for r in out["refused"]] == ["Config", "Config.toy_color", "Config"]
    assert "applies to provider='toy'" in out["refused"][0]
    assert "sells only g4dn.xlarge" in out["refused"][2]
    assert "toy" in out["dry_run_providers"]
    assert out["result"] == sum(range(30)) and out["provider"] == "toy"
    assert out["kinds"][-1] == "status" and "done" in out["kinds"]
    listed = _run("from spotnb.cli import main; main(['providers', '--json'])")
    toy = next(r for r in json.loads(listed.stdout) if r["name"] == "toy")
    assert toy["installed"] and not toy["builtin"] and toy["fields"] == ["toy_color", "toy_speed"]


def test_a_broken_plugin_does_not_stop_import(tmp_path: Path) -> None:
    """A plugin whose module fails to import is left out with a warning naming it; a Config
    that asks for it says it is installed but broken, with the import error (not "unknown
    provider", which sends the user to install it again or look for a typo)."""
    dist = tmp_path / "broken-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[spotnb.providers]\nbroken = no_such_module:INFO\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import spotnb as spot; from spotnb.settings.registry "
            "import registry; print(sorted(registry())); spot.Config()\n"
            "try:\n    spot.Config(provider='broken')\nexcept Exception as e:\n    print('refused:', e)",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    listed = done.stdout.splitlines()[0]
    assert "broken" not in listed and "'local'" in listed
    assert "provider 'broken'" in done.stderr and "no_such_module" in done.stderr
    (refused,) = [line for line in done.stdout.splitlines() if line.startswith("refused:")]
    assert "'broken' is installed" in refused and "no_such_module" in refused and "unknown" not in refused
