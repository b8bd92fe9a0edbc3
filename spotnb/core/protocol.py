"""The event protocol: every kind of event a job's log holds, as typed records.

A job's life is written down once, here. The agent on the instance, the controller and
`spot.train` write these records (`EventWriter.emit(Checkpoint(...))`); every reader — `Job`,
the controller, the ledger, the CLI, the server extension, the widget — gets them back from
`EventReader` and folds them with one reducer (`spotnb.core.state.JobState.apply`). The lab
panel's TypeScript types are generated from `json_schema()` (scripts/gen_protocol.py; a test
fails when the checked-in copy drifts).

On disk an event is one JSON line: `{"t": …, "kind": …, "incarnation": …, <fields>}`, and
each segment file starts with a `segment` header carrying `PROTOCOL_VERSION`. Readers are
lenient by design, because a job runs for days and its log may be read by another spotnb
version: a field of the wrong type becomes its type's empty value, a field this version does
not know is kept in `extra`, and a kind it does not know becomes an `UnknownEvent` that views
show as it is — never an exception.

An event also reads like the JSON record it is stored as (`e["step"]`, `e.get("how")`), so
notebooks written against the dict events keep working; code in spotnb uses the attributes,
which mypy checks.

Imports only the standard library: the runtime on the instance uses it too.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:

    class StrEnum(str, Enum):
        """A str whose format and str are its value (enum.StrEnum of Python 3.11+)."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return str(self.value).__format__(spec)


__all__ = [
    "PROTOCOL_VERSION",
    "JobStatus",
    "TERMINAL",
    "Outcome",
    "EventKind",
    "SaveKind",
    "Event",
    "UnknownEvent",
    "EVENT_TYPES",
    "from_json",
    "json_schema",
    "as_metric",
    "fields_of",
    # event kinds
    "Submitted",
    "Status",
    "ControllerRestarted",
    "JobResumed",
    "Allocating",
    "AllocFailed",
    "Moving",
    "CheckpointPlaced",
    "Prices",
    "Launched",
    "Allocated",
    "Started",
    "Files",
    "Ready",
    "Resumed",
    "Metrics",
    "Progress",
    "Heartbeat",
    "Notice",
    "Hint",
    "Checkpoint",
    "CheckpointSkipped",
    "CheckpointFailed",
    "CheckpointInvalid",
    "EmergencySkipped",
    "Evacuating",
    "Evacuated",
    "Done",
    "Error",
    "JobWarning",
    "Stopped",
    "Preempted",
    "Exited",
    "Quorum",
    "SyncChanged",
    "Segment",
]

#: Bumped when a reader of the previous version would misread a log (not when a kind or an
#: optional field is added: readers keep what they do not know).
PROTOCOL_VERSION = 1


class JobStatus(StrEnum):
    """Where a job is. `lost`: its store or job directory vanished; only the job DB says so."""

    PENDING = "pending"
    RUNNING = "running"
    PREEMPTED = "preempted"
    RESTORING = "restoring"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL

    @property
    def is_active(self) -> bool:
        """A controller is (or should be) driving it."""
        return self not in TERMINAL


TERMINAL: frozenset[JobStatus] = frozenset(
    {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.LOST}
)


class Outcome(StrEnum):
    """How one instance (incarnation) ended, as the controller classified it."""

    DONE = "done"  # the function returned; result.pkl written
    PREEMPTED = "preempted"  # the market took the instance
    EVACUATED = "evacuated"  # the agent saved and left after a notice
    LOST = "lost"  # silence past the heartbeat timeout, or its controller died
    STOPPED = "stopped"  # the user stopped the job
    USER_ERROR = "user_error"  # the function raised
    CRASHED = "crashed"  # the process died without a word
    NOT_NEEDED = "not needed"  # a pre-allocated replacement the job did not need
    MOVED = "moved"  # saved and left for an instance in a cheaper zone (Config.migrate)

    @property
    def is_preemption(self) -> bool:
        """Counts as a preemption (the job goes on elsewhere)."""
        return self in (Outcome.PREEMPTED, Outcome.EVACUATED, Outcome.LOST)


class SaveKind(StrEnum):
    """Why a checkpoint was taken."""

    PERIODIC = "periodic"  # the user's save_every, or a static policy's interval
    INSURANCE = "insurance"  # at the optimal interval, when an emergency save would not fit
    EMERGENCY = "emergency"  # after a preemption notice, inside the grace period
    FINAL = "final"  # at the end of the job (kept until the job is collected)
    MANUAL = "manual"  # ctx.save() called by the user
    MOVE = "move"  # before the job moves to another zone (Config.migrate="best-price")


class EventKind(StrEnum):
    SUBMITTED = "submitted"
    STATUS = "status"
    CONTROLLER_RESTARTED = "controller_restarted"
    JOB_RESUMED = "job_resumed"
    ALLOCATING = "allocating"
    ALLOC_FAILED = "alloc_failed"
    MOVING = "moving"
    CHECKPOINT_PLACED = "checkpoint_placed"
    PRICES = "prices"
    LAUNCHED = "launched"
    ALLOCATED = "allocated"
    STARTED = "started"
    FILES = "files"
    READY = "ready"
    RESUMED = "resumed"
    METRICS = "metrics"
    PROGRESS = "progress"
    HEARTBEAT = "heartbeat"
    NOTICE = "notice"
    HINT = "hint"
    CHECKPOINT = "checkpoint"
    CHECKPOINT_SKIPPED = "checkpoint_skipped"
    CHECKPOINT_FAILED = "checkpoint_failed"
    CHECKPOINT_INVALID = "checkpoint_invalid"
    EMERGENCY_SKIPPED = "emergency_skipped"
    EVACUATING = "evacuating"
    EVACUATED = "evacuated"
    DONE = "done"
    ERROR = "error"
    WARNING = "warning"
    STOPPED = "stopped"
    PREEMPTED = "preempted"
    EXITED = "exited"
    SEGMENT = "segment"
    BOOTSTRAP = "bootstrap"
    QUORUM = "quorum"
    SYNC = "sync"


# -- the record types ---------------------------------------------------------------------------
_BASE_FIELDS = ("t", "incarnation", "gen", "extra")


@dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    """Fields every event has. `t`: unix seconds (stamped by the writer); `incarnation`: the
    instance it concerns (0: the job as a whole); `gen`: the lease generation of the controller
    that wrote it (None for the agent and the notebook); `extra`: fields this spotnb does not
    know (from a newer writer), kept and written back unchanged."""

    KIND: ClassVar[EventKind]
    t: float = 0.0
    incarnation: int = 0
    gen: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.KIND.value

    def to_json(self) -> dict[str, Any]:
        """The JSON record, as written to the log."""
        out: dict[str, Any] = {"t": self.t, "kind": self.kind, "incarnation": self.incarnation}
        if self.gen is not None:
            out["gen"] = self.gen
        for name, key, _ in _SPECS[type(self)]:
            out[key] = getattr(self, name)
        if self.extra:
            for k, v in self.extra.items():
                out.setdefault(k, v)
        return out

    def stamped(self, *, t: float, incarnation: int, gen: int | None = None) -> Event:
        """A copy with the writer's stamp (an explicit `t` set by the emitter is kept)."""
        return dataclasses.replace(
            self, t=self.t or t, incarnation=incarnation, gen=gen if gen is not None else self.gen
        )

    # -- reading like the JSON record ------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        if key == "kind":
            return self.kind
        if key in ("t", "incarnation") or (key == "gen" and self.gen is not None):
            return getattr(self, key)
        name = _ATTR_OF[type(self)].get(key)
        if name is not None:
            return getattr(self, name)
        return self.extra[key]

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key, _MISSING) is not _MISSING

    def keys(self) -> list[str]:
        return list(self.to_json())

    def items(self) -> list[tuple[str, Any]]:
        return list(self.to_json().items())


_MISSING = object()


@dataclass(frozen=True, kw_only=True, slots=True)
class UnknownEvent(Event):
    """A kind this spotnb does not know (written by a newer one): kept whole in `extra` and
    shown by the views as it is."""

    name: str

    @property
    def kind(self) -> str:
        return self.name

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"t": self.t, "kind": self.name, "incarnation": self.incarnation}
        if self.gen is not None:
            out["gen"] = self.gen
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out


def _kind(kind: EventKind) -> Callable[[type[Event]], type[Event]]:
    def register(cls: type[Event]) -> type[Event]:
        cls.KIND = kind
        EVENT_TYPES[kind.value] = cls
        return cls

    return register


EVENT_TYPES: dict[str, type[Event]] = {}


# --- written by the notebook (spot.train, spot.resume) and the controller ---------------------
@_kind(EventKind.SUBMITTED)
@dataclass(frozen=True, kw_only=True, slots=True)
class Submitted(Event):
    """The job was submitted. `config`: the public Config (no secrets)."""

    name: str | None
    provider: str
    instance_type: str
    config: dict[str, Any]
    spotnb_version: str | None = None
    detached: bool | None = None
    files: list[dict[str, Any]] = field(default_factory=list)


@_kind(EventKind.STATUS)
@dataclass(frozen=True, kw_only=True, slots=True)
class Status(Event):
    """The job's status changed (the only event that changes it)."""

    status: JobStatus
    reason: str | None = None


@_kind(EventKind.CONTROLLER_RESTARTED)
@dataclass(frozen=True, kw_only=True, slots=True)
class ControllerRestarted(Event):
    """A new controller took the job over; readers drop the older generation's events stamped
    after `previous_expiry` (see EventReader._fenced)."""

    owner: str
    previous_expiry: float | None = None


@_kind(EventKind.JOB_RESUMED)
@dataclass(frozen=True, kw_only=True, slots=True)
class JobResumed(Event):
    """`spot.resume` continued a failed or stopped job."""

    from_status: str
    new_fn: bool
    changed: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)


@_kind(EventKind.ALLOCATING)
@dataclass(frozen=True, kw_only=True, slots=True)
class Allocating(Event):
    """The controller asks the provider for an instance."""

    region: str | None
    attempt: int
    slot: int = 0  # which of the job's instances (Config.instances) this incarnation fills


@_kind(EventKind.ALLOC_FAILED)
@dataclass(frozen=True, kw_only=True, slots=True)
class AllocFailed(Event):
    region: str | None
    reason: str
    retry_in: float


@_kind(EventKind.PRICES)
@dataclass(frozen=True, kw_only=True, slots=True)
class Prices(Event):
    """The spot prices the controller saw (zone → $/h): at each allocation of a job with
    several candidate zones (a list of regions or "cheapest"), and at each look for a move
    (`Config.migrate="best-price"`) when they changed since the last ones it wrote. The widget
    draws them over time."""

    zones: dict[str, Any]  # zone → spot $/h
    source: str = ""


@_kind(EventKind.MOVING)
@dataclass(frozen=True, kw_only=True, slots=True)
class Moving(Event):
    """The controller moves the job (Config.migrate="best-price"): incarnation `incarnation`
    in `from_region` will save and leave once its replacement runs in `to_region`. `saving`:
    the expected $ saved over the remaining work, after `move_cost` (the save and the new
    start); `reason`: the two zones' terms in words. A job on several instances moves one
    replica at a time: `slot` is the replica's lane, `to_incarnation` its new instance (None for
    a job on one instance)."""

    from_region: str | None
    to_region: str
    reason: str
    saving: float
    move_cost: float
    slot: int | None = None
    to_incarnation: int | None = None


@_kind(EventKind.CHECKPOINT_PLACED)
@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointPlaced(Event):
    """Where incarnation `incarnation` (in `zone`) restores from and writes its saves
    (`Config.regional_stores`): `action` "copy" (the newest committed checkpoint was copied
    from `source` to `target`, the zone's store, which then takes the saves), "read_across"
    (it restores from `source` and writes there: a copy would not pay), "in_place" (the
    checkpoint is already in the zone's store) or "fresh" (nothing to restore). `copy_cost`
    and `read_cost`: the two choices' expected $ (bytes × $/GB; reading across also pays each
    of the `saves` expected later saves written back; -1: the job's length is unknown, so
    the copy is taken); `cost`: the $ spent now (the copy, or
    the restore read across), and `save_per_gb` the $/GB each later save of this incarnation
    pays (the ledger's transfer line adds both). Store URLs carry no credentials (refused)."""

    zone: str | None
    action: str
    source: str
    target: str
    seq: int | None = None
    nbytes: int = 0
    saves: float = 0.0
    copy_cost: float = 0.0
    read_cost: float = 0.0
    cost: float = 0.0
    save_per_gb: float = 0.0
    copy_s: float = 0.0
    reason: str = ""


@_kind(EventKind.LAUNCHED)
@dataclass(frozen=True, kw_only=True, slots=True)
class Launched(Event):
    """An instance was requested and exists (recorded before waiting for it, so a controller
    that dies now can find it again)."""

    instance_id: str
    region: str | None
    instance_type: str
    launched_at: float
    info: dict[str, Any] = field(default_factory=dict)


@_kind(EventKind.ALLOCATED)
@dataclass(frozen=True, kw_only=True, slots=True)
class Allocated(Event):
    """The instance runs; billing starts. Prices in $/h."""

    instance_id: str
    region: str | None
    instance_type: str
    alloc_s: float
    launched_at: float | None = None
    info: dict[str, Any] = field(default_factory=dict)
    spot_price: float | None = None
    on_demand_price: float | None = None
    price_source: str | None = None


@_kind(EventKind.PREEMPTED)
@dataclass(frozen=True, kw_only=True, slots=True)
class Preempted(Event):
    """The instance is gone and the job goes on elsewhere. `how`: preempted, evacuated or lost;
    `phase`/`step`/`noticed`: what it was doing when the market killed it (local market)."""

    instance_id: str
    lifetime_s: float
    how: Outcome | None = None
    phase: str | None = None
    step: int | None = None
    noticed: bool | None = None


@_kind(EventKind.EXITED)
@dataclass(frozen=True, kw_only=True, slots=True)
class Exited(Event):
    """The instance ended for any other reason (`reason`: an Outcome)."""

    instance_id: str | None = None
    lifetime_s: float | None = None
    reason: Outcome | None = None
    code: int | None = None


@_kind(EventKind.QUORUM)
@dataclass(frozen=True, kw_only=True, slots=True)
class Quorum(Event):
    """A replica of a job on several instances trains in a new quorum (torchft's lighthouse
    decided who takes part in `step`): `replicas` members, this one is `replica`. `healed`:
    it received the live state from a peer (`heal_s` seconds) instead of reading the store;
    `wait_s`: how long it waited for the quorum."""

    step: int
    replicas: int
    replica: int | None = None
    quorum_id: int = 0
    healed: bool = False
    heal_s: float | None = None
    wait_s: float | None = None


@_kind(EventKind.SYNC)
@dataclass(frozen=True, kw_only=True, slots=True)
class SyncChanged(Event):
    """`sync="auto"` changed how the replicas agree, from `step` on: `sync` ("ddp" or
    "local_sgd") every `every` steps, was `was`; the figures it decided on (averaged over the
    replicas): `compute_s` per step against `comm_s` per all-reduce."""

    step: int
    sync: str
    every: int
    was: str
    compute_s: float
    comm_s: float


@_kind(EventKind.STOPPED)
@dataclass(frozen=True, kw_only=True, slots=True)
class Stopped(Event):
    reason: str | None = None


# --- written by the agent on the instance (and its boot script on a cloud VM) ----------------
@_kind(EventKind.BOOTSTRAP)
@dataclass(frozen=True, kw_only=True, slots=True)
class Bootstrap(Event):
    """The cloud VM's boot script: spotnb installed (`phase` installed: `boot_s` since the VM
    booted, `install_s` installing, `installed` 1 if it had to) or the agent exited (`code`)."""

    phase: str
    cloud: str | None = None
    boot_s: float | None = None
    install_s: float | None = None
    installed: int | None = None
    code: int | None = None


@_kind(EventKind.STARTED)
@dataclass(frozen=True, kw_only=True, slots=True)
class Started(Event):
    """The agent process started (before imports of the user's code and the restore)."""

    pid: int | None = None
    host: str | None = None
    python: str | None = None
    boot_s: float | None = None


@_kind(EventKind.FILES)
@dataclass(frozen=True, kw_only=True, slots=True)
class Files(Event):
    """The agent laid out `Config.files`."""

    count: int
    written: int
    workdir: str


@_kind(EventKind.READY)
@dataclass(frozen=True, kw_only=True, slots=True)
class Ready(Event):
    """First step about to run: `prep_s` from process start (restore included)."""

    prep_s: float
    step: int
    total: int | None = None


@_kind(EventKind.RESUMED)
@dataclass(frozen=True, kw_only=True, slots=True)
class Resumed(Event):
    """The state was restored from checkpoint `seq`. `group_round`: a torchrun group's
    rendezvous round on this instance (1: its first; more: the group restarted around a lost
    peer without this instance being relaunched); None outside torchrun groups."""

    from_step: int
    seq: int
    save_kind: SaveKind | None = None
    restore_s: float | None = None
    group_round: int | None = None


@_kind(EventKind.METRICS)
@dataclass(frozen=True, kw_only=True, slots=True)
class Metrics(Event):
    """Rows logged since the last flush: `[{step, t, <name>: value, ...}, ...]` (one event per
    flush, not per step). Values are finite numbers or null."""

    rows: list[dict[str, Any]] = field(default_factory=list)


@_kind(EventKind.PROGRESS)
@dataclass(frozen=True, kw_only=True, slots=True)
class Progress(Event):
    """Cumulative time accounts of this instance (the ledger reads only the latest)."""

    step: int
    total: int | None = None
    steps_done: int = 0
    compute_s: float = 0.0
    recompute_s: float = 0.0
    save_s: float = 0.0
    step_time: float | None = None


@_kind(EventKind.HEARTBEAT)
@dataclass(frozen=True, kw_only=True, slots=True)
class Heartbeat(Event):
    step: int | None = None


@_kind(EventKind.NOTICE)
@dataclass(frozen=True, kw_only=True, slots=True)
class Notice(Event):
    """The cloud announced a preemption. `deadline`: unix seconds; `source`: aws|azure|gcp."""

    deadline: float
    source: str
    action: str | None = None
    time_left: float | None = None


@_kind(EventKind.HINT)
@dataclass(frozen=True, kw_only=True, slots=True)
class Hint(Event):
    """A raised risk without a deadline (AWS rebalance recommendation): save while it is cheap."""

    source: str
    hint: str


@_kind(EventKind.CHECKPOINT)
@dataclass(frozen=True, kw_only=True, slots=True)
class Checkpoint(Event):
    """A checkpoint was committed (its manifest is in the store). `nbytes` (`bytes` in JSON)
    is what it wrote; `referenced_bytes` what it lists from earlier checkpoints instead of
    writing it again (unchanged frozen tensors, backed-up files already stored)."""

    seq: int
    save_kind: SaveKind
    step: int
    snapshot_s: float
    upload_s: float
    nbytes: int = field(default=0, metadata={"json": "bytes"})
    referenced_bytes: int = 0


@_kind(EventKind.CHECKPOINT_SKIPPED)
@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointSkipped(Event):
    step: int
    save_kind: SaveKind | None
    reason: str


@_kind(EventKind.CHECKPOINT_FAILED)
@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointFailed(Event):
    step: int
    save_kind: SaveKind | None
    error: str


@_kind(EventKind.CHECKPOINT_INVALID)
@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointInvalid(Event):
    """A checkpoint failed verification on restore and was passed over."""

    seq: int | None
    step: int | None
    reason: str


@_kind(EventKind.EMERGENCY_SKIPPED)
@dataclass(frozen=True, kw_only=True, slots=True)
class EmergencySkipped(Event):
    """The notice left too little time for an emergency save, so none was started: `needed`
    is the estimated snapshot + upload time of the `nbytes` (`bytes` in JSON) it would have
    written (only what changed since the last save), `reason` says so in words."""

    step: int
    time_left: float
    needed: float
    nbytes: int = field(default=0, metadata={"json": "bytes"})
    reason: str = ""


@_kind(EventKind.EVACUATING)
@dataclass(frozen=True, kw_only=True, slots=True)
class Evacuating(Event):
    step: int
    time_left: float


@_kind(EventKind.EVACUATED)
@dataclass(frozen=True, kw_only=True, slots=True)
class Evacuated(Event):
    """The agent saved and left cleanly after a notice."""

    step: int


@_kind(EventKind.DONE)
@dataclass(frozen=True, kw_only=True, slots=True)
class Done(Event):
    """The function returned; `result` is the store path of the signed result."""

    result: str
    step: int


@_kind(EventKind.ERROR)
@dataclass(frozen=True, kw_only=True, slots=True)
class Error(Event):
    message: str
    exc_type: str | None = None
    traceback: str = ""


@_kind(EventKind.WARNING)
@dataclass(frozen=True, kw_only=True, slots=True)
class JobWarning(Event):
    """Something the user should know (no net progress, a value that is no number, …)."""

    message: str
    metric: str | None = None
    step: int | None = None
    stalled: int | None = None
    restart_from_zero: bool | None = None
    high_water: int | None = None


@_kind(EventKind.SEGMENT)
@dataclass(frozen=True, kw_only=True, slots=True)
class Segment(Event):
    """First line of every segment file: who writes it, in which protocol version. Readers
    consume it; it is not a job event."""

    protocol: int
    writer: str


# -- reading ------------------------------------------------------------------------------------
def as_metric(value: Any) -> float | None:
    """A logged value as a finite float, or None when it is no number a chart can draw (a
    string, null, NaN, an infinity, an integer beyond float range). Readers use it so that
    no value in any log, however odd or from whichever writer, can stop them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:
            return None
    return None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else (None if value is None else str(value))


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _enum(cls: type[StrEnum]) -> Callable[[Any], Any]:
    values = {m.value: m for m in cls}

    def coerce(value: Any) -> Any:
        if not isinstance(value, str):
            return None
        return values.get(value, value)  # a value of a newer spotnb stays a plain string

    return coerce


def _of(kind: type) -> Callable[[Any], Any]:
    return lambda value: value if isinstance(value, kind) else None


# (python type, coercer, empty value when required and missing or unusable, JSON Schema)
_TYPES: dict[str, tuple[Callable[[Any], Any], Any, dict[str, Any]]] = {
    "float": (as_metric, 0.0, {"type": "number"}),
    "int": (_int, 0, {"type": "integer"}),
    "str": (_str, "", {"type": "string"}),
    "bool": (_bool, False, {"type": "boolean"}),
    "dict[str, Any]": (_of(dict), {}, {"type": "object"}),
    "list[dict[str, Any]]": (_of(list), [], {"type": "array", "items": {"type": "object"}}),
    "list[str]": (_of(list), [], {"type": "array", "items": {"type": "string"}}),
    "JobStatus": (_enum(JobStatus), JobStatus.PENDING, {"$ref": "#/$defs/JobStatus"}),
    "Outcome": (_enum(Outcome), None, {"$ref": "#/$defs/Outcome"}),
    "SaveKind": (_enum(SaveKind), None, {"$ref": "#/$defs/SaveKind"}),
}

# coercers of fields whose empty value would be a claim (a status of `pending`), not a blank
_DECISIVE = {_TYPES[name][0] for name in ("JobStatus",)}

# per event type: (attribute, JSON key, coercer, empty value, required, optional, schema)
_FieldSpec = tuple[str, str, Callable[[Any], Any], Any, bool, bool, dict[str, Any]]
_SPECS: dict[type[Event], list[tuple[str, str, Callable[[Any], Any]]]] = {}
_FULL: dict[type[Event], list[_FieldSpec]] = {}
_ATTR_OF: dict[type[Event], dict[str, str]] = {}


def _describe(cls: type[Event]) -> None:
    specs: list[_FieldSpec] = []
    for f in dataclasses.fields(cls):
        if f.name in _BASE_FIELDS:
            continue
        annotation = str(f.type)
        optional = annotation.endswith(" | None")
        base = annotation.removesuffix(" | None")
        coerce, empty, schema = _TYPES[base]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if not required:
            factory = f.default_factory
            empty = (
                f.default
                if f.default is not dataclasses.MISSING
                else (factory() if callable(factory) else None)
            )
        elif optional:
            empty = None
        specs.append((f.name, f.metadata.get("json", f.name), coerce, empty, required, optional, schema))
    _FULL[cls] = specs
    _SPECS[cls] = [(s[0], s[1], s[2]) for s in specs]
    _ATTR_OF[cls] = {s[1]: s[0] for s in specs}


for _cls in (*EVENT_TYPES.values(), UnknownEvent):
    if _cls is not UnknownEvent:
        _describe(_cls)
_SPECS[UnknownEvent], _FULL[UnknownEvent], _ATTR_OF[UnknownEvent] = [], [], {}
_KNOWN_KEYS = {
    cls: {"t", "kind", "incarnation", "gen", *(s[1] for s in _FULL[cls])} for cls in EVENT_TYPES.values()
}


def from_json(doc: Mapping[str, Any]) -> Event:
    """The typed event of one JSON record (already checked to have a string `kind`). Never
    raises for odd values: see the module docstring."""
    kind = doc.get("kind")
    t = as_metric(doc.get("t"))
    inc = _int(doc.get("incarnation"))
    gen = _int(doc.get("gen"))
    cls = EVENT_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        extra = {k: v for k, v in doc.items() if k not in ("t", "kind", "incarnation", "gen")}
        return UnknownEvent(name=str(kind), t=t or 0.0, incarnation=inc or 0, gen=gen, extra=extra)
    values: dict[str, Any] = {}
    for name, key, coerce, empty, required, optional, _schema in _FULL[cls]:
        value = coerce(doc.get(key)) if key in doc else None
        if value is None and required and not optional and coerce in _DECISIVE:
            # a status (or other enum) nobody can read must not become a default one: the
            # record is kept and shown as it is, and changes nothing
            extra = {k: v for k, v in doc.items() if k not in ("t", "kind", "incarnation", "gen")}
            return UnknownEvent(name=str(kind), t=t or 0.0, incarnation=inc or 0, gen=gen, extra=extra)
        values[name] = empty if value is None else value
    known = _KNOWN_KEYS[cls]
    extra = {k: v for k, v in doc.items() if k not in known}
    return cls(t=t or 0.0, incarnation=inc or 0, gen=gen, extra=extra, **values)


def fields_of(cls: type[Event]) -> Iterator[tuple[str, str]]:
    """(attribute, JSON key) of each kind-specific field."""
    for name, key, *_ in _FULL[cls]:
        yield name, key


# -- the schema the TypeScript side is generated from ---------------------------------------------
def json_schema() -> dict[str, Any]:
    """JSON Schema (2020-12) of the protocol: one `$defs` entry per event kind, the enums, and
    the version. scripts/gen_protocol.py turns it into the extension's TypeScript types."""
    defs: dict[str, Any] = {
        "JobStatus": {
            "type": "string",
            "enum": [s.value for s in JobStatus],
            "terminal": sorted(s.value for s in TERMINAL),
        },
        "Outcome": {"type": "string", "enum": [o.value for o in Outcome]},
        "SaveKind": {"type": "string", "enum": [k.value for k in SaveKind]},
        "EventKind": {"type": "string", "enum": [k.value for k in EventKind]},
    }
    base = {"t": {"type": "number"}, "incarnation": {"type": "integer"}, "gen": {"type": "integer"}}
    for kind, cls in EVENT_TYPES.items():
        props: dict[str, Any] = {"kind": {"const": kind}, **base}
        required = ["t", "kind", "incarnation"]
        for _name, key, _c, _e, req, optional, schema in _FULL[cls]:
            props[key] = {"anyOf": [schema, {"type": "null"}]} if optional else schema
            if req:
                required.append(key)
        defs[cls.__name__] = {
            "type": "object",
            "description": (cls.__doc__ or "").strip(),
            "properties": props,
            "required": required,
            "additionalProperties": True,
        }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://spotnb.dev/schema/protocol.json",
        "title": "spotnb event protocol",
        "protocol_version": PROTOCOL_VERSION,
        "oneOf": [{"$ref": f"#/$defs/{cls.__name__}"} for cls in EVENT_TYPES.values()],
        "$defs": defs,
    }
