"""`spot.run("train.py", args=[...])`: an existing training script as a spot job.

The job is the same kind of job `spot.train` makes (same Job, widget, controller, relaunches,
ledger); only what runs on the instance differs (`spotnb.runtime.script.runner`). What is shipped:
the script file itself (at its path relative to the working directory, or at the top of it
when it lies outside) and `Config.files` — the modules or package it imports, small data.
Nothing else: on a cloud instance the script sees only those files (on the local market it
runs in this directory, where everything else is too).
"""

from __future__ import annotations

import os
from typing import Any

from spotnb.core.files import FilesError, collect
from spotnb.core.spec import ScriptSpec
from spotnb.errors import ConfigError
from spotnb.job import Job
from spotnb.settings.config import Config
from spotnb.settings.registry import get_provider_class
from spotnb.submit import check_inputs, drive_job, merge_config, pickle_payload, submit_job

__all__ = ["run", "check_script", "check_group"]

#: torchrun's own options: spotnb starts torchrun, so in a script's args they are a mistake
_TORCHRUN_OPTIONS = (
    "--nnodes",
    "--nproc-per-node",
    "--nproc_per_node",
    "--rdzv-endpoint",
    "--rdzv_endpoint",
    "--rdzv-backend",
    "--rdzv_backend",
    "--rdzv-id",
    "--rdzv_id",
    "--standalone",
    "--master-addr",
    "--master_addr",
    "--master-port",
    "--master_port",
    "--node-rank",
    "--node_rank",
    "--max-restarts",
    "--max_restarts",
)


def check_script(script: Any, args: Any) -> tuple[str, list[str]]:
    """The script's path and its arguments, or a ConfigError naming the field and the fix."""
    if not isinstance(script, (str, os.PathLike)):
        raise ConfigError(f"script: expected the path of a .py file, got {type(script).__name__}")
    path = os.fspath(script)
    if not os.path.exists(path):
        raise ConfigError(f"script: {path!r} does not exist (relative paths are taken from {os.getcwd()!r})")
    if os.path.isdir(path):
        raise ConfigError(
            f"script: {path!r} is a folder; give the .py file to run (its folder goes in files=)"
        )
    if not path.endswith(".py"):
        raise ConfigError(
            f"script: {path!r} is not a .py file; spot.run runs Python scripts (for a module, "
            "write a two-line script that imports and calls it)"
        )
    if args is None:
        return path, []
    if isinstance(args, (str, bytes)):
        raise ConfigError(
            f"args: expected a list of str, got the string {args!r}; split it: "
            f"args=shlex.split({args!r}) or args=['--lr', '0.1']"
        )
    if not isinstance(args, (list, tuple)):
        raise ConfigError(
            f"args: expected a list of str, got {type(args).__name__}; e.g. args=['--lr', '0.1']"
        )
    for i, arg in enumerate(args):
        if not isinstance(arg, str):
            raise ConfigError(
                f"args[{i}]: expected a str, got {type(arg).__name__} {arg!r}; "
                f"pass every argument as text, e.g. {str(arg)!r}"
            )
    return path, list(args)


def check_group(path: str, argv: list[str], config: Config) -> None:
    """A script on several instances runs under torchrun, which spotnb starts: refuse what
    would conflict with that, naming the field and the fix."""
    if config.instances <= 1:
        if (config.procs_per_instance or 1) > 1:
            raise ConfigError(
                f"Config.procs_per_instance={config.procs_per_instance}: a script on one instance "
                "runs as one process (`python script`); spotnb starts torchrun only for a script on "
                "several instances. Start the processes from the script (torch.multiprocessing), "
                "or remove procs_per_instance"
            )
        return
    if config.sync != "ddp":
        raise ConfigError(
            f"Config.sync: {config.sync!r} is how spot.train's ctx.replicate synchronises; a script "
            "on several instances synchronises itself (torchrun, DistributedDataParallel): "
            "remove sync"
        )
    for i, arg in enumerate(argv):
        if arg.split("=", 1)[0] in _TORCHRUN_OPTIONS:
            raise ConfigError(
                f"args[{i}]: {arg!r} is an option of torchrun, which spotnb starts itself "
                f"(--nnodes={config.min_instances}:{config.instances} from Config.min_instances and "
                "Config.instances, --nproc-per-node from Config.procs_per_instance, the "
                "rendezvous on the job's coordinator): give only the script's own arguments"
            )


def run(
    script: str | os.PathLike[str],
    args: list[str] | None = None,
    config: Config | None = None,
    *,
    detach: bool = True,
    **overrides: Any,
) -> Job:
    """Run `python script *args` on a spot instance; returns a Job at once, as `spot.train` does.

    On the instance the script runs in a fresh interpreter with `sys.argv = [script, *args]`.
    A preemption notice reaches it as SIGTERM (the SLURM/submitit convention) after the file
    named by `$SPOTNB_NOTICE_FILE` appeared with the deadline (JSON: deadline, time_left, source,
    action); the script then has until the deadline to save. `spotnb.ctx()` gives it the job's
    context: `ctx.backup("ckpt")` makes its checkpoint folder part of the job's checkpoints,
    restored before the script runs again on the next instance; `ctx.log(...)` draws metrics;
    `ctx.should_save()` and `ctx.steps(n)` / `ctx.step()` let the policy choose when to save;
    `ctx.set_result(value)` is what `job.result()` returns (None without it).

    Exit code 0 finishes the job. Any other code fails it, with the script's last stderr lines
    in the failure (`Config.max_retries` relaunches apply) — unless a notice came first: a
    script that exits or dies after the notice was preempted, and runs again elsewhere.

    With `Config.instances = N > 1` the script runs under torchrun on every instance
    (`--nnodes=min_instances:N`, rendezvous on the job's coordinator, which no preemption
    takes): a torchrun/DDP script as written. A lost instance makes the others restart their
    workers in a smaller group from the newest checkpoint (rank 0's `ctx.backup`); its
    replacement joins at the next restart. See `spotnb.runtime.group.torchrun`.

    Bad input (a missing file, not a .py, args that are not a list of str, torchrun's own
    options among the args of a script on several instances, a `sync` mode) raises
    ConfigError before anything is written or launched.
    """
    path, argv = check_script(script, args)
    config = merge_config(config, overrides)
    check_group(path, argv, config)
    if config.name is None:
        config = merge_config(config, {"name": os.path.basename(path)[:40]})
    check_inputs(config)
    provider = get_provider_class(config.provider)(config)
    provider.validate()
    payload = pickle_payload(None, config)  # no function: the policy object, if one was given
    try:
        files = collect([path, *config.files], os.getcwd())
    except FilesError as exc:
        raise ConfigError(str(exc)) from None
    source = os.path.realpath(path)
    dest = next(f["path"] for f in files if f["source"] == source)
    job = submit_job(payload, config, files, detach, script=ScriptSpec(path=dest, args=argv))
    drive_job(job, config, provider, detach)
    return job
