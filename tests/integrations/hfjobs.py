"""Training functions the Hugging Face tests ship to local instances."""

from __future__ import annotations

import time
from typing import Any


def tiny_gpt2(
    ctx: Any,
    out: str = "hf-out",
    steps: int = 40,
    step_delay: float = 0.0,
    plain: bool = False,
    accum: int = 1,
) -> dict[str, Any]:
    """A 2-layer GPT-2 built from a config (no download), synthetic token ids, dropout on, a
    shuffled sampler over 2.5 epochs, AdamW with a linear schedule: every piece of state the
    Trainer's resume must restore exactly. One intra-op thread (see tests/support/jobfns.py).
    `plain`: call `trainer.train()` as code written without spotnb does; `accum`: micro-batches
    per optimizer step (gradient accumulation)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from spotnb.integrations import hf

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (64, 16), generator=g)
    data = [{"input_ids": row, "labels": row} for row in ids]

    class Slow(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if step_delay:
                time.sleep(step_delay)  # room for the notice to arrive mid-training
            return control

    args = TrainingArguments(
        output_dir=out,
        max_steps=steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=accum,
        learning_rate=1e-3,
        lr_scheduler_type="linear",
        warmup_steps=5,
        logging_steps=5,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Slow()])
    out_ = trainer.train() if plain else hf.train(ctx, trainer)
    return {
        "weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "loss": out_.training_loss,
        "resumed_from": ctx.resumed_from,
    }
