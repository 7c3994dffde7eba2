"""Attention temperatures: every kind, their per-head table files, and the one module that attention asks.

All in units of 1/sqrt(d) (1.0 = the standard softmax scale; the papers' "1.2" = 1.2/sqrt(d)), all multiplied
together into one multiplier ``lambda[l, h] * tau_h(i)`` of the query at absolute position i (0-based) of head h
in layer l, for a model trained at L tokens:

* **per-head temperature** ``lambda[l, h] = uniform x table[l, h]`` (``temperature.uniform``,
  ``temperature.table``): a parameter pretraining leaves frozen (``per_head``); HeadScale trains it.
* **log-length scaling** ``tau_h(i) = max(1, 1 + a_h ln((i + 1) / L))`` with ``a_h >= 0``
  (``temperature.log_slope`` for every head, ``temperature.log_slope_table`` per head, what HeadScale-log
  trains). It is exactly 1 for every query inside the training length (i + 1 <= L: the log is <= 0, so the max
  picks 1), so the model's logits on sequences of up to L tokens are bit-identical to the plain model's;
  beyond L it grows like paper 001's fitted best uniform temperature ``1 + a ln s`` (s = extension ratio),
  but per query instead of per run. An evaluation-time setting: a non-persistent buffer, never in an export.
* **Scalable-Softmax** (SSMax, Nakanishi 2025, arXiv 2501.19399) — ``tau_h(i) = s_h ln n`` with n = i + 1 the
  number of keys the causal query sees and ``s_h`` a parameter trained from scratch (``model.ssmax=true``).
  Init ``s_h = 1 / ln L``: the multiplier is then exactly 1 at n = L, so at initialisation the model attends
  at its training length exactly as the standard softmax does, and each head learns from there how much
  sharper (n > L) or flatter (n < L) to be; any other constant would start every head off the standard scale
  at L. Supported (and tested) with nope, alibi and rope (a per-row scale of q commutes with RoPE's rotation).
* **iRoPE's temperature** (Llama 4) — ``tau(i) = 1 + beta ln(floor((i + 1) / F) + 1)`` for every head of the
  **NoPE layers only** (``temperature.irope_beta`` beta, ``temperature.irope_floor`` F in units of L: F =
  irope_floor x L tokens; ``AttentionTemperature``); exactly 1 for i + 1 < F. An evaluation-time setting:
  plain attributes, never in an export. The per-head lambda and the log-length slopes act on every layer,
  as on a model without a layer pattern (HeadScale's choice, ``stages/headscale.py``).
* **lambda past L** (``temperature.past_only``; HeadScale past L trains it) — the per-head lambda above acts only
  on queries at 0-based positions i >= L and is exactly 1 for every query inside the training length, so the
  model equals the plain one bit for bit on every position < L (causal attention: those queries see keys < L
  only), and no gradient reaches lambda from them. An evaluation-time setting (a plain attribute). A model needs
  NoPE layers for it (``require_nope_layers``): a NoPE model, or a hybrid with at least one NoPE layer, where
  lambda then acts on every layer past L, RoPE layers included, as HeadScale's table does; a model with no NoPE
  layer (RoPE, ALiBi, T5, APE, a hybrid whose layers all rotate) is refused, since the method repairs NoPE's
  failure past L, not a position encoding's unseen positions.

Fast kernels take one scalar scale, so the multiplier is folded into q and the kernel keeps its scalar 1/sqrt(d).
A position-free multiplier (a uniform lambda, a HeadScale table) is folded into the query projection itself: the
rows of W_q that belong to head h are multiplied by lambda_h (``Temperature.query_rows``), so attention costs what
plain attention costs (no elementwise pass over q) and lambda still gets its gradient through the weight product.
A position-dependent one (log-length, SSMax, iRoPE's, lambda past L) scales q after the projection
(``q * lambda_h tau_h(i)``).
Either way the result equals ``softmax(lambda_h tau_h(i) q_i.k_j / sqrt(d) + bias_ij)`` and SDPA/flash still run. An additive position bias (ALiBi, T5) is not scaled: the temperature acts on content
similarity only. Per-head tables travel as ``.safetensors`` + a readable ``.json`` (``TableKind``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from nope_lightning.config.parts import AttentionTemperature


@dataclass(frozen=True)
class TableKind:
    """A per-head (n_layer, n_head) table file: its tensor (and JSON) name ``key``, the ``AttentionTemperature``
    field that names such a file, its units, and whether 0 is a valid entry."""

    key: str
    field: str
    units: str
    zero_ok: bool


#: lambda tables (HeadScale's): > 0. The file keys predate the one name and stay, so old tables still load.
PER_HEAD = TableKind("head_scale", "table", "1/sqrt(head_size)", False)
#: lambda tables of HeadScale past L: lambda > 0 at query positions >= L, 1 inside (``past_only``); the same file
#: keys as ``PER_HEAD``, so ``temperature.table`` names either.
PER_HEAD_PAST = TableKind("head_scale", "table", "1/sqrt(head_size), at query positions i >= train_len only (1 inside)",
                          False)
#: slope tables a (HeadScale-log's): >= 0.
LOG_SLOPE = TableKind("log_scale", "log_slope_table",
                      "a of lambda(i) = max(1, 1 + a ln((i+1)/L)), lambda in units of 1/sqrt(head_size)", True)


def load_table(path: str | Path, n_layer: int, n_head: int, kind: TableKind = PER_HEAD) -> torch.Tensor:
    """A per-head table (n_layer, n_head) float32 of ``kind`` from .safetensors or .json.

    safetensors: tensor ``kind.key``; JSON: ``{kind.key: [[...], ...]}`` (what ``save_table`` writes).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"temperature.{kind.field}: no such file {path}")
    if path.suffix == ".safetensors":
        tensors = load_file(str(path))
        if kind.key not in tensors:
            raise ValueError(f"{path}: no {kind.key!r} tensor (found {sorted(tensors)})")
        table = tensors[kind.key]
    elif path.suffix == ".json":
        doc = json.loads(path.read_text())
        if kind.key not in doc:
            raise ValueError(f"{path}: no {kind.key!r} table (found {sorted(doc)})")
        table = torch.tensor(doc[kind.key], dtype=torch.float32)
    else:
        raise ValueError(f"{path}: a {kind.key} table must be .safetensors or .json")
    if tuple(table.shape) != (n_layer, n_head):
        raise ValueError(f"{path}: table shape {tuple(table.shape)} does not match this model's "
                         f"(n_layer, n_head) = ({n_layer}, {n_head})")
    if not bool((table >= 0 if kind.zero_ok else table > 0).all()):
        raise ValueError(f"{path}: {kind.key} values must be {'>= 0' if kind.zero_ok else '> 0'}")
    return table.float()


def save_table(path: str | Path, table: torch.Tensor, metadata: dict | None = None,
               kind: TableKind = PER_HEAD) -> None:
    """Save an (n_layer, n_head) table of ``kind`` as ``path`` (.safetensors) and a readable .json beside it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = table.detach().float().cpu().contiguous()
    meta = {k: str(v) for k, v in (metadata or {}).items()}
    save_file({kind.key: table}, str(path.with_suffix(".safetensors")), metadata=meta)
    doc = {"units": kind.units, kind.key: table.tolist(), "metadata": meta}
    path.with_suffix(".json").write_text(json.dumps(doc, indent=1))


def table_metadata(path: str) -> dict[str, str]:
    """The metadata ``save_table`` wrote into a local table file (safetensors metadata, the JSON's
    ``metadata``); {} for a file without any (a hand-made table)."""
    if path.endswith(".safetensors"):
        with safe_open(path, "pt") as f:
            return f.metadata() or {}
    return json.loads(Path(path).read_text()).get("metadata", {})


def tuning_len(settings: AttentionTemperature) -> int | None:
    """The length (tokens) the per-head table of resolved ``settings`` (local files) was tuned at: HeadScale
    writes its ``target_len`` into the table file's metadata (``table_metadata``); the report's Table 4 analog
    reads PPL there, as the paper does. None without a table file or for one that names no length (a hand-made
    table). The lambda table's, else the log-slope table's."""
    path = settings.table or settings.log_slope_table
    if not path:
        return None
    metadata = table_metadata(path)
    return int(metadata["target_len"]) if "target_len" in metadata else None


def ssmax_init(train_len: int) -> float:
    """``s = 1 / ln L``: the SSMax multiplier ``s ln n`` is 1 at n = L (see the module docstring)."""
    if train_len < 2:
        raise ValueError(f"SSMax needs train_len >= 2 (its scale is 1 at n = train_len; ln 1 = 0), got {train_len}")
    return 1.0 / math.log(train_len)


class Temperature(nn.Module):
    """One attention layer's temperatures: ``per_head`` (n_head,) lambda, a parameter (frozen unless HeadScale
    trains it); ``log_slope`` (n_head,) slopes a or None, a non-persistent buffer (HeadScale-log makes it a
    parameter); ``ssmax`` (n_head,) SSMax's learned s or None, a parameter exported with the model;
    ``irope`` (beta, F in tokens) of iRoPE's temperature or None, set on NoPE layers only (``nope``: the layer
    has no position encoding); ``past_only``: lambda acts on queries at positions >= L only. ``train_len`` is L."""

    def __init__(self, n_head: int, train_len: int, ssmax: bool = False, nope: bool = False) -> None:
        super().__init__()
        self.n_head, self.train_len, self.nope = n_head, train_len, nope
        self.per_head = nn.Parameter(torch.ones(n_head), requires_grad=False)
        self.register_buffer("log_slope", None, persistent=False)
        self.ssmax = nn.Parameter(torch.full((n_head,), ssmax_init(train_len))) if ssmax else None
        self.irope: tuple[float, float] | None = None
        self.past_only = False

    def reset_parameters(self) -> None:
        # Needed for meta-device (FSDP) init, where tensors are materialised only through this hook: lambda 1,
        # neutral log scaling, SSMax's init.
        with torch.no_grad():
            self.per_head.fill_(1.0)
            if self.log_slope is not None:
                self.log_slope.zero_()
            if self.ssmax is not None:
                self.ssmax.fill_(ssmax_init(self.train_len))

    @property
    def folds(self) -> bool:
        """Whether the multiplier is the per-head lambda alone (no position-dependent factor): then attention
        folds it into the query projection (``query_rows``) and the kernel sees plain q; else ``forward`` scales q.
        Lambda past L depends on the position, so it never folds."""
        return self.log_slope is None and self.ssmax is None and self.irope is None and not self.past_only

    def query_rows(self, head_size: int) -> torch.Tensor:
        """(n_head * head_size,) each head's lambda repeated over its ``head_size`` rows of W_q (head-major, as
        litgpt lays out the query rows): ``q_h = lambda_h (W_q x)_h = (lambda_h W_q,h) x``, and a per-head scalar
        commutes with RoPE's rotation, so scaling the rows equals scaling q, and lambda keeps its gradient."""
        return self.per_head.repeat_interleave(head_size)

    def forward(self, q: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """q (B, H, T, d) -> q times each head's and query's multiplier, in q's dtype. ``positions`` (B | 1, T)
        int: the queries' absolute positions (KV-cached decoding); None means 0..T-1 (a full forward).
        Attention calls it only when the temperature does not ``fold``."""
        if positions is None and not self.folds:
            positions = torch.arange(q.size(2), device=q.device)[None]
        factor = self.per_head.view(1, -1, 1, 1)
        if self.past_only:
            # The constant 1.0 inside L, not lambda / lambda: q * 1.0 is q bit for bit, and where() sends those
            # queries' gradient to the constant, none of it to lambda.
            factor = torch.where((positions >= self.train_len)[:, None, :, None], factor, 1.0)  # (1 | B, H, T, 1)
        if self.log_slope is not None or self.ssmax is not None or self.irope is not None:
            factor = factor * self.position_factor(positions)  # (1 | B, H, T, 1)
        return q * factor.to(q.dtype)

    def position_factor(self, positions: torch.Tensor) -> torch.Tensor:
        """positions (B | 1, T) int -> tau (B | 1, n_head | 1, T, 1) float32: log-length scaling times SSMax times
        iRoPE's temperature."""
        n = (positions + 1).float()[:, None, :, None]  # keys a causal query sees
        scale = torch.ones_like(n)
        if self.log_slope is not None:
            # Inside L the log is <= 0 and a >= 0, so the clamp returns exactly 1.0 (the bit-identity above).
            a = self.log_slope.float().view(1, -1, 1, 1)
            scale = (1.0 + a * torch.log(n / self.train_len)).clamp(min=1.0)
        if self.ssmax is not None:
            scale = scale * self.ssmax.float().view(1, -1, 1, 1) * torch.log(n)
        if self.irope is not None:
            beta, floor_tokens = self.irope
            # In float64, as Python evaluates the formula: float32 rounds (i + 1) / F and can move the floor.
            steps = torch.floor((positions + 1).double()[:, None, :, None] / floor_tokens)
            scale = scale * (1.0 + beta * torch.log(steps + 1.0)).float()
        return scale


def layers(model: nn.Module) -> list[Temperature]:
    """The ``Temperature`` of every attention layer of ``model``, in layer order."""
    return [m for m in model.modules() if isinstance(m, Temperature)]


def apply_settings(model: nn.Module, settings: AttentionTemperature) -> None:
    """Write the lambda table (less its ``reset_layers`` rows), whether it acts past L only, the log-length slopes
    (files read here) and iRoPE's temperature (NoPE layers only) that resolved ``settings`` ask for. A table that
    HeadScale past L tuned (its metadata says ``past_only``) is refused without ``past_only``: applied at every
    position it would be another method than the one tuned."""
    every = layers(model)
    n_layer, n_head = len(every), every[0].n_head
    table = torch.ones(n_layer, n_head)
    if settings.table:
        table = load_table(settings.table, n_layer, n_head)
        if table_metadata(settings.table).get("past_only") == "true" and not settings.past_only:
            raise ValueError(f"temperature.table={settings.table} was tuned past L only (HeadScale past L): "
                             f"apply it with temperature.past_only=true")
    if settings.past_only:
        require_nope_layers(model, "temperature.past_only=true")
    set_past_only(model, settings.past_only)
    if any(layer >= n_layer for layer in settings.reset_layers):
        raise ValueError(f"temperature.reset_layers={settings.reset_layers}: the model has layers 0-{n_layer - 1}")
    table[settings.reset_layers] = 1.0
    set_temperatures(model, table * settings.uniform)
    slopes = None
    if settings.log_slope_table:
        slopes = load_table(settings.log_slope_table, n_layer, n_head, LOG_SLOPE)
    elif settings.log_slope > 0:
        slopes = torch.full((n_layer, n_head), settings.log_slope)
    set_log_slopes(model, slopes)
    for layer in every:
        irope = settings.irope_beta > 0 and layer.nope
        layer.irope = (settings.irope_beta, settings.irope_floor * layer.train_len) if irope else None


def require_nope_layers(model: nn.Module, setting: str) -> None:
    """Refuse, in one line naming ``setting``, a model none of whose layers is NoPE (see the module docstring for
    why lambda past L needs one, and what a hybrid's are)."""
    if not any(layer.nope for layer in layers(model)):
        raise ValueError(f"{setting}: lambda past L repairs NoPE past its training length and this model has no "
                         f"NoPE layer (a RoPE/ALiBi/T5/APE model, or a hybrid whose layers all rotate)")


def set_past_only(model: nn.Module, past_only: bool) -> None:
    """Make every attention layer's lambda act on queries at positions >= L only (True) or everywhere."""
    for layer in layers(model):
        layer.past_only = past_only


def set_temperatures(model: nn.Module, table: torch.Tensor) -> None:
    """Write the (n_layer, n_head) lambda table (units of 1/sqrt(d)) into the attention layers."""
    every = layers(model)
    assert tuple(table.shape) == (len(every), every[0].n_head), table.shape
    with torch.no_grad():
        for layer, row in zip(every, table, strict=True):
            layer.per_head.copy_(row)


def temperatures(model: nn.Module) -> torch.Tensor:
    """The current (n_layer, n_head) lambda table, detached."""
    return torch.stack([layer.per_head.detach() for layer in layers(model)])


def set_log_slopes(model: nn.Module, table: torch.Tensor | None) -> None:
    """Write the slopes a (n_layer, n_head), >= 0, into the attention layers (None: switch log scaling off).
    A layer whose slopes are trainable (HeadScale-log) is written in place, keeping its parameter."""
    every = layers(model)
    if table is None:
        for layer in every:
            layer.log_slope = None
        return
    assert tuple(table.shape) == (len(every), every[0].n_head), table.shape
    if bool((table < 0).any()):
        raise ValueError(f"log-length slopes a must be >= 0 (got min {float(table.min()):g}): with a < 0 the "
                         f"temperature max(1, 1 + a ln((i+1)/L)) is 1 everywhere")
    device = every[0].per_head.device
    with torch.no_grad():
        for layer, row in zip(every, table, strict=True):
            if isinstance(layer.log_slope, nn.Parameter):
                layer.log_slope.copy_(row)
            else:
                layer.log_slope = row.detach().float().clone().to(device)


def log_slopes(model: nn.Module) -> torch.Tensor | None:
    """The current (n_layer, n_head) slopes a, detached, or None when log scaling is off."""
    every = layers(model)
    if every[0].log_slope is None:
        return None
    return torch.stack([layer.log_slope.detach() for layer in every])


def train_only(model: nn.Module, attribute: str) -> None:
    """Freeze every tensor of ``model``; each layer's ``attribute`` (``per_head`` or ``log_slope``, already set)
    becomes a trainable (n_head,) parameter. A trainable ``log_slope`` appears in ``state_dict`` (training
    checkpoints hold it); an export never does: slopes leave a run as a table file only."""
    model.requires_grad_(False)
    for layer in layers(model):
        value = getattr(layer, attribute)
        if value is None:
            raise ValueError(f"set the initial {attribute} before making it trainable")
        if not isinstance(value, nn.Parameter):  # the slopes are a buffer until they are trained
            value = nn.Parameter(value.detach().clone())
            setattr(layer, attribute, value)
        value.requires_grad_(True)
