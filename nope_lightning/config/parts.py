"""The pieces every stage config is built from: the model, optimizer, trainer and tracking sections (checked as
``config/core.py`` checks); the data and retrieval-mix sections are ``config/data.py``'s."""

from __future__ import annotations

from dataclasses import dataclass, field

from nope_lightning.config.core import (
    ACCELERATORS,
    ATTENTION_BACKENDS,
    CHECKPOINTING,
    POS_ENCODINGS,
    PRECISIONS,
    ROPE_SCALINGS,
    STRATEGIES,
    check_choice,
    check_range,
)


@dataclass
class RopeScalingConfig:
    """How RoPE frequencies are rescaled for a context longer than the one trained on.

    ``factor`` is s = target length / ``original_len``; ``original_len=0`` means the model's ``train_len``.
    ``beta_fast``/``beta_slow`` are YaRN's ramp bounds (in rotations over ``original_len``).
    """

    method: str = "none"
    factor: float = 1.0
    original_len: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0

    def __post_init__(self) -> None:
        check_choice("model.rope_scaling.method", self.method, ROPE_SCALINGS)
        check_range("model.rope_scaling.factor", self.factor, 1.0)
        check_range("model.rope_scaling.original_len", self.original_len, 0)
        if self.beta_fast <= self.beta_slow:
            raise ValueError("model.rope_scaling.beta_fast must be > beta_slow (YaRN ramp bounds)")


@dataclass
class AttentionTemperature:
    """The attention temperature of every head and query (``model/temperature.py``), units of 1/sqrt(d).

    ``uniform``: one lambda for every head; ``table``: a per-head (n_layer, n_head) table file (.safetensors or
    .json, what HeadScale saves), multiplied with ``uniform``. Log-length scaling ``max(1, 1 + a ln((i+1)/L))``
    for the query at position i of a model trained at L tokens, multiplied with those, its slopes a from at
    most one of: ``log_slope`` a given a >= 0 (0: off); ``log_slope_table`` a per-head table of slopes (what
    HeadScale-log saves); ``log_slope_fit`` a scale-search run (id, ``runs:/<id>`` or its
    ``scale_search.json``) whose fit a to use. Under ``extension`` a table may also be
    ``runs:/<run_id>/<artifact path>``, and ``nope_lightning.model.extension`` resolves both references for the
    evaluated model (the fit is refused when it was run on another model); under ``model`` the settings are
    resolved ones: local files and no fit. Like the fit, evaluate's ``uniform_search`` (a scale-search run) with
    ``uniform_search_len`` (one of its target lengths) sets ``uniform`` to that search's best lambda there, read
    for the evaluated model as HeadScale's ``init=search`` reads it (another model's search or a beta search is
    refused): both or neither, not with ``uniform`` != 1. In a pipeline it is ``uniform_search=@{<step>.run_id}``,
    never the search's ``best_lambda`` put into ``uniform`` as text.

    iRoPE's inference-time temperature (Llama 4), on the **NoPE layers only** (``ModelConfig.layer_encodings``):
    the query at 0-based position i is multiplied by ``1 + irope_beta ln(floor((i + 1) / F) + 1)`` with
    ``F = irope_floor x L`` tokens. ``irope_beta`` is Llama 4's ``attn_scale`` (0: off; Llama 4 uses 0.1).
    ``irope_floor`` is its ``floor_scale`` in units of the training length L rather than tokens: Llama 4's
    8,192 tokens would leave every query of a model trained at L = 128 and read at 8x untouched. At the
    default 1.0, F = L: the multiplier is exactly 1 for the queries with i + 1 < F and first exceeds 1 at the
    L-th token (i = F - 1), as the reference formula has it. It multiplies with the other temperatures.

    ``reset_layers``: layers (0-based) whose row of ``table`` is set to 1 (those heads keep ``uniform``): the
    probe of which layer's learned temperatures cost the model a skill it had (retrieval inside L).

    ``past_only``: the per-head lambda (``uniform`` x ``table``) acts only on queries at 0-based positions
    i >= L and is exactly 1 inside the training length (HeadScale past L, ``headscale parameterization=
    lambda_past``, tunes such a table); it needs a lambda to apply (``table`` or ``uniform`` != 1) and a model
    with NoPE layers (``model/temperature.py``). The other temperatures are unchanged by it.
    """

    uniform: float = 1.0
    table: str = ""
    log_slope: float = 0.0
    log_slope_table: str = ""
    log_slope_fit: str = ""
    uniform_search: str = ""
    uniform_search_len: int = 0
    irope_beta: float = 0.0
    irope_floor: float = 1.0
    reset_layers: list[int] = field(default_factory=list)
    past_only: bool = False

    def check(self, prefix: str, resolved: bool) -> None:
        """Raise ``ValueError`` naming ``prefix.<key>`` for a bad value; ``resolved``: refuse references."""
        check_range(f"{prefix}.uniform", self.uniform, 0.0, low_open=True)
        check_range(f"{prefix}.irope_beta", self.irope_beta, 0.0)
        check_range(f"{prefix}.irope_floor", self.irope_floor, 0.0, low_open=True)
        check_range(f"{prefix}.log_slope", self.log_slope, 0.0)  # a < 0 would make max(1, ...) 1 everywhere
        if self.reset_layers and not self.table:
            raise ValueError(f"{prefix}.reset_layers resets rows of a per-head table: set {prefix}.table too")
        if any(layer < 0 for layer in self.reset_layers) or len(set(self.reset_layers)) < len(self.reset_layers):
            raise ValueError(f"{prefix}.reset_layers={self.reset_layers}: distinct 0-based layer indices")
        check_range(f"{prefix}.uniform_search_len", self.uniform_search_len, 0)
        if bool(self.uniform_search) != bool(self.uniform_search_len) or self.uniform_search and self.uniform != 1:
            raise ValueError(f"{prefix}.uniform_search and uniform_search_len name a scale-search and the length "
                             f"whose best lambda is {prefix}.uniform: give both (and no uniform), or neither")
        if self.past_only and not self.table and self.uniform == 1.0 and not self.uniform_search:
            raise ValueError(f"{prefix}.past_only=true applies lambda past L only, and there is none to apply: set "
                             f"{prefix}.table (HeadScale past L's) or {prefix}.uniform")
        if (self.log_slope > 0) + bool(self.log_slope_table) + bool(self.log_slope_fit) > 1:
            raise ValueError(f"{prefix}.log_slope, log_slope_table and log_slope_fit all set the slopes a: give one")
        if not resolved:
            return
        for key, resolved_key in (("log_slope_fit", "log_slope=<a>"), ("uniform_search", "uniform=<lambda>")):
            if getattr(self, key):
                raise ValueError(f"{prefix}.{key}: a model takes the value itself ({prefix}.{resolved_key}); a "
                                 f"scale-search reference is for evaluate's extension.temperature.{key}")
        for key in ("table", "log_slope_table"):
            if getattr(self, key).startswith("runs:/"):
                raise ValueError(f"{prefix}.{key}: a model reads a local file; a runs:/ artifact is for "
                                 f"evaluate's extension.temperature.{key}")


#: ``ModelConfig.embedding_init``'s choices: GPT-2's N(0, ``init_std``) token embeddings (APE's at N(0, 1)), or
#: HF T5's N(0, 1) for every encoding.
EMBEDDING_INITS = ("gpt2", "t5")


@dataclass
class ModelConfig:
    """Architecture of the causal LM (litgpt block: RMSNorm, SwiGLU MLP, grouped-query attention).

    ``n_query_groups=0`` means one key/value head per query head (plain multi-head attention).
    ``max_positions`` sizes the learned absolute-position table (and bounds every PE's usable length).
    ``temperature``: the attention temperatures (``AttentionTemperature``, resolved: local files, no fit),
    an evaluation-time setting like ``rope_scaling``; ``ssmax`` pre-trains with Scalable-Softmax's learned
    per-head ``s ln(i+1)`` multiplier (nope, alibi, rope).

    Hybrids (per-layer position encoding, ``pos_encoding=rope`` only; resolved in ``layer_encodings``): at most
    one of ``layer_pattern``, each layer's encoding (``nope`` or ``rope``, one entry per layer), and
    ``nope_every`` k, which makes layer l NoPE when (l + 1) % k == 0 and the rest RoPE (Llama 4's
    ``no_rope_layer_interval``: k = 4 is iRoPE's one NoPE layer in four, layers 3, 7, ...; 0: off); neither
    means every layer is ``pos_encoding``. Sliding-window attention (resolved in ``windows``): at most one of
    ``layer_windows``, each layer's window W in tokens (null: global attention; one entry per layer), and
    ``rope_window``, W on every RoPE layer (Cohere's RNoPE-SWA: windowed RoPE, global NoPE); null/empty: global
    everywhere. The query at position i of a windowed layer attends to the keys i - W < j <= i (W keys, itself
    included: litgpt's ``sliding_window_size`` convention), 1 <= W <= ``max_positions``.
    ``padding_multiple``: the vocabulary tables' rows round up to a multiple of it (litgpt's); an imported Hugging
    Face model's is 1, so no untrained padding row takes softmax mass.
    ``embedding_init``: the token embeddings' initial scale (``EMBEDDING_INITS``; why: ``model.gpt``): ``gpt2``,
    N(0, ``init_std``) except APE (``sinusoidal``) at N(0, 1); ``t5``, N(0, 1) for every encoding.
    """

    n_layer: int = 4
    n_head: int = 4
    n_query_groups: int = 0
    n_embd: int = 128
    intermediate_size: int = 352
    norm_eps: float = 1e-5
    pos_encoding: str = "nope"
    max_positions: int = 8192
    rope_base: float = 10000.0
    rope_scaling: RopeScalingConfig = field(default_factory=RopeScalingConfig)
    t5_num_buckets: int = 32
    t5_max_distance: int = 128
    temperature: AttentionTemperature = field(default_factory=AttentionTemperature)
    ssmax: bool = False
    attention_backend: str = "sdpa"
    init_std: float = 0.02
    layer_pattern: list[str] = field(default_factory=list)
    nope_every: int = 0
    layer_windows: list[int | None] = field(default_factory=list)
    rope_window: int | None = None
    padding_multiple: int = 64
    embedding_init: str = "gpt2"

    def __post_init__(self) -> None:
        check_choice("model.pos_encoding", self.pos_encoding, POS_ENCODINGS)
        check_choice("model.embedding_init", self.embedding_init, EMBEDDING_INITS)
        check_choice("model.attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        for key in ("n_layer", "n_head", "n_embd", "intermediate_size", "max_positions", "padding_multiple"):
            check_range(f"model.{key}", getattr(self, key), 1)
        check_range("model.n_query_groups", self.n_query_groups, 0)
        if self.n_embd % self.n_head:
            raise ValueError(f"model.n_embd={self.n_embd} must be divisible by model.n_head={self.n_head}")
        if self.n_query_groups and self.n_head % self.n_query_groups:
            raise ValueError(f"model.n_head={self.n_head} must be divisible by model.n_query_groups="
                             f"{self.n_query_groups}")
        self.temperature.check("model.temperature", resolved=True)
        if self.ssmax and self.pos_encoding not in ("nope", "alibi", "rope"):
            raise ValueError(f"model.ssmax=true supports pos_encoding nope, alibi or rope, not {self.pos_encoding}")
        check_range("model.t5_num_buckets", self.t5_num_buckets, 2)
        check_range("model.t5_max_distance", self.t5_max_distance, 1)
        if self.pos_encoding in ("sinusoidal", "learned", "rope") and self.head_size % 2:
            raise ValueError(f"model.pos_encoding={self.pos_encoding} needs an even head size")
        if self.rope_scaling.method != "none" and self.pos_encoding != "rope":
            raise ValueError(f"model.rope_scaling.method={self.rope_scaling.method} applies to "
                             f"pos_encoding=rope only (got {self.pos_encoding})")
        self.check_layers()

    def check_layers(self) -> None:
        """The per-layer encodings and windows (see the class docstring): one line per bad value."""
        if self.layer_pattern and self.nope_every:
            raise ValueError("model.layer_pattern and model.nope_every both set the per-layer encodings: give one")
        if (self.layer_pattern or self.nope_every) and self.pos_encoding != "rope":
            raise ValueError(f"model.layer_pattern / model.nope_every make some layers of a RoPE model NoPE: they "
                             f"need model.pos_encoding=rope (got {self.pos_encoding})")
        for name in self.layer_pattern:
            check_choice("model.layer_pattern", name, ("nope", "rope"))
        for key in ("layer_pattern", "layer_windows"):
            if len(getattr(self, key)) not in (0, self.n_layer):
                raise ValueError(f"model.{key} names {len(getattr(self, key))} layers; the model has "
                                 f"n_layer={self.n_layer}: give one entry per layer")
        check_range("model.nope_every", self.nope_every, 0)
        if self.nope_every > self.n_layer:
            raise ValueError(f"model.nope_every={self.nope_every} names layer {self.nope_every - 1} as the first "
                             f"NoPE layer; the model has n_layer={self.n_layer}")
        if self.layer_windows and self.rope_window is not None:
            raise ValueError("model.layer_windows and model.rope_window both set the attention windows: give one")
        for key, window in (*(("layer_windows", w) for w in self.layer_windows), ("rope_window", self.rope_window)):
            if window is not None:
                check_range(f"model.{key}", window, 1, self.max_positions)
        encodings = self.layer_encodings
        if self.rope_window is not None and "rope" not in encodings:
            raise ValueError(f"model.rope_window={self.rope_window} windows the RoPE layers; this model has none")
        if self.temperature.irope_beta > 0 and "nope" not in encodings:
            raise ValueError(f"temperature.irope_beta={self.temperature.irope_beta:g}: iRoPE's temperature acts on "
                             f"NoPE layers only and this model has none (layers: {', '.join(encodings)})")

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_query_groups or self.n_head

    @property
    def layer_encodings(self) -> tuple[str, ...]:
        """Each layer's position encoding: ``layer_pattern``, ``nope_every``'s, else ``pos_encoding`` everywhere."""
        if self.layer_pattern:
            return tuple(self.layer_pattern)
        if self.nope_every:
            return tuple("nope" if (layer + 1) % self.nope_every == 0 else "rope" for layer in range(self.n_layer))
        return (self.pos_encoding,) * self.n_layer

    @property
    def windows(self) -> tuple[int | None, ...]:
        """Each layer's sliding window in tokens, None for global attention (``layer_windows`` or ``rope_window``)."""
        if self.layer_windows:
            return tuple(self.layer_windows)
        return tuple(self.rope_window if encoding == "rope" else None for encoding in self.layer_encodings)


@dataclass
class OptimConfig:
    """AdamW with linear warm-up then cosine decay to ``min_lr_ratio * lr``. ``fused``: torch's fused AdamW kernel
    (one kernel for every parameter's update; CPU and CUDA), else its default multi-tensor (foreach) one: the
    same update up to float rounding.

    Weight decay reaches matrices only (``CausalLM.param_groups``). ``decay_position_bias``: whether it reaches
    T5's relative-bias table too (``rel_bias.weight``, a (buckets, heads) matrix). Paper 002's reference trains
    with the Hugging Face Trainer, whose AdamW decays no parameter with "bias" in its name, so there T5's table
    is not decayed; false does the same (the synthetic race), true keeps every earlier run's recipe."""

    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    fused: bool = False
    decay_position_bias: bool = True

    def __post_init__(self) -> None:
        check_range("optim.lr", self.lr, 0.0, low_open=True)
        check_range("optim.min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)
        check_range("optim.warmup_steps", self.warmup_steps, 0)
        check_range("optim.weight_decay", self.weight_decay, 0.0)
        check_range("optim.beta1", self.beta1, 0.0, 1.0)
        check_range("optim.beta2", self.beta2, 0.0, 1.0)
        check_range("optim.grad_clip", self.grad_clip, 0.0)


@dataclass
class TrainerConfig:
    """Lightning Trainer settings (the only place they are read is ``training.trainer.build_trainer``).

    ``threads=0`` picks the measured best intra-op thread count for this host (docs/performance.md: on 2 cores
    one thread per process beats two). ``val_every_n_steps=0`` validates once, at the end.

    ``strategy``: ``fsdp`` is Lightning's FSDP1 (CUDA only); ``fsdp2`` is ``torch.distributed.fsdp.fully_shard``
    (``training.module.FSDP2Strategy``: CUDA or CPU/gloo, frozen weights get no gradient, ``32-true`` or ``bf16-mixed``).
    ``activation_checkpointing`` recomputes each transformer block's activations in the backward pass under
    both FSDP strategies (memory for compute; the other strategies ignore it): ``auto`` turns it on only when
    the run would not fit the device without it (``training.memory``: the model, batch and world size against the
    device's memory), ``true``/``false`` force it. ``compile`` compiles each transformer block
    (``training.module.compile_blocks``).

    Checkpoints: ``step*.ckpt`` every ``checkpoint_every_n_steps`` optimizer steps, and ``last.ckpt`` (what a
    rerun resumes) then and at least every ``checkpoint_minutes`` of training as well (0: by steps only), so a
    stopped run loses at most that much work.
    """

    max_steps: int = 700
    accelerator: str = "auto"
    devices: int = 1
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "32-true"
    threads: int = 0
    val_every_n_steps: int = 350
    val_batches: int = 16
    log_every_n_steps: int = 10
    checkpoint_every_n_steps: int = 350
    checkpoint_minutes: float = 3.0
    accumulate_grad_batches: int = 1
    compile: bool = False
    progress_bar: bool = True
    activation_checkpointing: str = "auto"

    def __post_init__(self) -> None:
        self.activation_checkpointing = str(self.activation_checkpointing).lower()  # YAML's true -> "True"
        check_choice("trainer.activation_checkpointing", self.activation_checkpointing, CHECKPOINTING)
        check_choice("trainer.accelerator", self.accelerator, ACCELERATORS)
        check_choice("trainer.strategy", self.strategy, STRATEGIES)
        check_choice("trainer.precision", self.precision, PRECISIONS)
        for key in ("max_steps", "devices", "num_nodes", "val_batches", "log_every_n_steps",
                    "accumulate_grad_batches"):
            check_range(f"trainer.{key}", getattr(self, key), 1)
        for key in ("threads", "val_every_n_steps", "checkpoint_every_n_steps", "checkpoint_minutes"):
            check_range(f"trainer.{key}", getattr(self, key), 0)


@dataclass
class TrackingConfig:
    """MLflow tracking. Default store: SQLite under ``mlruns/`` (MLflow 3 refuses a bare folder store).

    ``parent_run_id`` nests this stage's run under a pipeline/study run.
    """

    uri: str = "sqlite:///mlruns/mlflow.db"
    artifact_root: str = "mlruns/artifacts"
    experiment: str = "nope_lightning"
    run_name: str = ""
    parent_run_id: str = ""

    def __post_init__(self) -> None:
        if self.uri.startswith("file:"):
            raise ValueError("tracking.uri: MLflow 3 refuses folder stores; use sqlite:///path/mlflow.db")
        if "://" not in self.uri and not self.uri.startswith("databricks"):
            raise ValueError(f"tracking.uri={self.uri!r} is not a URI; use e.g. sqlite:///mlruns/mlflow.db")


def small_recipe_trainer() -> TrainerConfig:
    """The ``small`` recipe's trainer: 2 CPU processes (DDP, one thread each: the most tokens per second on
    2 cores), 2,750 steps of 2 x 8 windows of 128 tokens (5.6 M tokens)."""
    return TrainerConfig(max_steps=2750, accelerator="cpu", devices=2, strategy="ddp", val_every_n_steps=550,
                         checkpoint_every_n_steps=550)
