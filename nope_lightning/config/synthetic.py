"""Configs of the synthetic length-generalization stages (Kazemnejad et al. 2023).

``SyntheticConfig`` is one run (``nope-lightning run synthetic task=<name> pos_encoding=<pe>``): one task,
one position encoding, one seed. ``SyntheticGridConfig`` is the study (``run synthetic-grid``): tasks x
PEs x seeds, each cell a ``SyntheticConfig`` made from ``base``. The schema defaults are the ``small``
CPU recipe (``conf/synthetic/small.yaml`` repeats them to document it), in the style of ``nope_lightning.config``:
every bad value raises ``ValueError`` naming its key before any compute — a longest test sequence that does not fit
``model.max_positions`` included, so every entry point (``run``, a pipeline and its dry run) refuses it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import warnings
from dataclasses import dataclass, field

from omegaconf import OmegaConf

from nope_lightning.config.core import (
    POS_ENCODINGS,
    check_choice,
    check_keys,
    check_range,
    load_config,
    to_dict,
)
from nope_lightning.config.parts import ModelConfig, OptimConfig, TrackingConfig, TrainerConfig
from nope_lightning.synthetic.core import Example
from nope_lightning.synthetic.tasks import TASKS, get_task, make_split

#: Keys of a cell that the grid sets itself (``SyntheticConfig.cell``): a task override may not set them, nor
#: ``tracking.*`` (the grid's one store, ``base.tracking``), paired with the grid key to set instead.
GRID_SET_KEYS = {"task": "tasks", "pos_encoding": "pos_encodings", "model.pos_encoding": "pos_encodings",
                 "seed": "seeds", "name": "name", "tracking": "base.tracking"}

#: Keys that make a task's format: its input and answer (``scratchpad``), the lengths it trains and is tested on
#: and how its answers are scored (``eval.*``). A recipe changes how a model learns the task (steps, width, depth,
#: lr, fresh examples), never what the task is, so a task override may not set them: a study of another format
#: sets it for the whole grid (``base.scratchpad``) and reports it as its own point.
FORMAT_KEYS = ("scratchpad", "train_max_len", "test_max_len", "eval")

#: Fields of a grid's ``base`` that came after its first grids, at their defaults (``model.<key>``: ``base.model``'s),
#: which ``SyntheticGridConfig.config_hash`` leaves out so that a grid started before them still finds its parent.
ADDED_BASE_FIELDS = {"curriculum_steps": 0, "stop_at": 0.0, "stop_patience": 1, "n_id_test": 0,
                     "model.embedding_init": "gpt2", "trainer.checkpoint_minutes": 3.0,
                     "optim.decay_position_bias": True}

#: The paper's five PEs in our names: NoPE, T5's relative bias, ALiBi, Rotary and APE (sinusoidal, as
#: the reference's ``abs_sinusoid``; ``learned`` is our other absolute variant, not in the paper's grid).
PAPER_PES = ("nope", "t5", "alibi", "rope", "sinusoidal")
PAPER_NAMES = {"nope": "NoPE", "t5": "T5", "alibi": "ALiBi", "rope": "Rotary", "sinusoidal": "APE",
               "learned": "APE (learned)"}


@dataclass
class SyntheticEvalConfig:
    """Greedy decoding and exact-match scoring.

    ``batch_size``: examples decoded together (validation and test). Decoding stops at ``<eos>`` or after
    the batch's longest gold target + ``<eos>`` + ``extra_new_tokens`` tokens; without a scratchpad a
    longer output is wrong anyway, with one a model may write a longer (still valid) scratchpad, which
    ``extra_new_tokens`` allows. ``bucket_width``: width of the length buckets of the per-length
    accuracies (1: one bucket per length).
    """

    batch_size: int = 128
    extra_new_tokens: int = 0
    bucket_width: int = 1

    def __post_init__(self) -> None:
        check_range("eval.batch_size", self.batch_size, 1)
        check_range("eval.extra_new_tokens", self.extra_new_tokens, 0)
        check_range("eval.bucket_width", self.bucket_width, 1)


def sequence_tokens(example: Example) -> int:
    """Positions of ``<bos> prompt <sep> target <eos>``: the example as trained, and as decoded in full."""
    return len(example.prompt) + len(example.target) + 3


@functools.cache
def longest_test_sequence(task: str, scratchpad: str, seed: int, train_max_len: int | None,
                          test_max_len: int | None, n: int) -> tuple[int, int]:
    """(positions, length) of the longest sequence (``sequence_tokens``) of the test split the run decodes, the
    split itself generated as the run generates it. Cached: a grid's PEs share their (task, seed)'s split, and the
    slowest (polynomial's 2000 examples with the full scratchpad) takes about 0.4 s."""
    examples = make_split(task, "test", n=n, seed=seed, scratchpad=scratchpad, train_max_len=train_max_len,
                          test_max_len=test_max_len)
    longest = max(examples, key=sequence_tokens)
    return sequence_tokens(longest), longest.length


def _small_model() -> ModelConfig:
    return ModelConfig(n_layer=4, n_head=4, n_embd=64, intermediate_size=176, max_positions=512)


def _small_optim() -> OptimConfig:
    return OptimConfig(lr=2e-3, min_lr_ratio=0.1, warmup_steps=200, weight_decay=0.05)


def _small_trainer() -> TrainerConfig:
    return TrainerConfig(max_steps=3000, val_every_n_steps=500, val_batches=4, checkpoint_every_n_steps=0,
                         log_every_n_steps=50, progress_bar=False)


@dataclass
class SyntheticConfig:
    """``nope-lightning run synthetic``: train a GPT on one task with one PE, exact match per length.

    - ``task``: a name in ``nope_lightning.synthetic.TASKS``; ``scratchpad``: one of the task's formats
      (``none``, ``full``, ``minimal``, ``full_minus_<component>``).
    - ``pos_encoding`` sets ``model.pos_encoding`` (the paper's APE is ``sinusoidal``); a different
      ``model.pos_encoding`` is ignored, with a warning.
    - ``train_max_len``/``test_max_len``: the task's own length measure (symbols, digits, ...); training
      and validation use lengths up to ``train_max_len``, the test set ``train_max_len+1 .. test_max_len``.
      0 keeps the task's default (copy/reverse 20 -> 40, arithmetic 8 -> 16, SCAN 25 -> 48).
    - ``n_train``/``n_valid``/``n_test``: examples per split (valid: in-distribution, for checkpoint
      selection; test: out of distribution, every length equally often).
    - ``n_id_test``: examples of the held-out in-distribution test split (0: none), training lengths and
      problems neither training nor validation holds (``synthetic.tasks``), decoded with the selected weights as
      the OOD test is: so that "learned" and ID accuracy can be read on data checkpoint selection never saw.
      Logged as ``synthetic/{task}/{pe}/id_test_acc`` and ``.../id_test/len{L}/acc`` per length bucket, and
      ``id_test.json`` (those numbers, one 0/1 per example and the split's ``problems_digest``); ``id_acc``
      stays validation's.
    - ``stop_at``/``stop_patience``: the stopping rule, one for every encoding (0: off, train
      ``trainer.max_steps``): training ends at the first validation where validation exact match
      (``val/id_acc``) has been >= ``stop_at`` at ``stop_patience`` consecutive validations, or at
      ``trainer.max_steps``, the cap (which the learning-rate schedule spans either way). Logged as
      ``stop/step`` (the step it ended at, also ``steps`` in ``results.json``) and ``stop/rule_met`` (1: the
      rule, 0: the cap). The weights are still the first best validation's.
    - ``batch_size``: training sequences per step; ``eval``: decoding and scoring settings.
    - ``curriculum_steps``: a curriculum over the training lengths (a recipe, not a format: the examples are the
      same): at step s < N a batch draws only training examples of length <= shortest + floor((longest - shortest)
      * s / N), so the cap rises linearly from the shortest training length at step 0 to the longest at step N;
      0 (the default, the paper's training) draws every length from the first step. Must not exceed
      ``trainer.max_steps``, or the model would never train on the longest lengths.
    - ``log_model``: log the selected weights as the MLflow artifact ``model.safetensors``.

    ``model.max_positions`` must hold the test split's longest sequence (prompt, scratchpad and answer at the
    longest test lengths) plus ``eval.extra_new_tokens``; the check generates that split (cached, under a second).
    """

    task: str = "copy_repeat"
    pos_encoding: str = "nope"
    scratchpad: str = "none"
    seed: int = 0
    n_train: int = 20_000
    n_valid: int = 256
    n_test: int = 400
    n_id_test: int = 0
    train_max_len: int = 0
    test_max_len: int = 0
    batch_size: int = 32
    curriculum_steps: int = 0
    stop_at: float = 0.0
    stop_patience: int = 1
    name: str = ""
    log_model: bool = True
    model: ModelConfig = field(default_factory=_small_model)
    optim: OptimConfig = field(default_factory=_small_optim)
    trainer: TrainerConfig = field(default_factory=_small_trainer)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    eval: SyntheticEvalConfig = field(default_factory=SyntheticEvalConfig)

    def __post_init__(self) -> None:
        check_choice("task", self.task, tuple(TASKS))
        check_choice("pos_encoding", self.pos_encoding, POS_ENCODINGS)
        spec = get_task(self.task)
        if self.scratchpad not in spec.scratchpads:
            raise ValueError(f"scratchpad={self.scratchpad!r} is not supported by task {self.task!r}; "
                             f"supported: {', '.join(spec.scratchpads)}")
        for key in ("train_max_len", "test_max_len", "seed", "curriculum_steps", "n_id_test"):
            check_range(key, getattr(self, key), 0)
        for key in ("n_train", "n_valid", "n_test", "batch_size"):
            check_range(key, getattr(self, key), 1)
        if self.curriculum_steps > self.trainer.max_steps:
            raise ValueError(f"curriculum_steps={self.curriculum_steps} exceeds trainer.max_steps="
                             f"{self.trainer.max_steps}: the model would never train on the longest lengths; set "
                             f"curriculum_steps <= {self.trainer.max_steps}")
        spec.split_lengths("train", *self.max_lens)  # raises for test <= train and out-of-range lengths
        spec.split_lengths("test", *self.max_lens)
        if self.n_id_test:  # raises when no training length has a held-out problem
            make_split(self.task, "id_test", n=0, seed=self.seed, train_max_len=self.max_lens[0],
                       test_max_len=self.max_lens[1])
        self._check_stopping()
        if self.train_max % self.eval.bucket_width:
            raise ValueError(f"eval.bucket_width={self.eval.bucket_width} must divide the training maximum "
                             f"{self.train_max}, so that no length bucket mixes ID and OOD lengths")
        self._check_positions()
        self._apply_pos_encoding()

    def _check_stopping(self) -> None:
        check_range("stop_at", self.stop_at, 0.0, 1.0)
        check_range("stop_patience", self.stop_patience, 1)
        if not self.stop_at and self.stop_patience != 1:
            raise ValueError(f"stop_patience={self.stop_patience} needs a stopping rule: set stop_at (e.g. 0.99)")
        if self.stop_at and not 0 < self.trainer.val_every_n_steps < self.trainer.max_steps:
            raise ValueError(f"stop_at={self.stop_at} is checked at each validation: set trainer.val_every_n_steps "
                             f"between 1 and trainer.max_steps={self.trainer.max_steps} (it is "
                             f"{self.trainer.val_every_n_steps})")

    def _check_positions(self) -> None:
        # The test split holds the longest lengths, hence every task's longest sequences; the stage checks every
        # split again once it has generated them (``check_fits``).
        needed, length = self.test_positions
        if needed > self.model.max_positions:
            raise ValueError(f"task {self.task!r} with scratchpad={self.scratchpad}: the longest test sequence "
                             f"(length {length}: <bos> prompt <sep> target <eos>, plus eval.extra_new_tokens="
                             f"{self.eval.extra_new_tokens}) needs model.max_positions >= {needed}, not "
                             f"{self.model.max_positions}; raise model.max_positions or lower test_max_len")

    def _apply_pos_encoding(self) -> None:
        default = ModelConfig.pos_encoding
        if self.model.pos_encoding not in (default, self.pos_encoding):
            warnings.warn(f"model.pos_encoding={self.model.pos_encoding} is ignored: the synthetic stage "
                          f"uses pos_encoding={self.pos_encoding}", stacklevel=3)
        # replace() re-runs ModelConfig's checks for the new PE (e.g. RoPE needs an even head size).
        self.model = dataclasses.replace(self.model, pos_encoding=self.pos_encoding)

    @property
    def max_lens(self) -> tuple[int | None, int | None]:
        """(train_max_len, test_max_len) as ``make_split`` takes them: None for the task's default."""
        return self.train_max_len or None, self.test_max_len or None

    @property
    def train_max(self) -> int:
        """The longest training length (the task's default when ``train_max_len`` is 0)."""
        return self.train_max_len or get_task(self.task).train_lengths[-1]

    @property
    def test_max(self) -> int:
        """The longest test length (the task's default when ``test_max_len`` is 0)."""
        return self.test_max_len or get_task(self.task).test_lengths[-1]

    @property
    def test_positions(self) -> tuple[int, int]:
        """(positions, length): the positions decoding the test split's longest sequence takes (its
        ``sequence_tokens`` plus ``eval.extra_new_tokens``), which ``model.max_positions`` must hold, and that
        sequence's length (the task's measure)."""
        tokens, length = longest_test_sequence(self.task, self.scratchpad, self.seed, *self.max_lens, self.n_test)
        return tokens + self.eval.extra_new_tokens, length

    @property
    def run_name(self) -> str:
        scratchpad = "" if self.scratchpad == "none" else f"-{self.scratchpad}"
        return self.name or f"synthetic-{self.task}{scratchpad}-{self.pos_encoding}-s{self.seed}"

    def cell(self, task: str, pos_encoding: str, seed: int, parent_run_id: str = "") -> SyntheticConfig:
        """This config for another (task, PE, seed), nested under ``parent_run_id``; validated again."""
        return dataclasses.replace(
            self, task=task, pos_encoding=pos_encoding, seed=seed, name="",
            model=dataclasses.replace(self.model, pos_encoding=pos_encoding),
            tracking=dataclasses.replace(self.tracking, parent_run_id=parent_run_id))


@dataclass
class SyntheticGridConfig:
    """``nope-lightning run synthetic-grid``: tasks x ``pos_encodings`` x ``seeds`` under one parent run.

    Each cell is ``base`` with its task, PE and seed (``base.task``, ``base.pos_encoding``,
    ``base.seed`` and ``base.name`` are replaced); ``base.tracking`` is the store of the parent and all
    children (in a pipeline, the pipeline's store and run: the stage registry's ``Stage.tracking`` names this
    key, so the grid keeps one tracking setting; a replicate's seed sets ``seeds``, ``Stage.seed``).
    ``task_overrides``: per task, ``key=value`` overrides of ``base`` (``{pcfg: [trainer.max_steps=100000]}``)
    merged onto it for that task's cells only, as ``load_config`` merges a command line (unknown keys and bad
    values raise naming the task); a key the grid sets per cell (``GRID_SET_KEYS``) and a key of the task's
    format (``FORMAT_KEYS``) are refused, at load, for every task named; a task not in
    ``tasks`` keeps its overrides unused (checked once a grid runs it).
    ``attention_examples_per_length``: examples per length (in-distribution from valid, OOD from test) for the
    attention analysis of every PE against NoPE of the same seed (0: no analysis);
    ``distance_bins``: bins of the attended-distance histogram.
    """

    base: SyntheticConfig = field(default_factory=SyntheticConfig)
    tasks: list[str] = field(default_factory=lambda: ["copy_repeat", "reverse", "addition"])
    pos_encodings: list[str] = field(default_factory=lambda: list(PAPER_PES))
    seeds: list[int] = field(default_factory=lambda: [0])
    task_overrides: dict[str, list[str]] = field(default_factory=dict)
    attention_examples_per_length: int = 4
    distance_bins: int = 20
    name: str = ""

    def __post_init__(self) -> None:
        for key in ("tasks", "pos_encodings", "seeds"):
            values = getattr(self, key)
            if not values:
                raise ValueError(f"{key} is empty")
            if len(set(values)) != len(values):
                raise ValueError(f"{key}={list(values)} has duplicates")
        check_range("attention_examples_per_length", self.attention_examples_per_length, 0)
        check_range("distance_bins", self.distance_bins, 1)
        if self.attention_examples_per_length and "nope" not in self.pos_encodings:
            raise ValueError("attention_examples_per_length > 0 compares every PE with NoPE: add nope to "
                             "pos_encodings or set attention_examples_per_length=0")
        self._check_task_overrides()
        self.cells()  # runs every cell's own checks (task names, PEs, lengths) before any compute

    def _check_task_overrides(self) -> None:
        # Overrides of known tasks outside ``tasks`` are kept unused: one grid file holds every task's recipe and
        # a study picks its tasks with ``tasks=[...]``. Their keys and types are checked here (a typo must not wait
        # for the study that runs its task); their values when a grid runs the task, as they depend on it (a
        # scratchpad study's base does not fit pcfg).
        if unknown := [task for task in self.task_overrides if task not in TASKS]:
            raise ValueError(f"task_overrides names unknown tasks: {', '.join(unknown)}; known: {', '.join(TASKS)}")
        base = OmegaConf.structured(self.base)  # once, not per task: building it is most of a check's time
        for task, overrides in self.task_overrides.items():
            for override in overrides:
                key = override.split("=", 1)[0].strip()
                grid_key = GRID_SET_KEYS.get("tracking" if key.startswith("tracking.") else key)
                if grid_key is not None:
                    raise ValueError(f"task_overrides.{task}: {override!r} sets a key the grid sets for "
                                     f"every cell; set {grid_key} instead")
                if key.split(".")[0] in FORMAT_KEYS:
                    raise ValueError(f"task_overrides.{task}: {override!r} changes the task's format (its input, "
                                     f"answer, lengths or scoring), which a recipe may not; set base.{key} for the "
                                     f"whole grid, as a study of that format")
            try:
                check_keys(base, overrides)
            except ValueError as err:
                raise ValueError(f"task_overrides.{task}: {err}") from None

    @property
    def config_hash(self) -> str:
        """16 hex digits of the whole resolved config (tracking, and the pipeline run it is nested under,
        included): the tag by which running the same grid again finds its parent run and resumes it."""
        fields = to_dict(self)
        # a grid from before these fields existed keeps its hash at their defaults, so it resumes
        if not self.task_overrides:
            del fields["task_overrides"]
        for key, default in ADDED_BASE_FIELDS.items():
            *path, name = key.split(".")
            section = functools.reduce(dict.__getitem__, path, fields["base"])
            if section[name] == default:
                del section[name]
        return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def task_base(self, task: str) -> SyntheticConfig:
        """``base`` for ``task``'s cells: ``base`` itself, or with ``task_overrides[task]`` merged onto it (at
        that task, so that its overrides are checked against it: lengths, scratchpads, positions)."""
        if task not in self.task_overrides:
            return self.base
        try:  # load_config merges onto the values of what it is given: here base's, not the schema's defaults
            return load_config(self.base, overrides=[f"task={task}", *self.task_overrides[task]])
        except ValueError as err:
            raise ValueError(f"task_overrides.{task}: {err}") from None

    def cells(self, parent_run_id: str = "") -> list[SyntheticConfig]:
        """Every (task, seed, PE) config, grouped so that one (task, seed)'s PEs are consecutive."""
        bases = {task: self.task_base(task) for task in self.tasks}
        return [bases[task].cell(task, pe, seed, parent_run_id)
                for task in self.tasks for seed in self.seeds for pe in self.pos_encodings]

    @property
    def run_name(self) -> str:
        return self.name or f"synthetic-grid-{len(self.tasks)}x{len(self.pos_encodings)}x{len(self.seeds)}"
