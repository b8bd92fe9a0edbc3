"""A dry run reads as a plan: a summary once, the raw requests and the boot script behind
disclosures, the price said to be approximate with its table's date."""

from __future__ import annotations

import re

import spotnb as spot
from spotnb.plan_view import DryRun
from spotnb.prices import table_date


def fit(ctx):  # type: ignore[no-untyped-def]
    return 1


def test_a_dry_run_is_a_readable_plan(capsys) -> None:  # type: ignore[no-untyped-def]
    config = spot.Config(provider="gcp", store="gs://b/jobs", instance_type="g2-standard-4",
                         region="us-central1-a", gcp_project="p",
                         gcp_service_account="vm@p.iam.gserviceaccount.com")  # fmt: skip
    plan = spot.train(fit, config, dry_run=True)
    assert isinstance(plan, DryRun) and plan["requests"]  # still the plan dict
    printed = capsys.readouterr().out
    assert printed.count("InstancesClient.insert") == 1 and '"scheduling"' not in printed  # no JSON dump
    page = plan._repr_html_()
    outside = re.sub(r"<details>.*?</details>", "", page, flags=re.S)
    assert "approximate" in outside and table_date() in outside
    assert "#!/" not in outside and "scheduling" not in outside  # raw parts only behind disclosures
    assert page.count("<details>") == 2 and "scheduling" in page
    name = plan["requests"][0]["body"]["name"]
    assert re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name) and "--" not in name
