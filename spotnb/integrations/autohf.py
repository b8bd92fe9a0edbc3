"""A `transformers.Trainer` built inside a spotnb job is put under spotnb by itself.

A function that calls `trainer.train()` (instead of `spotnb.integrations.hf.train(ctx,
trainer)`) would train without saves, notices or resume: the Trainer knows nothing of spotnb.
So, in a job's process, the first import of `transformers.trainer` patches `Trainer.train`:
called with no `resume_from_checkpoint`, it runs as `hf.train(ctx, trainer)` does — adds
`SpotCallback`, restores the newest checkpoint and resumes from it — and says so once in the
event feed. A call that names `resume_from_checkpoint` is the user's choice and is left alone
(with a warning: spotnb's saves still happen, its resume does not). Outside a spotnb job, and
in a process that never imports transformers, nothing is patched or imported.

Why a post-import hook rather than importing transformers up front: the agent must not pay
transformers' import time (seconds) for jobs that do not use it, and `import spotnb` never
imports it. The hook is a `sys.meta_path` finder that wraps the loader of `transformers.trainer`
(what `from transformers import Trainer` loads, through transformers' lazy module) and patches
the class once the module has run.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from typing import Any

__all__ = ["install", "patch_trainer"]

_TARGET = "transformers.trainer"
_PATCHED = "_spotnb_patched"


def install(ctx: Any) -> None:
    """Arrange for `Trainer.train` to run under `ctx` (now if transformers' trainer module is
    already imported, else when it is)."""
    module = sys.modules.get(_TARGET)
    if module is not None:
        patch_trainer(module, ctx)
        return
    if not any(isinstance(f, _TrainerHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _TrainerHook(ctx))


def patch_trainer(module: Any, ctx: Any) -> None:
    """Wrap `module.Trainer.train` (once)."""
    trainer_cls = getattr(module, "Trainer", None)
    if trainer_cls is None or getattr(trainer_cls.train, _PATCHED, False):
        return
    original = trainer_cls.train

    @functools.wraps(original)
    def train(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "_spotnb_driving", False):  # hf.train's own call: the real thing
            return original(self, *args, **kwargs)
        from spotnb.integrations import hf

        if args or "resume_from_checkpoint" in kwargs:
            ctx.warn(
                "trainer.train(resume_from_checkpoint=...) inside a spotnb job: spotnb saves and "
                "hears notices, but resumes from your checkpoint, not its own; call "
                "trainer.train() or spotnb.integrations.hf.train(ctx, trainer) for exact resume"
            )
            if not any(isinstance(cb, hf.SpotCallback) for cb in self.callback_handler.callbacks):
                self.add_callback(hf.SpotCallback(ctx))
            return original(self, *args, **kwargs)
        ctx.warn(
            "trainer.train() runs under spotnb (saves, notices and exact resume as "
            "spotnb.integrations.hf.train(ctx, trainer) would)"
        )
        return hf.train(ctx, self, **kwargs)

    setattr(train, _PATCHED, True)
    trainer_cls.train = train


class _TrainerHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when `transformers.trainer` is found by the other finders, its
    loader is wrapped so the class is patched right after the module ran."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != _TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _PatchingLoader(spec.loader, self.ctx)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, ctx: Any) -> None:
        self.loader, self.ctx = loader, ctx

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        patch_trainer(module, self.ctx)
