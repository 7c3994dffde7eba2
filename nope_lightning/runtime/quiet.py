"""Quiet, parseable output for the command line: the one place where third-party chatter is turned off.

``install()`` runs first thing in ``cli.main`` (before Lightning, MLflow or tqdm are imported), and every
child process (DDP ranks, pipeline steps run as subprocesses) goes through ``cli.main`` again, so the
settings hold everywhere. ``lm_eval_git()`` is called by the harness adapter (``eval/harness.py``) before
lm-eval evaluates. Each entry below names the exact source it silences; warnings and errors from those
sources still show.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings

# Environment defaults (a value the user exported wins; children inherit them).
ENVIRONMENT = {
    # The suite runs offline: no usage events to MLflow's servers and no installation id written under
    # ~/.config/mlflow. MLflow also honours DO_NOT_TRACK=true. Opt in with MLFLOW_DISABLE_TELEMETRY=false.
    "MLFLOW_DISABLE_TELEMETRY": "true",
    # One "Downloading artifacts" bar per checkpoint or result a step reads back (16 in the tiny pipeline).
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}

# Loggers whose INFO messages are chatter, not results. These are the modules' own loggers, which
# Lightning's package ``__init__`` does not reset (it sets ``lightning.pytorch`` / ``lightning.fabric``).
INFO_LOGGERS = (
    "lightning.pytorch.utilities.rank_zero",  # "GPU available…", "TPU available…", the litlogger tip
    "lightning.fabric.utilities.rank_zero",  # "distributed_backend=gloo … All distributed processes registered"
    "lightning.fabric.utilities.distributed",  # "Initializing distributed: GLOBAL_RANK …", once per rank
    "lightning.fabric.utilities.seed",  # "Seed set to …"
    "lightning.pytorch.accelerators.cuda",  # "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES: […]"
    "mlflow.store.db.utils",  # "Creating initial MLflow database tables…", "Updating database tables"
)

# (message regex, category) of warnings raised inside our dependencies that a user can do nothing about.
WARNINGS = (
    # torch deprecates LeafSpec, which Lightning's own _pytree helper still constructs (once per fit).
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
    # Optuna's ExperimentalWarning for naming a study's objectives (shown by optuna-dashboard).
    (r".*set_metric_names is experimental", Warning),
)


def install() -> None:
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    if not sys.stderr.isatty():
        # In a log file a tqdm bar is a run of carriage returns, and one closed with leave=False leaves
        # the next line glued to it; the stage lines and the training step lines carry the progress.
        os.environ.setdefault("TQDM_DISABLE", "1")
    for name in INFO_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for message, category in WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


def lm_eval_git() -> None:
    """Keep git's complaint out of the output when lm-eval records the working directory's commit.

    lm-eval's ``simple_evaluate`` calls ``lm_eval.loggers.utils.get_git_commit_hash``, which runs ``git
    describe --always`` with stderr inherited: outside a git checkout "fatal: not a git repository" lands in
    the user's terminal or log. The replacement makes the same call with git's stderr captured and falls
    back as lm-eval does (``get_commit_from_path``); the commit, when there is one, is still recorded.
    """
    # Imported here: the command line imports this module before anything heavy, and lm_eval is only
    # needed by the runs that evaluate harness tasks.
    from lm_eval import evaluator
    from lm_eval.loggers.utils import get_commit_from_path

    def git_commit_hash() -> str | None:
        try:
            proc = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, check=True)
        except (subprocess.CalledProcessError, FileNotFoundError):
            return get_commit_from_path(os.getcwd())
        return proc.stdout.strip()

    evaluator.get_git_commit_hash = git_commit_hash
