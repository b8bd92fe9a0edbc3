"""`spotnb doctor`: the preflight a new user runs before the first cloud job.

One line per check, each ✔ (fine), ✘ (wrong, with the fix) or ? (could not be checked: offline,
no permission to ask, a cloud that answered garbage, or skipped because a check it needs did not
pass). The checks: the Config (validated as `spot.train` would), credentials (which source),
region, instance type, spot quota, store (a probe object written, read back and deleted), the
VM's identity (may it write the store, as far as the API can tell), image, prices.

Each cloud's checks live in `spotnb.doctor.aws`, `spotnb.doctor.azure` and `spotnb.doctor.gcp`,
on the shared parts in `spotnb.doctor.checks` (results, the runner, the store probe, prices); they
import the SDKs inside their functions, and `import spotnb` never imports these modules. They
reuse the providers' own code read-only: the provider's credential discovery
(`Provider.has_credentials`), its price fetch (`Provider.prices`), its default image and
instance profile name.

Time: every request has a short connect and read timeout and no retry; independent checks run
at once, each in its own thread, and one that does not answer within `timeout` seconds is
reported as "?" while the run goes on. A check whose prerequisite failed is skipped ("skipped:
needs credentials"); one whose prerequisite could not reach the cloud says so without asking
again, so an offline run takes about a second.

Exit code (`Report.exit_code`): 0 every check passed, 1 at least one failed, 2 none failed but
some could not be checked.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spotnb.doctor.checks import (
    ASCII_SYMBOLS,
    CLOUD_NAMES,
    CLOUDS,
    DEFAULT_TIMEOUT,
    FAIL,
    OK,
    SKIP,
    SYMBOLS,
    UNKNOWN,
    Check,
    Result,
    brief,
    fail,
    ok,
    run_checks,
    store_check,
    unknown,
)

if TYPE_CHECKING:
    from spotnb.settings.config import Config

__all__ = ["Report", "doctor", "add_parser", "cmd_doctor", "OK", "FAIL", "UNKNOWN", "SKIP", "CLOUD_NAMES"]


@dataclass
class Report:
    """The whole run: what was checked (`subject`) and each check's result, in order."""

    subject: dict[str, Any]
    results: list[tuple[str, Result]]
    seconds: float

    @property
    def exit_code(self) -> int:
        statuses = {r.status for _, r in self.results}
        if FAIL in statuses:
            return 1
        return 0 if statuses <= {OK} else 2

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.subject,
            "checks": [
                {
                    "name": name,
                    "status": r.status,
                    "symbol": SYMBOLS[r.status],
                    "detail": r.detail,
                    "fix": r.fix,
                    "seconds": round(r.seconds, 3),
                }
                for name, r in self.results
            ],
            "exit_code": self.exit_code,
            "seconds": round(self.seconds, 3),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def text(self, symbols: dict[str, str] | None = None) -> str:
        marks = symbols or SYMBOLS
        width = max((len(name) for name, _ in self.results), default=0)
        what = ", ".join(
            f"{k.replace('_', ' ')} {v}" for k, v in self.subject.items() if v and k != "provider"
        )
        lines = [f"spotnb doctor: {self.subject.get('provider')} ({what})"]
        pad = " " * (len(max(marks.values(), key=len)) + 1 + width + 2)
        for name, r in self.results:
            lines.append(f"{marks[r.status]:<{len(marks[OK])}} {name:<{width}}  {r.detail}")
            if r.fix and r.status != OK:
                lines.append(f"{pad}fix: {r.fix}")
        counts = {s: sum(1 for _, r in self.results if r.status == s) for s in (OK, FAIL)}
        others = len(self.results) - counts[OK] - counts[FAIL]
        lines.append(
            f"{counts[OK]} passed, {counts[FAIL]} failed, {others} not checked ({self.seconds:.1f} s)"
        )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return self.text()


# -- the Config ----------------------------------------------------------------------------------
def _config_check(config: Config, provider_cls: Any) -> Result:
    """Validate as `spot.train` does: the Config's own validators ran when it was made; the
    provider's `validate` is the rest (the store's kind, the fields it needs)."""
    from spotnb.errors import ConfigError

    try:
        provider_cls(config).validate()
    except ConfigError as exc:
        return fail(
            f"spot.train would refuse it: {exc}", "change the field it names (--set FIELD=VALUE here)"
        )
    except Exception as exc:  # noqa: BLE001 - a provider's validation that breaks: say so
        return unknown(f"could not validate: {brief(exc)}")
    if config.provider == "local":
        return ok(
            "valid for provider='local', which needs no cloud (--provider aws, azure or gcp checks one)"
        )
    return ok(f"valid for provider={config.provider!r} ({config.instance_type_name()})")


def make_config(config: Config | None = None, **fields: Any) -> Config:
    """The Config `spot.train(fn, config, **fields)` would run: `config` (or the defaults) with
    `fields` set (None values are left out)."""
    from spotnb.settings.config import Config

    given = {k: v for k, v in fields.items() if v is not None}
    if config is None:
        return Config(**given)
    return config.model_copy(update={}) if not given else Config(**{**_set_fields(config), **given})


def _set_fields(config: Config) -> dict[str, Any]:
    return {name: getattr(config, name) for name in config.model_fields_set}


# -- entry points --------------------------------------------------------------------------------
def _cloud_checks(cloud: str, config: Config, provider_cls: Any, hooks: dict[str, Any]) -> list[Check]:
    if cloud == "aws":
        from spotnb.doctor import aws as module
    elif cloud == "azure":
        from spotnb.doctor import azure as module  # type: ignore[no-redef]
    else:
        from spotnb.doctor import gcp as module  # type: ignore[no-redef]
    return module.checks(config, provider_cls, **hooks)


def doctor(
    config: Config | None = None,
    *,
    provider: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    hooks: dict[str, Any] | None = None,
    **fields: Any,
) -> Report:
    """Check that `config` (or the defaults with `fields`, as `spot.train(fn, config,
    **fields)` takes them) can run on `provider` (default: the Config's) from this machine.

    `hooks` are passed to the cloud's checks (tests: an Azure SDK transport, a `requests`
    adapter for Google's REST APIs)."""
    from spotnb.errors import ConfigError, ProviderUnavailable
    from spotnb.settings.registry import get_provider_class

    t0 = time.monotonic()
    if provider is not None:
        fields["provider"] = provider
    subject: dict[str, Any] = {"provider": fields.get("provider") or getattr(config, "provider", "local")}
    if subject["provider"] not in (*CLOUDS, "local"):  # "any", or another package's provider
        refused = fail(
            f"spotnb doctor checks one cloud at a time, and provider is {subject['provider']!r}",
            "give --provider aws, azure or gcp (with provider='any', run it once per cloud)",
        )
        return Report(subject, [("config", refused)], time.monotonic() - t0)
    try:
        cfg = make_config(config, **fields)
    except ConfigError as exc:
        res = [("config", fail(f"not a valid Config: {exc}", "change the field it names"))]
        return Report(subject, res + _all_skipped(subject["provider"], "config"), time.monotonic() - t0)
    region = cfg.region or (", ".join(cfg.regions) if isinstance(cfg.regions, list) else cfg.regions)
    subject.update(
        provider=cfg.provider,
        instance_type=cfg.instance_type_name(),
        region=region or None,
        store=cfg.store_url(),
    )
    try:
        provider_cls = get_provider_class(cfg.provider)
    except ProviderUnavailable as exc:
        res = [("config", fail(str(exc), str(exc).rsplit(": ", 1)[-1]))]
        return Report(subject, res + _all_skipped(cfg.provider, "config"), time.monotonic() - t0)
    checks = [Check("config", lambda _: _config_check(cfg, provider_cls))]
    if cfg.provider == "local":
        checks.append(Check("store", lambda _: store_check(cfg)))
    else:
        checks += _cloud_checks(cfg.provider, cfg, provider_cls, dict(hooks or {}))
    return Report(subject, run_checks(checks, timeout), time.monotonic() - t0)


def _all_skipped(provider: str, why: str) -> list[tuple[str, Result]]:
    if provider not in CLOUDS:
        return []
    names = ["credentials", "region", "instance type", "spot quota", "store", "identity", "image", "prices"]
    return [(n, Result(SKIP, f"skipped: needs a valid {why}")) for n in names]


def _symbols() -> dict[str, str]:
    """✔/✘ where stdout can write them, else ok/FAIL (a C locale's ASCII terminal)."""
    encoding = getattr(sys.stdout, "encoding", None) or "ascii"
    try:
        "✔✘".encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return ASCII_SYMBOLS
    return SYMBOLS


def add_parser(sub: Any) -> None:
    """`spotnb doctor` on the CLI's subcommands."""
    p = sub.add_parser(
        "doctor",
        help="check credentials, region, quota, store, identity, image and prices before a cloud job",
        description="One line per check: ✔ passed, ✘ failed (with the fix), ? could not be checked. "
        "Exit code 0: all passed; 1: something failed; 2: nothing failed, something not checked.",
    )
    p.add_argument("--provider", choices=CLOUDS, default=None, help="the cloud (default: Config.provider)")
    p.add_argument("--instance-type", default=None)
    p.add_argument("--region", default=None)
    p.add_argument("--store", default=None, help="the store URL, e.g. s3://bucket/prefix")
    p.add_argument(
        "--set",
        action="append",
        metavar="FIELD=VALUE",
        help="a Config field (JSON or a plain string), repeatable: --set aws_instance_profile=my-profile",
    )
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds each check may take")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.set_defaults(func=cmd_doctor)


def _set_items(items: list[str] | None) -> dict[str, Any] | None:
    """`--set FIELD=VALUE` items (JSON or a plain string), as `spotnb run --set` reads them;
    None if one is malformed (said on stderr)."""
    fields: dict[str, Any] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            print(
                f"--set {item!r}: expected FIELD=VALUE, e.g. --set aws_instance_profile=my-profile",
                file=sys.stderr,
            )
            return None
        try:
            fields[name] = json.loads(value)
        except ValueError:
            fields[name] = value
    return fields


def cmd_doctor(args: Any) -> int:
    fields = _set_items(args.set)
    if fields is None:
        return 2
    flags = {"instance_type": args.instance_type, "region": args.region, "store": args.store}
    fields.update({k: v for k, v in flags.items() if v is not None})  # a flag wins over --set
    report = doctor(provider=args.provider, timeout=args.timeout, **fields)
    print(report.to_json() if args.json else report.text(_symbols()), flush=True)
    return report.exit_code
