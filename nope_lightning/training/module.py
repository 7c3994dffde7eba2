"""The causal-LM LightningModule shared by the training stages (pretrain, finetune, headscale, synthetic), the
trained model gathered on rank 0 (``trained_state``, ``trained_model``), and the checks on a loaded model's
inputs that the length-extension stages share (``check_tokenizer``; the target-length check is ``budget.py``'s).

Subclasses override one hook: ``trainable_parameters`` (what the optimizer sees) and, if needed,
``param_groups``. Batches are (B, T+1) token windows: inputs ``[:, :-1]``, targets ``[:, 1:]``.
Logged: ``train/loss`` (nats/token), ``train/lr``, ``val/len{T}/loss`` and ``val/len{T}/ppl``.
Under ``trainer.strategy=fsdp2`` the model is sharded by ``FSDP2Strategy``, defined here beside the module it
shards (each checks the other's type).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
from torch.distributed._composable import checkpoint as checkpoint_activations
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from nope_lightning.config.parts import OptimConfig, TrainerConfig
from nope_lightning.data.prepare import PreparedData
from nope_lightning.model.checkpoint import LoadedModel, legacy_renamed
from nope_lightning.model.gpt import GPT
from nope_lightning.training.memory import footprint, needs_checkpointing


def warmup_cosine(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """LR multiplier: linear warm-up over ``warmup`` steps, then cosine from 1 to ``min_ratio`` at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


# --- checks and state shared by the stages that train a loaded model (headscale, finetune) ---------------


def check_tokenizer(prepared: PreparedData, loaded: LoadedModel) -> None:
    """The prepared data must be tokenized with the tokenizer the checkpoint was trained with."""
    data_sha, model_sha = prepared.tokenizer.fingerprint, loaded.meta.get("tokenizer_sha256", "")
    if data_sha != model_sha:
        raise ValueError(f"wrong tokenizer: the prepared data {prepared.root} is tokenized with {data_sha[:12]}, "
                         f"checkpoint {loaded.folder} was trained with {model_sha[:12] or 'an unknown one'}; "
                         f"its corpus/vocab_size/cache must match the checkpoint's data config")


def trained_state(trainer) -> dict[str, torch.Tensor]:
    """The trained GPT's full state dict (keys without the ``model.`` prefix) on global rank 0, ``{}``
    elsewhere. Every rank must call it: under FSDP this is where the shards are gathered."""
    state = trainer.strategy.lightning_module_state_dict()
    if not trainer.is_global_zero:
        return {}
    return {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``tensor``: its local shard under fsdp2 (a DTensor), the tensor itself otherwise."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def trained_model(trainer, model: GPT) -> GPT | None:
    """The trained ``model`` as a plain, unsharded GPT on global rank 0 (what an export saves), None elsewhere.
    Every rank must call it. Under FSDP ``model`` itself holds only this rank's shards, so rank 0 builds a
    fresh GPT of the same architecture and loads the gathered full state into it; otherwise ``model`` is
    already whole and is returned as it is."""
    if not isinstance(trainer.strategy, (FSDPStrategy, FSDP2Strategy)):
        return model if trainer.is_global_zero else None
    state = trained_state(trainer)
    if not trainer.is_global_zero:
        return None
    plain = GPT(model.cfg, model.config.vocab_size, model.train_len)
    plain.load_state_dict(state, strict=True)
    return plain


def compile_blocks(model: GPT) -> None:
    """``torch.compile`` each transformer block's ``forward`` in place (``trainer.compile``).

    Only the forward is compiled, not the module's call: FSDP2's all-gather/reshard hooks and activation
    checkpointing's hooks stay eager around it (no graph break at every hook), the parameter names (state dicts,
    checkpoints, exports) stay the plain model's, and the blocks share one compiled graph (their code is the
    same; dynamo treats the parameters as inputs). Inductor fuses what eager runs as separate kernels: the
    norms, SwiGLU's gate, the residual adds and the temperature fold."""
    for block in model.transformer.h:
        block.forward = torch.compile(block.forward)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy (nats) of logits (B, T, V) against targets (B, T), computed in float32."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction=reduction)


class CausalLM(LightningModule):
    """Next-token training of a ``GPT`` with AdamW and warm-up + cosine decay."""

    def __init__(self, model: GPT, optim: OptimConfig, max_steps: int, compile: bool = False) -> None:
        """``compile``: compile each block (``compile_blocks``) once the model is sharded."""
        super().__init__()
        self.model, self.optim, self.max_steps = model, optim, max_steps
        self.compile, self.compiled = compile, False

    def configure_model(self) -> None:
        """Shard the model under fsdp2 (once: Lightning calls this hook again for a ``validate`` after ``fit``),
        then compile its blocks when ``compile`` is on (once too)."""
        if isinstance(self.trainer.strategy, FSDP2Strategy) and not isinstance(self.model, FSDPModule):
            self.trainer.strategy.shard(self.model)
        if self.compile and not self.compiled:
            compile_blocks(self.model)
            self.compiled = True

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (B, T) -> logits (B, T, V)."""
        return self.model(idx)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Norm clipping. Under FSDP1 the sharded module clips (Lightning refuses its generic path there); under
        FSDP2 the gradients are DTensors, whose norm torch's ``clip_grad_norm_`` reduces over the shards."""
        if not gradient_clip_val:
            return
        if isinstance(self.trainer.strategy, FSDPStrategy):
            self.trainer.strategy.model.clip_grad_norm_(gradient_clip_val)
        else:
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """A run killed before the temperature tensors were renamed resumes with its own values: old names are
        mapped to the current ones (``checkpoint.legacy_renamed``) before the state is loaded."""
        checkpoint["state_dict"] = {legacy_renamed(k): v for k, v in checkpoint["state_dict"].items()}

    def trainable_parameters(self) -> dict[str, torch.nn.Parameter]:
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}

    def param_groups(self) -> list[dict]:
        """Weight decay on matrices only (not norms, gains or temperatures), as in GPT-2/nanoGPT; T5's relative-bias
        table, a matrix, joins the no-decay group when ``optim.decay_position_bias`` is false."""
        def decayed(name: str, p: torch.nn.Parameter) -> bool:
            return p.dim() >= 2 and (self.optim.decay_position_bias or not name.startswith("rel_bias."))

        params = self.trainable_parameters().items()
        return [{"params": [p for n, p in params if decayed(n, p)], "weight_decay": self.optim.weight_decay},
                {"params": [p for n, p in params if not decayed(n, p)], "weight_decay": 0.0}]

    def configure_optimizers(self):
        o = self.optim
        groups = [g for g in self.param_groups() if g["params"]]
        optimizer = torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, fused=o.fused or None)
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


class FSDP2Strategy(ModelParallelStrategy):
    """FSDP2 (``torch.distributed.fsdp.fully_shard``) through Lightning's ``ModelParallelStrategy``.

    All ``world_size`` ranks form one data-parallel mesh (no tensor parallelism). ``CausalLM.configure_model``
    calls ``shard``: one FSDP unit per transformer ``Block``, then the GPT root (embedding, final norm, head).
    Each parameter becomes a DTensor sharded on dim 0 that keeps its ``requires_grad``, so frozen weights
    (HeadScale) get no gradient at all, unlike FSDP1's flat parameters. Checkpoints are full state dicts
    gathered on rank 0: the plain model's keys, in one file. ``bf16``: bf16 compute copies of the fp32
    weights, gradients reduced in fp32 (FSDP2's ``MixedPrecisionPolicy``).
    """

    def __init__(self, trainer_cfg: TrainerConfig, bf16: bool, batch_tokens: int = 0) -> None:
        world_size = trainer_cfg.devices * trainer_cfg.num_nodes
        super().__init__(data_parallel_size=world_size, tensor_parallel_size=1, save_distributed_checkpoint=False)
        self.trainer_cfg, self.bf16, self.batch_tokens = trainer_cfg, bf16, batch_tokens
        self.activation_checkpointing: bool | None = None  # decided in ``shard``, where the model is known
        self.policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16
                       else MixedPrecisionPolicy())

    def setup(self, trainer) -> None:
        if not isinstance(self.lightning_module, CausalLM):  # Lightning's own error would blame the module
            raise ValueError(f"trainer.strategy=fsdp2 shards the training stages' models, not a "
                             f"{type(self.lightning_module).__name__}; use trainer.strategy=ddp here")
        super().setup(trainer)

    def shard(self, model: GPT) -> None:
        """Shard ``model`` in place over the data-parallel mesh, checkpointing each block's activations when
        ``trainer.activation_checkpointing`` says so (``auto``: when the run would not fit without,
        ``memory.needs_checkpointing`` on ``batch_tokens`` tokens per device)."""
        mesh = self.device_mesh["data_parallel"]
        need = footprint(model, self.batch_tokens, self.world_size, self.bf16)
        self.activation_checkpointing = needs_checkpointing(self.trainer_cfg, need, self.root_device)
        for block in model.transformer.h:
            if self.activation_checkpointing:
                checkpoint_activations(block)  # hooks, not a wrapper module: parameter names stay the plain model's
            fully_shard(block, mesh=mesh, mp_policy=self.policy)
        fully_shard(model, mesh=mesh, mp_policy=self.policy)
