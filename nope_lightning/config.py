"""Typed configuration: dataclass schema <- YAML <- ``key=value`` overrides, merged with OmegaConf.

Every stage has one config dataclass built from the shared pieces below. ``load_config`` merges the
defaults of that dataclass with an optional YAML file (which holds only differences) and a dotlist of
command-line overrides, then turns the result back into the dataclass. Unknown keys, wrong types,
bad choices and out-of-range values all raise ``ValueError`` naming the key, before any compute.

Units: temperatures (``model.temperature`` and per-head tables) are in units of 1/sqrt(head_size):
``1.0`` is the standard softmax scale, the papers' "1.2" means lambda = 1.2/sqrt(d).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nope_lightning.paper import CLAIMS_BY_ID

POS_ENCODINGS = ("nope", "rope", "alibi", "learned", "sinusoidal", "t5")
ROPE_SCALINGS = ("none", "pi", "ntk", "dynamic_ntk", "yarn", "yarn_paper")
ATTENTION_BACKENDS = ("sdpa", "flash")
STRATEGIES = ("auto", "ddp", "ddp_spawn", "fsdp", "fsdp2")
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "64-true")
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")
#: The fewest bootstrap resamples a config may ask for: below ~100 the 2.5 % / 97.5 % percentiles rest on a
#: handful of resamples and move from run to run.
MIN_RESAMPLES = 100

T = TypeVar("T")


def check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{key}={value!r} is not a valid choice; pick one of {', '.join(choices)}")


def check_bootstrap(key: str, resamples: int) -> None:
    """A bootstrap needs enough resamples for stable 2.5 % / 97.5 % percentiles (``stats.MIN_RESAMPLES``)."""
    if resamples < MIN_RESAMPLES:
        raise ValueError(f"{key}={resamples} bootstrap resamples are too few for a 95 % interval: use >= "
                         f"{MIN_RESAMPLES} (1000 is the default)")


def check_range(key: str, value: float, low: float | None = None, high: float | None = None,
                low_open: bool = False) -> None:
    """Raise ``ValueError`` unless ``low <= value <= high`` (``low < value`` when ``low_open``)."""
    if low is not None and (value <= low if low_open else value < low):
        op = ">" if low_open else ">="
        raise ValueError(f"{key}={value} is out of range: it must be {op} {low}")
    if high is not None and value > high:
        raise ValueError(f"{key}={value} is out of range: it must be <= {high}")


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
    ``runs:/<run_id>/<artifact path>``, and ``nope_lightning.extension`` resolves both references for the
    evaluated model (the fit is refused when it was run on another model); under ``model`` the settings are
    resolved ones: local files and no fit.
    """

    uniform: float = 1.0
    table: str = ""
    log_slope: float = 0.0
    log_slope_table: str = ""
    log_slope_fit: str = ""

    def check(self, prefix: str, resolved: bool) -> None:
        """Raise ``ValueError`` naming ``prefix.<key>`` for a bad value; ``resolved``: refuse references."""
        check_range(f"{prefix}.uniform", self.uniform, 0.0, low_open=True)
        check_range(f"{prefix}.log_slope", self.log_slope, 0.0)  # a < 0 would make max(1, ...) 1 everywhere
        if (self.log_slope > 0) + bool(self.log_slope_table) + bool(self.log_slope_fit) > 1:
            raise ValueError(f"{prefix}.log_slope, log_slope_table and log_slope_fit all set the slopes a: give one")
        if not resolved:
            return
        if self.log_slope_fit:
            raise ValueError(f"{prefix}.log_slope_fit: a model takes the slope itself ({prefix}.log_slope=<a>); "
                             f"a scale-search fit is for evaluate's extension.temperature.log_slope_fit")
        for key in ("table", "log_slope_table"):
            if getattr(self, key).startswith("runs:/"):
                raise ValueError(f"{prefix}.{key}: a model reads a local file; a runs:/ artifact is for "
                                 f"evaluate's extension.temperature.{key}")


@dataclass
class ModelConfig:
    """Architecture of the causal LM (litgpt block: RMSNorm, SwiGLU MLP, grouped-query attention).

    ``n_query_groups=0`` means one key/value head per query head (plain multi-head attention).
    ``max_positions`` sizes the learned absolute-position table (and bounds every PE's usable length).
    ``temperature``: the attention temperatures (``AttentionTemperature``, resolved: local files, no fit),
    an evaluation-time setting like ``rope_scaling``; ``ssmax`` pre-trains with Scalable-Softmax's learned
    per-head ``s ln(i+1)`` multiplier (nope, alibi, rope).
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

    def __post_init__(self) -> None:
        check_choice("model.pos_encoding", self.pos_encoding, POS_ENCODINGS)
        check_choice("model.attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        for key in ("n_layer", "n_head", "n_embd", "intermediate_size", "max_positions"):
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

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_query_groups or self.n_head


@dataclass
class DataConfig:
    """Corpus, tokenizer and split settings.

    ``corpus``: ``kjv`` (the 66 books of the King James Bible; no fetch: the ``small`` recipe's corpus),
    ``books`` (KJV Bible + Shakespeare/Milton + Austen), ``code`` (CPython stdlib), ``math`` (HOL Light,
    Metamath, Coq), ``tiny`` (a few KJV books; no fetch, for tests) or a path to a folder of
    ``.txt``/``.jsonl`` files. Splits are by whole document with ``split_seed``.
    ``cache_dir`` empty means ``$NOPE_LIGHTNING_CACHE`` or ``~/.cache/nope_lightning``.
    """

    corpus: str = "kjv"
    vocab_size: int = 2048
    split_seed: int = 1234
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    cache_dir: str = ""
    num_workers: int = 0

    def __post_init__(self) -> None:
        check_range("data.vocab_size", self.vocab_size, 260)
        check_range("data.val_fraction", self.val_fraction, 0.0, 0.5, low_open=True)
        check_range("data.test_fraction", self.test_fraction, 0.0, 0.5, low_open=True)
        check_range("data.num_workers", self.num_workers, 0)
        if not self.corpus:
            raise ValueError("data.corpus is empty: name a corpus (kjv, books, code, math, tiny) or a folder")

    @property
    def cache_path(self) -> Path:
        root = self.cache_dir or os.environ.get("NOPE_LIGHTNING_CACHE") or "~/.cache/nope_lightning"
        return Path(root).expanduser()


@dataclass
class OptimConfig:
    """AdamW with linear warm-up then cosine decay to ``min_lr_ratio * lr``."""

    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0

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
    """Lightning Trainer settings (the only place they are read is ``run.build_trainer``).

    ``threads=0`` picks the measured best intra-op thread count for this host (see README: on 2 cores
    one thread per process beats two). ``val_every_n_steps=0`` validates once, at the end.

    ``strategy``: ``fsdp`` is Lightning's FSDP1 (CUDA only); ``fsdp2`` is ``torch.distributed.fsdp.fully_shard``
    (``run.FSDP2Strategy``: CUDA or CPU/gloo, frozen weights get no gradient, ``32-true`` or ``bf16-mixed``).
    ``activation_checkpointing`` recomputes each transformer block's activations in the backward pass under
    both FSDP strategies (memory for compute; the other strategies ignore it).
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
    accumulate_grad_batches: int = 1
    compile: bool = False
    progress_bar: bool = True
    activation_checkpointing: bool = True

    def __post_init__(self) -> None:
        check_choice("trainer.accelerator", self.accelerator, ACCELERATORS)
        check_choice("trainer.strategy", self.strategy, STRATEGIES)
        check_choice("trainer.precision", self.precision, PRECISIONS)
        for key in ("max_steps", "devices", "num_nodes", "val_batches", "log_every_n_steps",
                    "accumulate_grad_batches"):
            check_range(f"trainer.{key}", getattr(self, key), 1)
        for key in ("threads", "val_every_n_steps", "checkpoint_every_n_steps"):
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


PASSKEY_PROMPTS = ("reference", "compact")
RETRIEVAL_FILLERS = ("corpus", "reference", "mixed")
RETRIEVAL_LENGTHS = ("uniform", "full")
SPLITS = ("val", "test")
DATA_MIXES = ("recipe", "text")


@dataclass
class RetrievalConfig:
    """Passkey sequences mixed into pre-training (``data/retrieval.py``); off (``fraction=0``) by default.

    ``fraction`` of the training windows (expected share, in [0, 1)) become a passkey prompt whose haystack
    is corpus text (``filler=corpus``), the reference passkey filler (``reference``) or either (``mixed``),
    followed by the key; ``prompt`` is the passkey prompt form (``compact`` drops the task line so the prompt
    fits short windows) and should match evaluate's ``passkey_prompt``. ``length``: ``uniform`` draws the
    prompt's length uniformly up to the window (the rest is corpus text), ``full`` makes every prompt fill the
    window, so the key-to-question distance is uniform over the whole of ``train_len``.
    """

    fraction: float = 0.0
    prompt: str = "compact"
    filler: str = "mixed"
    length: str = "uniform"

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction < 1.0:
            raise ValueError(f"retrieval.fraction={self.fraction} is out of range: it must be in [0, 1)")
        check_choice("retrieval.prompt", self.prompt, PASSKEY_PROMPTS)
        check_choice("retrieval.filler", self.filler, RETRIEVAL_FILLERS)
        check_choice("retrieval.length", self.length, RETRIEVAL_LENGTHS)


def small_recipe_trainer() -> TrainerConfig:
    """The ``small`` recipe's trainer: 2 CPU processes (DDP, one thread each: the most tokens per second on
    2 cores), 2,750 steps of 2 x 8 windows of 128 tokens (5.6 M tokens)."""
    return TrainerConfig(max_steps=2750, accelerator="cpu", devices=2, strategy="ddp", val_every_n_steps=550,
                         checkpoint_every_n_steps=550)


@dataclass
class PretrainConfig:
    """``nope-lightning run pretrain``: a causal LM trained from scratch at ``train_len`` tokens.

    The defaults are the ``small`` recipe, measured to show paper 001's effects on a 2-core CPU in ~10
    minutes: a 4 x 128 model on the KJV at ``train_len`` 128, AdamW at a constant 2e-3 after 100 warm-up
    steps (a cosine decay trains a model that does not break past L at this budget), 5.6 M tokens over 2
    DDP processes, and 40 % retrieval sequences filling the whole window (``retrieval``) so passkey
    accuracy exists inside L.
    ``batch_size`` is per process. ``tokens_per_parameter`` (unset: ``trainer.max_steps`` steps) sets the
    training budget instead: that many training tokens per non-embedding parameter (Kaplan et al. 2020's count:
    token, output and absolute-position embeddings excluded), rounded to whole optimizer steps.
    ``out_dir`` empty means ``mlruns/checkpoints/pretrain/<run name>``; with ``resume=true`` a run restarted
    with the same ``out_dir`` continues from its last checkpoint.
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(min_lr_ratio=1.0))
    trainer: TrainerConfig = field(default_factory=small_recipe_trainer)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    retrieval: RetrievalConfig = field(default_factory=lambda: RetrievalConfig(fraction=0.4, length="full"))
    train_len: int = 128
    batch_size: int = 8
    tokens_per_parameter: float | None = None
    seed: int = 1234
    name: str = ""
    out_dir: str = ""
    resume: bool = True

    def __post_init__(self) -> None:
        check_range("train_len", self.train_len, 1)
        check_range("batch_size", self.batch_size, 1)
        if self.tokens_per_parameter is not None and self.tokens_per_parameter <= 0:
            raise ValueError(f"tokens_per_parameter={self.tokens_per_parameter} is a training budget of no tokens: "
                             f"give a positive number, or leave it unset to train trainer.max_steps steps")
        if self.train_len > self.model.max_positions:
            raise ValueError(f"train_len={self.train_len} exceeds model.max_positions="
                             f"{self.model.max_positions}; raise model.max_positions")


def _format_error(err: OmegaConfBaseException) -> str:
    key = getattr(err, "full_key", None) or ""
    msg = str(err).splitlines()[0]
    return f"config key '{key}': {msg}" if key else msg


def load_config(cls: type[T], yaml_path: str | os.PathLike | None = None,
                overrides: list[str] | tuple[str, ...] = ()) -> T:
    """Merge ``cls`` defaults <- YAML file <- ``key=value`` overrides into a validated ``cls``.

    Raises ``ValueError`` (naming the key) for unknown keys, wrong types, bad choices, out-of-range
    values and malformed overrides; ``FileNotFoundError`` for a missing YAML file.
    """
    layers: list[Any] = [OmegaConf.structured(cls)]
    if yaml_path is not None:
        path = Path(yaml_path)
        if not path.is_file():
            raise FileNotFoundError(f"config file not found: {path}")
        loaded = OmegaConf.load(path)
        if not OmegaConf.is_dict(loaded):
            raise ValueError(f"{path}: a config file must hold a mapping of keys, got {type(loaded).__name__}")
        layers.append(loaded)
    bad = [o for o in overrides if "=" not in o or o.startswith("=")]
    if bad:
        raise ValueError(f"overrides must look like key=value, got: {' '.join(bad)}")
    try:
        layers.append(OmegaConf.from_dotlist(list(overrides)))
        merged = OmegaConf.merge(*layers)
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            raise ValueError(f"missing required config values: {', '.join(missing)}")
        return OmegaConf.to_object(merged)  # runs every __post_init__ check
    except OmegaConfBaseException as err:
        raise ValueError(_format_error(err)) from None
    except yaml.YAMLError as err:  # a malformed value in an override, e.g. an unquoted '{' in a list
        raise ValueError(f"cannot parse an override value: {str(err).splitlines()[0]} (quote it)") from None


def to_dict(cfg: Any) -> dict[str, Any]:
    """The resolved config as a plain nested dict (for logging and saving)."""
    return dataclasses.asdict(cfg)


def to_yaml(cfg: Any) -> str:
    """The resolved config as YAML text; ``load_config(type(cfg), file)`` reads it back unchanged."""
    return OmegaConf.to_yaml(OmegaConf.create(to_dict(cfg)))


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (MLflow params)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


@dataclass
class PrepareConfig:
    """``nope-lightning run prepare``: tokenizer + packed token files of ``data.corpus`` (cached)."""

    data: DataConfig = field(default_factory=DataConfig)


@dataclass
class ExtensionConfig:
    """A length-extension setting applied at evaluation time to a trained model (no training).

    ``temperature``: the attention temperatures (``AttentionTemperature``: uniform lambda, per-head table,
    log-length slopes), tables as files or ``runs:/<run_id>/<artifact path>``; ``rope_scaling``: NTK /
    dynamic NTK / YaRN zero-shot (or PI/YaRN of a fine-tuned model) for RoPE models (``method=none`` keeps
    the model's own); ``attention_backend``: sdpa or flash. ``nope_lightning.extension`` resolves it for one
    model.
    """

    temperature: AttentionTemperature = field(default_factory=AttentionTemperature)
    rope_scaling: RopeScalingConfig = field(default_factory=RopeScalingConfig)
    attention_backend: str = "sdpa"

    def __post_init__(self) -> None:
        self.temperature.check("extension.temperature", resolved=False)
        check_choice("extension.attention_backend", self.attention_backend, ATTENTION_BACKENDS)


LONGCTX_TASKS = ("multikey_retrieval", "passage_retrieval", "passage_count", "variable_tracking")


@dataclass
class EvaluateConfig:
    """``nope-lightning run evaluate checkpoint=<export folder | runs:/<id>/model>``.

    ``eval_lengths`` unset means 1x, 2x, 4x, 8x the model's ``train_len``; an empty list means no perplexity;
    ``passkey_lengths`` unset means the eval lengths, an empty list means no passkey. ``stride=0`` means
    ``train_len // 8`` (the paper's 256 at 2K); empty ``corpora`` means the model's own corpus.
    ``split``: ``test`` for what a report shows, ``val`` for every selection (the lambda search, HeadScale's
    init); metric names start with it, and passkey keys and long-context samples are drawn from it (selection
    never sees the reporting prompts). Perplexity scores about ``ppl_tokens`` target tokens per (corpus,
    length), in windows spread evenly over the split; **every length scores the same target tokens** (each
    window ends on the same token at every length and scores its last ``stride`` targets, so every scored token
    has >= length - stride tokens of context), independent of batch size and process count. Per-position
    log-PPL (and, with ``entropy``, attention entropy in nats) come from ``position_windows`` non-overlapping
    windows of the longest length. Every perplexity, curve and passkey figure is stored per window / prompt, and
    its interval is a ``bootstrap``-resample bootstrap over blocks of windows (passkey: Wilson).
    Passkey: ``passkey_depths`` depths x ``passkey_keys`` keys per length (paper 001: 10 x 10), ``passkey_prompt``
    ``reference`` or ``compact`` (no task line); a length too short for the prompt is skipped with one line.
    ``longbench_files``: LongBench(-E) JSONL files, run with the prompts and budgets of the user's LongBench
    ``longbench_config`` folder (``longbench_beams`` >= 1). ``harness_tasks``: lm-evaluation-harness tasks
    (``harness_include``: a folder of extra task YAMLs). Results are saved under ``out_dir`` (default
    ``mlruns/results/evaluate/<run name>-<config hash>``, beside the artifact root) before they are logged; a
    rerun after a tracking failure logs them without computing again.
    """

    checkpoint: str = ""
    extension: ExtensionConfig = field(default_factory=ExtensionConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(progress_bar=True))
    corpora: list[str] = field(default_factory=list)
    split: str = "test"
    eval_lengths: list[int] | None = None
    stride: int = 0
    ppl_tokens: int = 16384
    batch_size: int = 4
    position_windows: int = 64
    position_buckets: int = 32
    entropy: bool = True
    entropy_chunk: int = 256
    bootstrap: int = 1000
    passkey_lengths: list[int] | None = None
    passkey_depths: int = 10
    passkey_keys: int = 10
    passkey_prompt: str = "reference"
    longctx_tasks: list[str] = field(default_factory=lambda: list(LONGCTX_TASKS))
    longctx_samples: int = 5
    longbench_files: list[str] = field(default_factory=list)
    longbench_config: str = ""
    longbench_beams: int = 1
    harness_tasks: list[str] = field(default_factory=list)
    harness_include: str = ""
    max_new_tokens: int = 8
    seed: int = 1234
    name: str = ""
    out_dir: str = ""
    plots: bool = True

    def __post_init__(self) -> None:
        if not self.checkpoint:
            raise ValueError("checkpoint= is required: an export folder (…/model) or runs:/<run_id>/model")
        for key in ("stride", "position_windows", "passkey_keys", "longctx_samples"):
            check_range(key, getattr(self, key), 0)
        for key in ("ppl_tokens", "batch_size", "entropy_chunk", "max_new_tokens", "passkey_depths",
                    "position_buckets"):
            check_range(key, getattr(self, key), 1)
        check_bootstrap("bootstrap", self.bootstrap)
        for key in ("eval_lengths", "passkey_lengths"):
            for length in getattr(self, key) or ():
                check_range(key, length, 2)
        for task in self.longctx_tasks:
            check_choice("longctx_tasks", task, LONGCTX_TASKS)
        check_choice("split", self.split, SPLITS)
        check_range("longbench_beams", self.longbench_beams, 1)
        if self.longbench_files and not self.longbench_config:
            raise ValueError("longbench_files need longbench_config=<your LongBench config folder> (the one "
                             "holding dataset2prompt.json and dataset2maxlen.json)")
        check_choice("passkey_prompt", self.passkey_prompt, PASSKEY_PROMPTS)

    def perplexity_lengths(self, train_len: int) -> list[int]:
        """The perplexity lengths: ``eval_lengths`` (an empty list: none), unset: 1x, 2x, 4x, 8x ``train_len``."""
        return sorted(self.eval_lengths if self.eval_lengths is not None else [train_len * m for m in (1, 2, 4, 8)])

    def passkey_lengths_for(self, train_len: int) -> list[int]:
        """The passkey lengths: ``passkey_lengths`` (an empty list: none), unset: the perplexity lengths; none
        when ``passkey_keys=0``."""
        if not self.passkey_keys:
            return []
        return sorted(self.passkey_lengths if self.passkey_lengths is not None else self.perplexity_lengths(train_len))


def _check_target(key: str, value: int) -> None:
    check_range(key, value, 2)


@dataclass
class ScaleSearchConfig:
    """``nope-lightning run scale-search checkpoint=… target_lengths=[…]``: an Optuna study over a uniform
    temperature lambda (units of 1/sqrt(d)); each trial is an ``evaluate`` run at lambda (nested in MLflow).

    Every trial is scored on the **validation** split (selection never sees test data). The grid is
    ``grid`` if given, else ``grid_min..grid_max`` in steps of ``grid_step``: 0.8-2.5 by 0.05, i.e. the
    paper's 1.0-2.5 reaching below 1 so that an optimum at 1.0 is not an artefact of the grid's edge. The
    grid must contain 1.0 (the default temperature, HeadScale's "w/o init" start). ``storage`` empty means ``sqlite:///mlruns/optuna.db``; ``study_name`` empty derives
    one from the checkpoint and settings, so a killed search resumes where it stopped. The per-position
    curves behind the fit ``lambda = 1 + a ln s`` come from ``position_windows`` non-overlapping windows of the
    longest target (fewer if the split is shorter): each bucket's optimum is a noisy argmin, so the fit needs
    far more windows than a plot does. The best lambda per target and the fit a / R^2 get 95 % intervals from a
    ``bootstrap``-resample bootstrap over the validation windows (every trial scores the same windows).
    """

    checkpoint: str = ""
    target_lengths: list[int] = field(default_factory=list)
    grid: list[float] = field(default_factory=list)
    grid_min: float = 0.8
    grid_max: float = 2.5
    grid_step: float = 0.05
    sampler: str = "grid"
    num_trials: int = 0
    storage: str = ""
    study_name: str = ""
    stride: int = 0
    ppl_tokens: int = 16384
    batch_size: int = 4
    position_windows: int = 32
    position_buckets: int = 32
    bootstrap: int = 1000
    seed: int = 1234
    name: str = ""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(progress_bar=False))

    def __post_init__(self) -> None:
        if not self.checkpoint:
            raise ValueError("checkpoint= is required: an export folder (…/model) or runs:/<run_id>/model")
        if not self.target_lengths:
            raise ValueError("target_lengths= is required, e.g. target_lengths=[512,1024]")
        for length in self.target_lengths:
            _check_target("target_lengths", length)
        check_choice("sampler", self.sampler, ("grid", "tpe"))
        for value in (*self.grid, self.grid_min, self.grid_max, self.grid_step):
            if value <= 0:
                raise ValueError(f"the lambda grid must be positive (got {value}); lambda is a softmax "
                                 f"temperature in units of 1/sqrt(d)")
        if self.grid_max < self.grid_min:
            raise ValueError(f"grid_max={self.grid_max} < grid_min={self.grid_min}")
        if 1.0 not in self.lambdas:
            raise ValueError(f"the lambda grid {self.lambdas[:4]}... does not contain 1.0, the default "
                             f"temperature (HeadScale's init=default start); add it to grid= or align "
                             f"grid_min/grid_step with 1.0")
        for key in ("num_trials", "stride"):
            check_range(key, getattr(self, key), 0)
        for key in ("ppl_tokens", "batch_size", "position_windows", "position_buckets"):
            check_range(key, getattr(self, key), 1)
        check_bootstrap("bootstrap", self.bootstrap)

    @property
    def lambdas(self) -> list[float]:
        """The grid of lambdas, rounded to 6 decimals so grid points compare exactly."""
        if self.grid:
            return sorted({round(v, 6) for v in self.grid})
        count = int(round((self.grid_max - self.grid_min) / self.grid_step)) + 1
        return [round(self.grid_min + i * self.grid_step, 6) for i in range(count)]


@dataclass
class HeadScaleConfig:
    """``nope-lightning run headscale checkpoint=… target_len=…``: per-head temperatures only, model frozen.

    ``init``: ``search`` (the best uniform lambda at ``target_len`` from ``scale_search`` — a scale-search
    MLflow run id, ``runs:/<id>`` or its ``scale_search.json``), ``default`` (1.0, the ablation) or a number.
    ``constraint``: the focus constraint lambda >= 1 (i.e. >= 1/sqrt(d)); false is the ablation.
    Defaults follow the paper: AdamW (0.9, 0.95), no weight decay, lr 0.1, 20 warm-up steps, cosine to
    0.1 lr, 200 steps, batch 8, a data seed different from pre-training.
    ``parameterization``: ``lambda`` (the paper's per-head temperature) or ``log`` (HeadScale-log: one slope a
    per head of the log-length temperature ``max(1, 1 + a ln((i+1)/train_len))``, a >= 0 by projection, the
    same optimizer and budget; ``init=search`` starts every head from the scale-search's fit a,
    ``default`` from a = 0, a number from that a).
    ``data_mix``: ``recipe`` (default) tunes on the model's own pre-training mix at ``target_len`` (its
    ``retrieval`` share of passkey sequences included), so a skill the recipe taught is not tuned away by a
    data shift; ``text`` tunes on corpus text only (the paper's recipe, whose models saw text only).
    """

    checkpoint: str = ""
    target_len: int = 0
    init: str = "search"
    scale_search: str = ""
    constraint: bool = True
    parameterization: str = "lambda"
    data_mix: str = "recipe"
    steps: int = 200
    batch_size: int = 8
    seed: int = 4321
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=0.1, warmup_steps=20, min_lr_ratio=0.1,
                                                                   weight_decay=0.0, grad_clip=1.0))
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(val_every_n_steps=0, val_batches=4,
                                                                         checkpoint_every_n_steps=50))
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    entropy_windows: int = 2
    name: str = ""
    out_dir: str = ""

    def __post_init__(self) -> None:
        if not self.checkpoint:
            raise ValueError("checkpoint= is required: an export folder (…/model) or runs:/<run_id>/model")
        _check_target("target_len", self.target_len)
        if self.init not in ("search", "default"):
            try:
                value = float(self.init)
            except ValueError:
                raise ValueError(f"init={self.init!r}: use search, default or a number (lambda in units of "
                                 f"1/sqrt(d))") from None
            check_range("init", value, 0.0, low_open=True)
        if self.init == "search" and not self.scale_search:
            raise ValueError("init=search needs scale_search=<scale-search run id or scale_search.json>; "
                             "or use init=default / init=<lambda>")
        check_choice("parameterization", self.parameterization, ("lambda", "log"))
        check_choice("data_mix", self.data_mix, DATA_MIXES)
        if self.parameterization == "log" and not self.constraint:
            raise ValueError("parameterization=log has no constraint=false ablation: a >= 0 is part of the "
                             "definition (with a < 0, max(1, 1 + a ln((i+1)/L)) is 1 everywhere)")
        for key in ("steps", "batch_size"):
            check_range(key, getattr(self, key), 1)
        check_range("entropy_windows", self.entropy_windows, 0)


@dataclass
class FinetuneConfig:
    """``nope-lightning run finetune checkpoint=<RoPE model> rope_scaling.method=pi|yarn target_len=…``:
    full fine-tuning at ``target_len`` with the paper's settings (lr 1e-4, 200 steps).

    ``budget``: ``fair`` trains on HeadScale's token budget (``steps`` x ``batch_size`` x ``target_len``),
    ``raw`` on ``raw_multiplier`` times that. ``rope_scaling.factor=1`` (the default) means
    target_len / train_len. ``data_mix``: as HeadScale's (``recipe``: the model's pre-training mix, retrieval
    sequences included; ``text``: corpus text only).
    """

    checkpoint: str = ""
    target_len: int = 0
    rope_scaling: RopeScalingConfig = field(default_factory=lambda: RopeScalingConfig(method="pi"))
    data_mix: str = "recipe"
    budget: str = "fair"
    raw_multiplier: int = 5
    steps: int = 200
    batch_size: int = 8
    seed: int = 4321
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-4, warmup_steps=20, min_lr_ratio=0.1,
                                                                   weight_decay=0.0, grad_clip=1.0))
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(val_every_n_steps=0, val_batches=4,
                                                                         checkpoint_every_n_steps=0))
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    name: str = ""
    out_dir: str = ""

    def __post_init__(self) -> None:
        if not self.checkpoint:
            raise ValueError("checkpoint= is required: the export folder of a RoPE model")
        _check_target("target_len", self.target_len)
        check_choice("rope_scaling.method", self.rope_scaling.method, ("pi", "yarn", "yarn_paper"))
        check_choice("budget", self.budget, ("fair", "raw"))
        check_choice("data_mix", self.data_mix, DATA_MIXES)
        for key in ("raw_multiplier", "steps", "batch_size"):
            check_range(key, getattr(self, key), 1)

    @property
    def total_steps(self) -> int:
        return self.steps * (self.raw_multiplier if self.budget == "raw" else 1)


@dataclass
class PipelineStep:
    """One stage of a pipeline. ``overrides`` may reference earlier steps' results as ``@{step_id.key}``
    (e.g. ``checkpoint=runs:/@{pretrain_nope.run_id}/model``), the replicate's seed as ``@{seed}`` and the
    matrix point's values as ``@{matrix.<key>}``; ``label`` names the method in the report. ``only`` limits the
    step to the matrix points whose values it lists (``{tokens_per_parameter: [4, 40]}``; empty: every point).
    ``subprocess`` runs the step as its own ``nope-lightning run`` process (needed for multi-process
    strategies: Lightning's DDP/FSDP launcher re-executes the command line in every extra rank)."""

    id: str = ""
    stage: str = ""
    config: str = ""
    overrides: list[str] = field(default_factory=list)
    label: str = ""
    subprocess: bool = False
    only: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class PipelineConfig:
    """``nope-lightning run pipeline experiments/<name>.yaml``: a chain of stages under one MLflow parent run.

    ``common`` overrides go to every step whose config has that key (e.g. ``trainer.progress_bar=false``).
    ``seeds``: every step runs once per seed (a replicate: pre-training steps train with ``seed=<seed>``, every
    later step runs on that replicate's models), each run tagged with its seed; empty means one replicate with
    the stages' own seeds. ``matrix``: every step runs once per point of the grid ``{key: [values]}`` (keys are
    used as ``@{matrix.<key>}`` in overrides), inside each replicate. Steps run replicate by replicate, point by
    point, in file order. ``claims``: ids of paper 001's claims (``paper.CLAIMS``) the report tests; each names
    the methods (step labels) it compares, which the file must run. ``bootstrap``: resamples behind every
    interval of the report. ``sweep``: ``{x: <matrix key>, lines: <matrix key>}`` adds the report's sweep
    section (measures per matrix point, plotted against ``x``, one line per value of ``lines``).
    A step whose resolved config matches a finished step of the same pipeline run is skipped; a killed
    pipeline resumes where it stopped. ``report`` runs the report stage at the end. ``dry_run`` runs nothing:
    it resolves and checks every step and prints the plan (``nope_lightning/plan.py``).
    """

    name: str = ""
    steps: list[PipelineStep] = field(default_factory=list)
    common: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    matrix: dict[str, list[str]] = field(default_factory=dict)
    claims: list[str] = field(default_factory=list)
    bootstrap: int = 1000
    sweep: dict[str, str] = field(default_factory=dict)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    report: bool = True
    dry_run: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a pipeline needs a name")
        if not self.steps:
            raise ValueError(f"pipeline {self.name!r} has no steps")
        seen: set[str] = set()
        for step in self.steps:
            if not step.id or not step.stage:
                raise ValueError(f"pipeline {self.name!r}: every step needs an id and a stage ({step})")
            if step.id in seen:
                raise ValueError(f"pipeline {self.name!r}: duplicate step id {step.id!r}")
            seen.add(step.id)
            for key, values in step.only.items():
                if key not in self.matrix or not set(values) <= set(self.matrix[key]):
                    raise ValueError(f"step {step.id!r}: only={{{key}: {values}}} names matrix values the file's "
                                     f"matrix does not have ({key}: {self.matrix.get(key, 'no such key')})")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds={self.seeds} repeats a seed: give distinct integers, e.g. seeds=[1234,2345,3456]")
        for key, values in self.matrix.items():
            if not key.isidentifier() or not values or len(set(values)) != len(values):
                raise ValueError(f"matrix key {key!r}: a matrix needs identifier keys and distinct values "
                                 f"(got {values})")
        check_bootstrap("bootstrap", self.bootstrap)
        if self.sweep and (set(self.sweep) != {"x", "lines"} or not set(self.sweep.values()) <= set(self.matrix)):
            raise ValueError(f"sweep={self.sweep}: give sweep={{x: <matrix key>, lines: <matrix key>}} "
                             f"(matrix keys: {', '.join(self.matrix) or 'none'})")
        self._check_claims()

    def _check_claims(self) -> None:
        """Every claim must be known and every method it compares must be run by a step of this file."""
        methods = {step.label or step.id for step in self.steps}
        problems = []
        for claim_id in self.claims:
            claim = CLAIMS_BY_ID.get(claim_id)
            if claim is None:
                close = difflib.get_close_matches(claim_id, CLAIMS_BY_ID, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                problems.append(f"unknown claim {claim_id!r}; {hint}claims: {', '.join(CLAIMS_BY_ID)}")
                continue
            needed = {*(claim.methods if not claim.min_methods else ()),
                      *(m for p in claim.preconditions for m in p.methods)}
            for method in sorted(needed - methods):
                problems.append(f"claim {claim_id!r} compares method {method!r}, which no step of pipeline "
                                f"{self.name!r} runs (a step label or id); add the step or drop the claim")
            if claim.min_methods and len(set(claim.methods) & methods) < claim.min_methods:
                problems.append(f"claim {claim_id!r} needs at least {claim.min_methods} of the methods "
                                f"{', '.join(claim.methods)}; pipeline {self.name!r} runs "
                                f"{len(set(claim.methods) & methods)}")
        if problems:
            raise ValueError("\n".join(problems))


@dataclass
class ReportConfig:
    """``nope-lightning run report run=<pipeline run id>``: markdown tables + PNG plots from tracked runs,
    written under ``out_dir`` (default ``mlruns/reports/<run id>``) and logged to MLflow. The claims tested
    (``claims``), the sweep section (``sweep``) and the bootstrap resamples (``bootstrap``) are the pipeline's
    own (its logged ``config.yaml``) unless given here (unset: ``None`` / ``0``)."""

    run: str = ""
    out_dir: str = ""
    claims: list[str] | None = None
    sweep: dict[str, str] | None = None
    bootstrap: int = 0
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def __post_init__(self) -> None:
        if not self.run:
            raise ValueError("run= is required: the MLflow run id of a pipeline")
        for claim_id in self.claims or ():
            if claim_id not in CLAIMS_BY_ID:
                raise ValueError(f"unknown claim {claim_id!r}; claims: {', '.join(CLAIMS_BY_ID)}")
        if self.bootstrap:
            check_bootstrap("bootstrap", self.bootstrap)
