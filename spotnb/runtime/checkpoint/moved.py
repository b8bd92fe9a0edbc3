"""Checkpoints written before spotnb's modules moved into folders still restore.

A checkpoint's `state.pt` is a pickle: besides tensors it names the classes of what it holds by
module path (the chunked drain's references, incremental saves' blob references, a sharded
save's state). Those modules moved in the re-layout by question (issue 27), so an older
checkpoint names paths that no longer exist; `torch.load(..., pickle_module=pickle_module)`
reads it through an unpickler that maps each old path to its new one. A user's own classes are
untouched: only spotnb's moved modules are in the table.
"""

from __future__ import annotations

import pickle
import types
from typing import IO, Any

__all__ = ["MOVED", "pickle_module"]

#: old module path -> where it lives now
MOVED: dict[str, str] = {
    "spotnb.billing": "spotnb.core.billing",
    "spotnb.config": "spotnb.settings.config",
    "spotnb.controller": "spotnb.control.controller",
    "spotnb.doctor": "spotnb.doctor.report",
    "spotnb.doctor_aws": "spotnb.doctor.aws",
    "spotnb.doctor_azure": "spotnb.doctor.azure",
    "spotnb.doctor_core": "spotnb.doctor.checks",
    "spotnb.doctor_gcp": "spotnb.doctor.gcp",
    "spotnb.durations": "spotnb.core.durations",
    "spotnb.events": "spotnb.core.events",
    "spotnb.files": "spotnb.core.files",
    "spotnb.fleet": "spotnb.control.fleet",
    "spotnb.forecast": "spotnb.market.forecast",
    "spotnb.gpus": "spotnb.market.gpus",
    "spotnb.home": "spotnb.core.home",
    "spotnb.html_safe": "spotnb.views.html_safe",
    "spotnb.jobdb": "spotnb.control.jobdb",
    "spotnb.ledger": "spotnb.core.ledger",
    "spotnb.logs": "spotnb.views.logs",
    "spotnb.migration": "spotnb.market.migration",
    "spotnb.palette": "spotnb.views.palette",
    "spotnb.placement": "spotnb.market.placement",
    "spotnb.plan_view": "spotnb.views.plan_view",
    "spotnb.preempt": "spotnb.market.preempt",
    "spotnb.price_cache": "spotnb.market.price_cache",
    "spotnb.prices": "spotnb.market.prices",
    "spotnb.protocol": "spotnb.core.protocol",
    "spotnb.providers.any_settings": "spotnb.settings.any",
    "spotnb.providers.aws": "spotnb.providers.aws.provider",
    "spotnb.providers.aws_settings": "spotnb.settings.aws",
    "spotnb.providers.azure": "spotnb.providers.azure.provider",
    "spotnb.providers.azure_coordinator": "spotnb.providers.azure.coordinator",
    "spotnb.providers.azure_settings": "spotnb.settings.azure",
    "spotnb.providers.gcp": "spotnb.providers.gcp.provider",
    "spotnb.providers.gcp_catalog": "spotnb.providers.gcp.catalog",
    "spotnb.providers.gcp_coordinator": "spotnb.providers.gcp.coordinator",
    "spotnb.providers.gcp_errors": "spotnb.providers.gcp.errors",
    "spotnb.providers.gcp_settings": "spotnb.settings.gcp",
    "spotnb.providers.gcp_zones": "spotnb.providers.gcp.zones",
    "spotnb.providers.local_settings": "spotnb.settings.local",
    "spotnb.regional": "spotnb.market.regional",
    "spotnb.runtime.checkpoint": "spotnb.runtime.checkpoint.checkpointer",
    "spotnb.runtime.chunked": "spotnb.runtime.checkpoint.chunked",
    "spotnb.runtime.digest": "spotnb.runtime.checkpoint.digest",
    "spotnb.runtime.elastic": "spotnb.runtime.group.elastic",
    "spotnb.runtime.incremental": "spotnb.runtime.checkpoint.incremental",
    "spotnb.runtime.lighthouse": "spotnb.runtime.group.lighthouse",
    "spotnb.runtime.local_group": "spotnb.runtime.group.local",
    "spotnb.runtime.local_rank": "spotnb.runtime.group.local_rank",
    "spotnb.runtime.script": "spotnb.runtime.script.runner",
    "spotnb.runtime.script_client": "spotnb.runtime.script.client",
    "spotnb.runtime.sharded": "spotnb.runtime.checkpoint.sharded",
    "spotnb.runtime.sharded_state": "spotnb.runtime.checkpoint.sharded_state",
    "spotnb.runtime.staging": "spotnb.runtime.checkpoint.staging",
    "spotnb.runtime.torchrun_group": "spotnb.runtime.group.torchrun",
    "spotnb.runtime.torchrun_worker": "spotnb.runtime.group.torchrun_worker",
    "spotnb.savings": "spotnb.core.savings",
    "spotnb.server.data": "spotnb.views.server.data",
    "spotnb.server.handlers": "spotnb.views.server.handlers",
    "spotnb.shipping": "spotnb.providers.shipping",
    "spotnb.signing": "spotnb.core.signing",
    "spotnb.sizes": "spotnb.core.sizes",
    "spotnb.spec": "spotnb.core.spec",
    "spotnb.state": "spotnb.core.state",
    "spotnb.store": "spotnb.core.store",
    "spotnb.store_lease": "spotnb.control.lease",
    "spotnb.supervise": "spotnb.control.supervise",
    "spotnb.sync": "spotnb.core.sync",
    "spotnb.transfer": "spotnb.market.transfer",
    "spotnb.widget.figures": "spotnb.views.widget.figures",
    "spotnb.widget.responsive": "spotnb.views.widget.responsive",
    "spotnb.widget.synthetic": "spotnb.views.widget.synthetic",
    "spotnb.widget.text": "spotnb.views.widget.text",
    "spotnb.widget.view": "spotnb.views.widget.view",
    "spotnb.providers.local": "spotnb.providers.local.provider",
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(MOVED.get(module, module), name)


def _load(file: IO[bytes], **kwargs: Any) -> Any:
    return _Unpickler(file, **kwargs).load()


#: what `torch.load(pickle_module=...)` needs: an `Unpickler` (torch subclasses it) and `load`
pickle_module = types.SimpleNamespace(Unpickler=_Unpickler, load=_load, __name__="spotnb_moved_pickle")
