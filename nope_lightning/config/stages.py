"""The stage configs: ``nope-lightning run <stage>`` reads one of these (``run.STAGES``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from nope_lightning.config.core import (
    ATTENTION_BACKENDS,
    DATA_MIXES,
    LONGCTX_TASKS,
    PASSKEY_PROMPTS,
    SPLITS,
    check_bootstrap,
    check_choice,
    check_range,
    check_target_length,
)
from nope_lightning.config.data import DataConfig, RetrievalConfig
from nope_lightning.config.parts import (
    AttentionTemperature,
    ModelConfig,
    OptimConfig,
    RopeScalingConfig,
    TrackingConfig,
    TrainerConfig,
    small_recipe_trainer,
)


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
    token, output and absolute-position embeddings excluded), rounded to whole optimizer steps. Both given:
    the later layer wins, with one line (in one file: ``tokens_per_parameter``; on one command line: refused).
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
    budget_keys = ("tokens_per_parameter", "trainer.max_steps")  # two keys, one budget: core.settle_budget

    def __post_init__(self) -> None:
        check_range("train_len", self.train_len, 1)
        check_range("batch_size", self.batch_size, 1)
        if self.tokens_per_parameter is not None and self.tokens_per_parameter <= 0:
            raise ValueError(f"tokens_per_parameter={self.tokens_per_parameter} is a training budget of no tokens: "
                             f"give a positive number, or leave it unset to train trainer.max_steps steps")
        if self.train_len > self.model.max_positions:
            raise ValueError(f"train_len={self.train_len} exceeds model.max_positions="
                             f"{self.model.max_positions}; raise model.max_positions")


@dataclass
class PrepareConfig:
    """``nope-lightning run prepare``: tokenizer + packed token files of ``data.corpus`` (cached)."""

    data: DataConfig = field(default_factory=DataConfig)


@dataclass
class ExtensionConfig:
    """A length-extension setting applied at evaluation time to a trained model (no training).

    ``temperature``: the attention temperatures (``AttentionTemperature``: uniform lambda, per-head table,
    log-length slopes, iRoPE's ``irope_beta`` / ``irope_floor`` on the NoPE layers), tables as files or
    ``runs:/<run_id>/<artifact path>``; ``rope_scaling``: NTK /
    dynamic NTK / YaRN zero-shot (or PI/YaRN of a fine-tuned model) for RoPE models (``method=none`` keeps
    the model's own); ``attention_backend``: sdpa or flash. ``nope_lightning.model.extension`` resolves it for one
    model.
    """

    temperature: AttentionTemperature = field(default_factory=AttentionTemperature)
    rope_scaling: RopeScalingConfig = field(default_factory=RopeScalingConfig)
    attention_backend: str = "sdpa"

    def __post_init__(self) -> None:
        self.temperature.check("extension.temperature", resolved=False)
        check_choice("extension.attention_backend", self.attention_backend, ATTENTION_BACKENDS)


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
    ``longbench_config`` folder, each prompt cut in the middle to ``longbench_max_length`` tokens (0: LongBench's
    rule, the model's window minus 500; recorded with the scores), greedy (``longbench_beams`` > 1: beam search).
    LongBench files and config and harness task names are checked before any compute. ``harness_tasks``: lm-evaluation-harness tasks
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
    longbench_max_length: int = 0
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
        if self.longbench_max_length == 1 or self.longbench_max_length < 0:
            raise ValueError(f"longbench_max_length={self.longbench_max_length}: give 0 (LongBench's rule, the "
                             f"window minus 500) or a prompt budget of at least 2 tokens")
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

    ``parameter``: ``lambda`` (the above) or ``irope_beta``, a grid over iRoPE's beta instead (each trial is
    ``evaluate extension.temperature.irope_beta=beta extension.temperature.irope_floor=<irope_floor>``, F in
    units of L; a model with NoPE layers). Its grid is ``grid``, required, of betas >= 0 including 0 (the
    model without the temperature, the baseline every beta is compared with); the result has the same
    layout, its "lambda" entries holding beta (``units`` says so) and no log fit.
    """

    checkpoint: str = ""
    target_lengths: list[int] = field(default_factory=list)
    grid: list[float] = field(default_factory=list)
    grid_min: float = 0.8
    grid_max: float = 2.5
    grid_step: float = 0.05
    parameter: str = "lambda"
    irope_floor: float = 1.0
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
            check_target_length("target_lengths", length)
        check_choice("sampler", self.sampler, ("grid", "tpe"))
        check_choice("parameter", self.parameter, ("lambda", "irope_beta"))
        check_range("irope_floor", self.irope_floor, 0.0, low_open=True)
        if self.parameter == "irope_beta":
            self.check_beta_grid()
        else:
            self.check_lambda_grid()
        for key in ("num_trials", "stride"):
            check_range(key, getattr(self, key), 0)
        for key in ("ppl_tokens", "batch_size", "position_windows", "position_buckets"):
            check_range(key, getattr(self, key), 1)
        check_bootstrap("bootstrap", self.bootstrap)

    def check_beta_grid(self) -> None:
        """iRoPE's beta grid: given, >= 0, containing 0 (no temperature); the sampler draws from it."""
        if not self.grid:
            raise ValueError("parameter=irope_beta needs grid=[0,...] (betas; grid_min/max/step are lambda's)")
        if min(self.grid) < 0 or 0.0 not in self.lambdas:
            raise ValueError(f"the beta grid {self.lambdas[:4]}... must be >= 0 and contain 0 (the model "
                             f"without iRoPE's temperature)")

    def check_lambda_grid(self) -> None:
        """The lambda grid: positive, containing 1.0 (the default temperature)."""
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

    @property
    def lambdas(self) -> list[float]:
        """The grid of lambdas (betas with ``parameter=irope_beta``), rounded to 6 decimals so grid points
        compare exactly."""
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
    ``default`` from a = 0, a number from that a) or ``lambda_past`` (HeadScale past L: the per-head lambda
    applied at query positions >= train_len only, exactly 1 inside, tuned exactly as ``lambda`` is: the same
    init, constraint, floors and data; a model with NoPE layers only; evaluate it with
    ``extension.temperature.past_only=true``).
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
    budget_keys = ("steps", "trainer.max_steps")  # trainer.max_steps sets steps: PretrainConfig's rule

    def __post_init__(self) -> None:
        if not self.checkpoint:
            raise ValueError("checkpoint= is required: an export folder (…/model) or runs:/<run_id>/model")
        check_target_length("target_len", self.target_len)
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
        check_choice("parameterization", self.parameterization, ("lambda", "log", "lambda_past"))
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
    sequences included; ``text``: corpus text only). ``trainer.max_steps``: as HeadScale's.
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
    budget_keys = ("steps", "trainer.max_steps")  # trainer.max_steps sets steps: PretrainConfig's rule

    def __post_init__(self) -> None:
        if not self.checkpoint:
            raise ValueError("checkpoint= is required: the export folder of a RoPE model")
        check_target_length("target_len", self.target_len)
        check_choice("rope_scaling.method", self.rope_scaling.method, ("pi", "yarn", "yarn_paper"))
        check_choice("budget", self.budget, ("fair", "raw"))
        check_choice("data_mix", self.data_mix, DATA_MIXES)
        for key in ("raw_multiplier", "steps", "batch_size"):
            check_range(key, getattr(self, key), 1)

    @property
    def total_steps(self) -> int:
        return self.steps * (self.raw_multiplier if self.budget == "raw" else 1)
