"""The training step's speed choices keep its numbers and decide what they say: compiled blocks compute the eager
loss and gradients, fused AdamW the foreach update, and ``activation_checkpointing=auto`` weighs a memory estimate
that a count of the tensors autograd saves bears out."""

from __future__ import annotations

import copy

import pytest
import torch

from nope_lightning.config import ModelConfig, OptimConfig, TrainerConfig, load_config
from nope_lightning.model import GPT
from nope_lightning.pipeline.steps import identity
from nope_lightning.training import memory, trainer
from nope_lightning.training.module import CausalLM, compile_blocks, lm_loss

VOCAB, LENGTH = 96, 32


def tiny(**kw) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(**{"n_layer": 2, "n_head": 4, "n_query_groups": 2, "n_embd": 32, "intermediate_size": 64} | kw)
    return GPT(cfg, VOCAB, LENGTH)


def batch(rows: int = 2) -> torch.Tensor:
    return torch.randint(0, VOCAB, (rows, LENGTH + 1), generator=torch.Generator().manual_seed(1))


def loss_and_grads(model: GPT, tokens: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss = lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def test_compiled_blocks_compute_the_eager_loss_and_gradients():
    eager = tiny(pos_encoding="rope")
    compiled = copy.deepcopy(eager)
    compile_blocks(compiled)
    tokens = batch()
    loss, grads = loss_and_grads(eager, tokens)
    compiled_loss, compiled_grads = loss_and_grads(compiled, tokens)
    torch.testing.assert_close(compiled_loss, loss, rtol=1e-5, atol=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert list(compiled.state_dict()) == list(eager.state_dict())  # checkpoints keep the plain names


def test_fused_adamw_is_the_foreach_update():
    tokens = batch()
    updated = {}
    for fused in (False, True):
        module = CausalLM(tiny(), OptimConfig(lr=1e-2, warmup_steps=0, fused=fused), max_steps=10)
        optimizer = module.configure_optimizers()["optimizer"]
        assert optimizer.defaults["fused"] is (True if fused else None)
        for _ in range(3):
            optimizer.zero_grad()
            lm_loss(module(tokens[:, :-1]), tokens[:, 1:]).backward()
            optimizer.step()
        updated[fused] = module.model.state_dict()
    for name, value in updated[False].items():
        torch.testing.assert_close(updated[True][name], value, rtol=1e-5, atol=1e-6, msg=name)


def saved_bytes(model: GPT, tokens: torch.Tensor) -> int:
    """Bytes of the distinct tensors autograd saves for the backward of one training forward (the reference)."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(n for ptr, n in storages.items() if ptr not in weights)


def test_the_memory_estimate_matches_what_autograd_saves():
    model = tiny(n_layer=4)
    tokens = batch(rows=8)
    need = memory.footprint(model, 8 * LENGTH, bf16=False)
    # fp32 weights; gradients and AdamW's two moments for the trainable ones (not the frozen lambdas)
    counts = {flag: sum(p.numel() for p in model.parameters() if p.requires_grad is flag) for flag in (True, False)}
    assert counts[False] == 4 * 4 and need.states == 16 * counts[True] + 4 * counts[False]
    measured = saved_bytes(model, tokens)
    assert 0.8 < (need.activations + need.logits) / measured < 1.25, (need, measured)  # measured: 0.94


def test_checkpointing_auto_follows_the_estimate_and_true_false_force_it(monkeypatch):
    need = memory.Footprint(states=60, activations=20, logits=0)
    monkeypatch.setattr(memory, "device_bytes", lambda cfg, device: 100)
    cpu = torch.device("cpu")
    assert memory.needs_checkpointing(TrainerConfig(activation_checkpointing="auto"), need, cpu) is False  # 80 fits
    more = memory.Footprint(states=60, activations=21, logits=0)
    assert memory.needs_checkpointing(TrainerConfig(activation_checkpointing="auto"), more, cpu) is True
    assert memory.needs_checkpointing(TrainerConfig(activation_checkpointing="true"), need, cpu) is True
    assert memory.needs_checkpointing(TrainerConfig(activation_checkpointing="false"), more, cpu) is False


def test_checkpointing_setting_reads_yaml_booleans_refuses_others_and_keeps_step_hashes():
    assert load_config(TrainerConfig, overrides=["activation_checkpointing=true"]).activation_checkpointing == "true"
    assert load_config(TrainerConfig, overrides=["activation_checkpointing=False"]).activation_checkpointing == "false"
    with pytest.raises(ValueError, match="trainer.activation_checkpointing='sometimes'.*auto, true, false"):
        load_config(TrainerConfig, overrides=["activation_checkpointing=sometimes"])
    # Every step recorded before the setting had three values ran with the bool true, which changes no result:
    # every value hashes as that true did, and the new optimizer field at its default is left out.
    for value in ("auto", "true", "false"):
        assert identity(TrainerConfig(activation_checkpointing=value))["activation_checkpointing"] is True
    assert "fused" not in identity(OptimConfig()) and identity(OptimConfig(fused=True))["fused"] is True


def test_a_compile_this_machine_cannot_do_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(trainer.shutil, "which", lambda name: None)
    monkeypatch.setenv("CXX", "g++")
    with pytest.raises(ValueError, match=r"trainer.compile=true, but no C\+\+ compiler \(g\+\+\).*compile=false"):
        trainer.check_strategy(TrainerConfig(accelerator="cpu", compile=True))
    trainer.check_strategy(TrainerConfig(accelerator="cpu", compile=False))  # nothing to compile: accepted
