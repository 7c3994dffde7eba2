"""Typed configuration: one dataclass per stage, merged defaults <- YAML <- ``key=value`` overrides.

``core`` holds the merge (``load_config``) and the checks, ``parts`` the shared sections (model, data, optimizer,
trainer, tracking, retrieval mix), ``stages`` the stage configs, ``search`` HeadScale's Optuna search, ``synthetic`` the paper-002 task suite's,
``pipeline`` the experiment-file schema. ``paper`` holds the papers' published numbers and claims (their tests
declared by ``claim_rules``): declarations like the configs, which an experiment file names and ``pipeline``
checks at load, so they sit here, on the floor below everything that computes.
Every config class and check is importable from here.
"""

from nope_lightning.config.core import (
    ACCELERATORS,
    ATTENTION_BACKENDS,
    DATA_MIXES,
    LONGCTX_TASKS,
    MIN_RESAMPLES,
    PASSKEY_PROMPTS,
    POS_ENCODINGS,
    PRECISIONS,
    RETRIEVAL_FILLERS,
    RETRIEVAL_LENGTHS,
    ROPE_SCALINGS,
    SPLITS,
    STRATEGIES,
    check_bootstrap,
    check_choice,
    check_range,
    check_target_length,
    flatten,
    load_config,
    to_dict,
    to_yaml,
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
from nope_lightning.config.pipeline import PipelineConfig, PipelineStep, ReportConfig
from nope_lightning.config.search import HeadScaleSearchConfig
from nope_lightning.config.stages import (
    EvaluateConfig,
    ExtensionConfig,
    FinetuneConfig,
    HeadScaleConfig,
    PrepareConfig,
    PretrainConfig,
    ScaleSearchConfig,
)
from nope_lightning.config.synthetic import SyntheticConfig, SyntheticGridConfig
from nope_lightning.config.transfer import ExportConfig, ImportConfig

__all__ = [
    "ACCELERATORS", "ATTENTION_BACKENDS", "DATA_MIXES", "LONGCTX_TASKS", "MIN_RESAMPLES", "PASSKEY_PROMPTS",
    "POS_ENCODINGS", "PRECISIONS", "RETRIEVAL_FILLERS", "RETRIEVAL_LENGTHS", "ROPE_SCALINGS", "SPLITS", "STRATEGIES",
    "AttentionTemperature", "DataConfig", "EvaluateConfig", "ExportConfig", "ExtensionConfig", "FinetuneConfig",
    "HeadScaleConfig", "HeadScaleSearchConfig", "ImportConfig",
    "ModelConfig", "OptimConfig", "PipelineConfig", "PipelineStep", "PrepareConfig", "PretrainConfig",
    "ReportConfig", "RetrievalConfig", "RopeScalingConfig", "ScaleSearchConfig", "SyntheticConfig", "SyntheticGridConfig", "TrackingConfig", "TrainerConfig",
    "check_bootstrap", "check_choice", "check_range", "check_target_length", "flatten", "load_config",
    "small_recipe_trainer", "to_dict", "to_yaml",
]
