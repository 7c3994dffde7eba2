"""``nope-lightning run <stage> [conf.yaml] [key=value ...]`` — the only command line; no per-feature flags.

Also: ``nope-lightning stages`` (list them) and ``nope-lightning config <stage> [conf.yaml] [k=v ...]``
(print the resolved config without running anything). Multi-process runs re-execute this same command
line in every rank (Lightning's DDP launcher), so it must stay free of interactive state.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from nope_lightning.config import to_yaml


def _split(args: list[str]) -> tuple[str | None, list[str]]:
    """``[conf.yaml] [k=v ...]`` -> (yaml path or None, overrides)."""
    if args and "=" not in args[0] and args[0].endswith((".yaml", ".yml")):
        return args[0], args[1:]
    stray = [a for a in args if "=" not in a]
    if stray:
        raise ValueError(f"expected [conf.yaml] [key=value ...], got {' '.join(stray)!r} "
                         f"(a config file must end in .yaml)")
    return None, args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nope-lightning", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a stage")
    run.add_argument("stage")
    run.add_argument("args", nargs="*", help="[conf.yaml] [key=value ...]")
    show = sub.add_parser("config", help="print a stage's resolved config")
    show.add_argument("stage")
    show.add_argument("args", nargs="*")
    sub.add_parser("stages", help="list the stages")
    ns = parser.parse_args(argv)

    from nope_lightning.run import STAGES, run_stage, stage_config

    if ns.command == "stages":
        for name, stage in STAGES.items():
            print(f"{name:14s} {stage.summary}")
        return 0
    try:
        yaml_path, overrides = _split(ns.args)
        cfg = stage_config(ns.stage, yaml_path, overrides)
        if ns.command == "config":
            print(to_yaml(cfg), end="")
            return 0
        result = run_stage(ns.stage, cfg)
    except (ValueError, FileNotFoundError) as err:
        print(f"nope-lightning: error: {err}", file=sys.stderr)
        return 2
    from lightning.pytorch.utilities import rank_zero_only

    if rank_zero_only.rank == 0:  # DDP re-runs this command line in every rank; report once
        text = json.dumps(result, indent=1, default=str)
        print(text)
        if os.environ.get("NOPE_LIGHTNING_RESULT"):  # a pipeline running this stage as a subprocess
            Path(os.environ["NOPE_LIGHTNING_RESULT"]).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
