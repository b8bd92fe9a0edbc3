"""Training functions the Lightning tests ship to local instances."""

from __future__ import annotations

import os
import signal
import time
from typing import Any


def _parts(noise: bool = True, workers: int = 0, val: bool = False) -> tuple[Any, Any]:
    """A tiny LightningModule (dropout, AdamW, a per-step LR schedule, a logged loss) and a
    datamodule whose shuffled loader adds random noise to each sample in `__getitem__`: every
    piece of state an exact resume must restore, the data order and the RNG included."""
    import lightning as L
    import torch
    from torch import nn

    class Noisy(torch.utils.data.Dataset):
        def __init__(self) -> None:
            g = torch.Generator().manual_seed(1)
            self.x = torch.randn(40, 8, generator=g)
            self.y = torch.randn(40, 1, generator=g)

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i: int) -> Any:
            x = self.x[i] + (0.1 * torch.randn(8) if noise else 0)  # the main process's RNG
            return x, self.y[i]

    class Data(L.LightningDataModule):
        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(Noisy(), batch_size=4, shuffle=True, num_workers=workers)

    class ValData(Data):
        def val_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(Noisy(), batch_size=8, shuffle=True)

    class Net(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.log("loss", loss)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self) -> Any:
            opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    return Net, (ValData if val else Data)


def tiny(
    ctx: Any,
    root: str,
    steps: int = 25,
    step_delay: float = 0.0,
    workers: int = 0,
    val: bool = False,
    sigterm_at: int | None = None,
) -> dict[str, Any]:
    """`steps` optimizer steps over 10 batches an epoch, through `lightning.fit`. One intra-op
    thread (see tests/support/jobfns.py)."""
    import lightning as L
    import torch

    from spotnb.integrations import lightning as spot_lightning

    torch.set_num_threads(1)
    torch.manual_seed(0)
    Net, Data = _parts(workers=workers, val=val)
    model = Net()

    class Slow(L.Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            if step_delay:
                time.sleep(step_delay)  # room for the notice to arrive mid-training
            if sigterm_at is not None and args[0].global_step == sigterm_at:
                os.kill(os.getpid(), signal.SIGTERM)  # as a GCP soft-off would

    trainer = L.Trainer(
        max_steps=steps,
        default_root_dir=root,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=5,
        callbacks=[Slow()],
    )
    spot_lightning.fit(ctx, trainer, model, datamodule=Data())
    return {
        "weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "step": trainer.global_step,
        "resumed_from": ctx.resumed_from,
    }


def fabric_tiny(
    ctx: Any, steps: int = 30, step_delay: float = 0.0, hold_at: int | None = None
) -> dict[str, Any]:
    """A hand-written Fabric loop over the same shuffled, noisy loader (10 batches an epoch):
    dropout, AdamW and a per-step LR schedule, driven by `fabric_batches`. `hold_at`: the first
    incarnation waits at that step until the market's notice has reached it (at most 60 s), so
    that it is acted on at the next step boundary however loaded the machine."""
    import lightning as L
    import torch
    from torch import nn

    from spotnb.integrations.fabric import fabric_batches

    torch.set_num_threads(1)
    torch.manual_seed(0)
    Net, Data = _parts()
    fabric = L.Fabric(accelerator="cpu", devices=1)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.5)
    model, opt = fabric.setup(net, opt)
    loader = fabric.setup_dataloaders(Data().train_dataloader())
    ctx.track(model=model, optimizer=opt, scheduler=sched)
    for _step, (x, y) in fabric_batches(ctx, loader, steps):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        fabric.backward(loss)
        opt.step()
        sched.step()
        ctx.log(loss=loss.item())
        if step_delay:
            time.sleep(step_delay)
        if _step == hold_at and ctx.incarnation == 1:
            deadline = time.monotonic() + 60
            while ctx.notice is None and time.monotonic() < deadline:
                time.sleep(0.01)
    return {"weights": {k: v.detach().clone() for k, v in net.state_dict().items()}, "step": ctx.step_index}
