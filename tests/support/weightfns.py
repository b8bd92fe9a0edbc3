"""Training functions the weights-out tests (tests/api/test_weights_out.py) ship to local
instances."""

from __future__ import annotations

from typing import Any


def tied_lm(ctx: Any, steps: int = 20, every: int = 5) -> dict[str, Any]:
    """A tiny language model whose output layer shares the embedding's weight (tied, as GPT-2's
    are) and that carries a frozen 64 kB projection (stored by content, `runtime/checkpoint/incremental.py`),
    trained with Adam; `ctx.state` counts the steps. Its checkpoints take every format a save
    writes: the first a whole-state copy with a new blob, the later ones gated into
    `tensors.bin` with the blob referenced. Each save commits before the next step (none is
    superseded), so there is one checkpoint every `every` steps. Returns the weights after
    every `every` steps (what the checkpoints of those steps hold) and at the end."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    emb = torch.nn.Embedding(16, 8)
    head = torch.nn.Linear(8, 16, bias=False)
    head.weight = emb.weight  # tied
    frozen = torch.nn.Linear(128, 128, bias=False).requires_grad_(False)
    model = torch.nn.ModuleDict({"emb": emb, "head": head, "frozen": frozen})
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ctx.track(model=model, optimizer=opt)
    ctx.state.setdefault("seen", 0)
    at: dict[int, dict[str, Any]] = {}
    for step in ctx.steps(steps):
        if step % every == 0 and step:  # the boundary just saved: let it commit (a save taken
            ctx._ckpt.wait(timeout=60)  # while one is queued supersedes it), one checkpoint a save
        x = torch.randint(0, 16, (32,), generator=torch.Generator().manual_seed(step))
        loss = torch.nn.functional.cross_entropy(head(torch.tanh(emb(x))), (x + 1) % 16)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.state["seen"] += 1
        if (step + 1) % every == 0:
            at[step + 1] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {"at": at, "final": {k: v.detach().clone() for k, v in model.state_dict().items()}}
