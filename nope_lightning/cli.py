"""``nope-lightning run <stage> [conf.yaml] [key=value ...]`` — the only command line; no per-feature flags.

Also: ``nope-lightning stages`` (list them), ``nope-lightning studies`` (the study folders under
``experiments/``: files, seeds, status, measured time), ``nope-lightning config <stage> [conf.yaml] [k=v ...]``
(print the resolved config without running anything) and ``nope-lightning harness [lm_eval arguments]``
(lm-evaluation-harness on one of our checkpoints, ``eval/harness.py:main``). Multi-process runs re-execute
this same command line in every rank (Lightning's DDP launcher), so it must stay free of interactive state.

Output contract: stdout holds only the stage's JSON result; progress, logs and errors go to stderr (the
stage runs with ``sys.stdout`` pointed at stderr). The JSON is strict (RFC 8259): a number that is NaN or
infinite (e.g. the R² of a fit through too few points) is written as ``null``. With
``$NOPE_LIGHTNING_RESULT`` set (a pipeline running a step as a subprocess) the result goes to that file
instead, so the pipeline's own stdout stays one JSON. ``harness`` prints lm-eval's results table instead.
Ctrl-C or SIGTERM ends a run with one line on stderr (where it stopped, what a rerun resumes) and exit code 130 /
143, its MLflow runs marked KILLED (``_stopped``); a pipeline's step process writes that line's end to the result
file instead, for the pipeline's own line.
Heavy modules (torch, Lightning, MLflow, lm-eval) are imported only once a stage or the harness runs, so a
mistyped stage or key, a corrupt YAML file or a missing local ``checkpoint=`` folder fails in under a second.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import math
import numbers
import os
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from nope_lightning.config.core import read_yaml, to_yaml
from nope_lightning.runtime import quiet, stopping
from nope_lightning.stages.registry import STAGES, run_stage, stage_config

DESCRIPTION = "Length generalization without position encoding (NoPE): pretraining, temperature search, " \
              "HeadScale, RoPE/ALiBi baselines, evaluation and reports."
EPILOG = """examples:
  nope-lightning stages
  nope-lightning studies
  nope-lightning config pretrain conf/pretrain/tiny.yaml
  nope-lightning run pretrain model.pos_encoding=rope
  nope-lightning run pipeline experiments/regime_study/regime_study.yaml
  nope-lightning harness --model_args checkpoint=<export folder> --tasks hellaswag

stdout holds only the stage's JSON result (strict JSON: null for a NaN or infinite number); progress and
logs go to stderr."""
#: ``harness``'s entry point, imported when it runs: it loads torch and lm-eval (seconds), which the other
#: commands must not wait for.
HARNESS = "nope_lightning.eval.harness:main"


def _split(stage: str, args: list[str]) -> tuple[str | None, list[str]]:
    """``[conf.yaml] [k=v ...]`` -> (yaml path or None, overrides)."""
    if args and "=" not in args[0] and Path(args[0]).is_dir():
        files = sorted(p.as_posix() for p in Path(args[0]).glob("*.yaml"))
        raise ValueError(f"{args[0]} is a folder: give one of its files: nope-lightning run {stage} "
                         + (" | ".join(files) if files else "<file>.yaml"))
    if args and "=" not in args[0] and args[0].endswith((".yaml", ".yml")):
        if stage == "pipeline" and (owner := _other_stage(args[0])):
            raise ValueError(f"{args[0]} is a {owner} config, not an experiment file (no steps): "
                             f"nope-lightning run {owner} {args[0]} (or a pipeline step's config:)")
        return args[0], args[1:]
    stray = [a for a in args if "=" not in a]
    if stray:
        raise ValueError(f"expected [conf.yaml] [key=value ...], got {' '.join(stray)!r} "
                         f"(a config file must end in .yaml)")
    return None, args


def _other_stage(path: str) -> str | None:
    """The stage whose config ``path`` is when it is an existing YAML mapping without ``steps`` (not an experiment
    file): the first stage that loads it as it stands; None when it has steps or no stage takes it."""
    file = Path(path)
    if not file.is_file():
        return None
    loaded = read_yaml(file)  # a file that is not valid YAML: one line naming file:line:column
    if not OmegaConf.is_dict(loaded) or "steps" in loaded:
        return None
    for name in STAGES:
        if name != "pipeline":
            with contextlib.suppress(ValueError):
                stage_config(name, path, [])
                return name
    return None


def check_checkpoint(cfg: Any) -> None:
    """A ``checkpoint=`` (or a search's ``base.checkpoint=``) naming a local folder, plain or as ``nope:`` or
    ``rope:<Hugging Face folder>``, must exist: refused here, before torch and Lightning load (~25 s), not
    once the stage runs. ``runs:/`` and ``mlflow:`` references need the store: the stage resolves them."""
    for key, holder in (("checkpoint", cfg), ("base.checkpoint", getattr(cfg, "base", None))):
        ref = getattr(holder, "checkpoint", "")
        if not isinstance(ref, str) or not ref or ref.startswith(("runs:/", "mlflow:")) or "://" in ref:
            continue
        path = ref.split(":", 1)[1] if ref.startswith(("nope:", "rope:")) else ref
        if not Path(path).exists():
            raise FileNotFoundError(f"{key}={ref}: {path} does not exist; give an export folder, "
                                    f"runs:/<run_id>/model, mlflow:<run_id> or a Hugging Face Llama folder "
                                    f"as nope:<folder> / rope:<folder>")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nope-lightning", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("run", "run a stage"), ("config", "print a stage's resolved config, run nothing")):
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.add_argument("stage", help="a stage name (see: nope-lightning stages)")
        command.add_argument("args", nargs="*", metavar="[conf.yaml] [key=value ...]",
                             help="a YAML of differences from the stage's defaults, then overrides")
    sub.add_parser("stages", help="list the stages")
    studies = sub.add_parser("studies", help="list the study folders: files, seeds, status, measured time")
    studies.add_argument("folder", nargs="?", default="experiments", help="the folder of studies (experiments)")
    sub.add_parser("harness", help="lm-evaluation-harness on a checkpoint, with lm_eval's arguments "
                                   "(nope-lightning harness --help)")
    return parser


def strict_json(value: Any) -> Any:
    """``value`` with every NaN or infinite number replaced by None (JSON ``null``), through dicts, lists and
    tuples; other numbers become plain ``float``/``int`` (numpy scalars included)."""
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    if isinstance(value, bool | int):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value) if math.isfinite(value) else None
    return value


def main(argv: list[str] | None = None) -> int:
    quiet.install()
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["harness"]:  # lm-eval parses the rest (its options are not ours)
        module, name = HARNESS.split(":")
        return getattr(importlib.import_module(module), name)(args[1:])
    ns = _parser().parse_args(args)

    if ns.command == "stages":
        width = max(map(len, STAGES))
        for name, stage in STAGES.items():
            print(f"{name:{width}s}  {stage.summary}")
        return 0
    if ns.command == "studies":
        from nope_lightning.results.studies import find_studies, listing

        try:
            print(listing(find_studies(Path(ns.folder))))
        except (ValueError, FileNotFoundError) as err:
            print(f"nope-lightning: error: {err}", file=sys.stderr)
            return 2
        return 0
    cfg, stopped = None, True
    stopping.begin()
    try:
        with stopping.signals_raise():
            yaml_path, overrides = _split(ns.stage, ns.args)
            cfg = stage_config(ns.stage, yaml_path, overrides)
            if ns.command == "config":
                print(to_yaml(cfg), end="")
                return 0
            check_checkpoint(cfg)
            with contextlib.redirect_stdout(sys.stderr):
                result = run_stage(ns.stage, cfg)
    except BaseException as err:
        if stopping.received() is None:
            if not isinstance(err, ValueError | FileNotFoundError):
                raise
            print(f"nope-lightning: error: {err}", file=sys.stderr)
            return 2
    else:
        stopped = False
    if stopped:  # by a signal, whatever it interrupted and however it surfaced: handled here, not in the except
        return _stopped(ns.stage, cfg)  # clause, whose traceback keeps alive what the interrupted frames held
    if _rank_zero():  # DDP re-runs this command line in every rank; report once
        text = json.dumps(strict_json(result), indent=1, default=str, allow_nan=False)
        if os.environ.get("NOPE_LIGHTNING_RESULT"):
            Path(os.environ["NOPE_LIGHTNING_RESULT"]).write_text(text)
        else:
            print(text)
    return 0


def _rank_zero() -> bool:
    """Whether this process is the global rank 0 (one that has not loaded Lightning launched no ranks)."""
    if "lightning" not in sys.modules:
        return True
    from lightning.pytorch.utilities import rank_zero_only

    return rank_zero_only.rank == 0


def _stopped(stage: str, cfg: Any) -> int:
    """After a stop signal: mark KILLED the runs this command opened (and those its killed step processes left
    RUNNING), then one line on what a rerun resumes, or, in a pipeline's step process, that sentence in the
    result file for the pipeline's line; returns 128 + the signal. Further signals wait for this to finish."""
    with stopping.shielded():
        if not _rank_zero():
            return stopping.exit_code()
        if cfg is not None:
            _mark_killed(cfg)
        note, out = stopping.STATE.note, stopping.STATE.out_dir
        note = note() if callable(note) else note
        if not note and out is not None:
            from nope_lightning.training.trainer import resume_note

            note = resume_note(out)
        note = note or "starts again"
        if os.environ.get("NOPE_LIGHTNING_RESULT"):
            Path(os.environ["NOPE_LIGHTNING_RESULT"]).write_text(json.dumps({"stopped": note}))
        else:
            print(stopping.stop_line(stage, note), file=sys.stderr, flush=True)
    return stopping.exit_code()


def _mark_killed(cfg: Any, attempts: int = 2) -> None:
    """Mark KILLED the runs of ``cfg``'s stores that this process opened (``tracking.stop_runs``). The signal may
    have landed inside an MLflow write, leaving a dropped SQLite connection that holds the store's lock until it
    is collected (MLflow waits 20 s on a locked store, then fails): the garbage collector runs first, and a failed
    attempt is tried again. If every attempt fails (e.g. a stop inside an import left MLflow half imported), one
    line says so: the runs stay RUNNING until the next command on the store closes this dead process's runs as
    KILLED (``tracking.close_dead_runs``)."""
    for _ in range(attempts):
        gc.collect()
        try:
            from nope_lightning.runtime.tracking import stop_runs

            stop_runs(cfg)
            return
        except Exception as err:  # noqa: BLE001 — any failure here is reported below, never raised over the stop
            failure = f"{type(err).__name__}: {err}"
    print(f"nope-lightning: note: could not mark this command's MLflow runs KILLED ({failure}); the next command "
          f"on the same store does", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
