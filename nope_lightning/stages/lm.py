"""The causal-LM LightningModule shared by the training stages (pretrain, finetune, headscale).

Subclasses override one hook: ``trainable_parameters`` (what the optimizer sees) and, if needed,
``param_groups``. Batches are (B, T+1) token windows: inputs ``[:, :-1]``, targets ``[:, 1:]``.
Logged: ``train/loss`` (nats/token), ``train/lr``, ``val/len{T}/loss`` and ``val/len{T}/ppl``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule

from nope_lightning.config import OptimConfig
from nope_lightning.model import GPT


def warmup_cosine(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """LR multiplier: linear warm-up over ``warmup`` steps, then cosine from 1 to ``min_ratio`` at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy (nats) of logits (B, T, V) against targets (B, T), computed in float32."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction=reduction)


class CausalLM(LightningModule):
    """Next-token training of a ``GPT`` with AdamW and warm-up + cosine decay."""

    def __init__(self, model: GPT, optim: OptimConfig, max_steps: int, compile: bool = False) -> None:
        super().__init__()
        self.model, self.optim, self.max_steps = model, optim, max_steps
        self.compile = compile

    def configure_model(self) -> None:
        if self.compile and "_compiled" not in self.__dict__:
            # Kept outside the module tree: the compiled wrapper shares the weights, and the state-dict keys
            # (checkpoints, exports) stay those of the plain model.
            object.__setattr__(self, "_compiled", torch.compile(self.model))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (B, T) -> logits (B, T, V), through the compiled model when ``compile`` is on."""
        return self.__dict__.get("_compiled", self.model)(idx)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Norm clipping; under FSDP the sharded module clips (Lightning refuses its generic path there)."""
        if not gradient_clip_val:
            return
        from lightning.pytorch.strategies import FSDPStrategy

        if isinstance(self.trainer.strategy, FSDPStrategy):
            self.trainer.strategy.model.clip_grad_norm_(gradient_clip_val)
        else:
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def trainable_parameters(self) -> dict[str, torch.nn.Parameter]:
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}

    def param_groups(self) -> list[dict]:
        """Weight decay on matrices only (not norms, gains or temperatures), as in GPT-2/nanoGPT."""
        params = self.trainable_parameters().values()
        return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": self.optim.weight_decay},
                {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]

    def configure_optimizers(self):
        o = self.optim
        groups = [g for g in self.param_groups() if g["params"]]
        optimizer = torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: warmup_cosine(step, o.warmup_steps, self.max_steps, o.min_lr_ratio))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = lm_loss(self(batch[:, :-1]), batch[:, 1:])
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        # All validation batches have the same shape, so the epoch mean of batch means is token-weighted.
        loss = lm_loss(self(batch[:, :-1]), batch[:, 1:])
        length = batch.size(1) - 1
        self.log(f"val/len{length}/loss", loss, sync_dist=True, prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        for key, value in list(self.trainer.callback_metrics.items()):
            if key.startswith("val/") and key.endswith("/loss"):
                self.log(key.removesuffix("loss") + "ppl", torch.exp(value), sync_dist=True)
