"""Run study files' slices side by side on a machine with many cores (or one GPU shared by many small runs).

A slice is one pipeline run of a file at one matrix point and one replicate seed (a file without ``seeds`` runs its
steps' own seeds in each slice), in its own store ``ROOT/<file>-<point>[-s<seed>]/`` (one SQLite store takes one
writer at a time). ``--workers`` slices run at once, in the order of the files given (costliest first pays); each
writes no report. ``ROOT/slices.json`` lists every slice (store, pipeline run id, exit code,
seconds) as it ends. A killed slice resumes where it stopped when the same command runs again with the same ROOT
(its store's path is part of its grids' identity). One report reads all slices of a study:
``nope-lightning run report run=<a run> tracking.uri=<its store> "also=[{run: ..., uri: ...}, ...]"`` (``--also`` prints
that command). On the 2-core laptop run the files themselves: their grids run one cell at a time.

    python tools/parallel_slices.py ROOT --workers 14 experiments/synthetic/synthetic_copy.yaml ...
    python tools/parallel_slices.py ROOT --also experiments/synthetic/synthetic_copy.yaml ...
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from nope_lightning.stages.registry import stage_config


def slices(path: str, root: Path, only: dict[str, list[str]] | None = None) -> list[dict]:
    """Every (matrix point, seed) of the pipeline file ``path`` whose values ``only`` allows (``{key: [values]}``;
    a key the file's matrix lacks allows everything): its folder under ``root`` and its overrides."""
    cfg = stage_config("pipeline", path)
    keys = list(cfg.matrix)
    out = []
    for values in itertools.product(*(cfg.matrix[k] for k in keys)):
        if any(k in (only or {}) and v not in only[k] for k, v in zip(keys, values, strict=True)):
            continue
        for seed in cfg.seeds or [None]:
            point = [f"{v}" for v in values] + ([f"s{seed}"] if seed is not None else [])
            folder = root / "-".join([Path(path).stem, *point])
            overrides = [f"matrix.{k}=[{v}]" for k, v in zip(keys, values, strict=True)]
            overrides += [f"seeds=[{seed}]"] if seed is not None else []
            overrides += [f"tracking.uri=sqlite:///{folder}/mlflow.db", f"tracking.artifact_root={folder}/artifacts",
                          "report=false"]
            out.append({"file": path, "folder": str(folder), "overrides": overrides})
    return out


def run_slice(entry: dict) -> dict:
    folder = Path(entry["folder"])
    folder.mkdir(parents=True, exist_ok=True)
    start = time.time()
    with open(folder / "out.json", "w") as out, open(folder / "log.txt", "w") as log:
        rc = subprocess.call([sys.executable, "-m", "nope_lightning.cli", "run", "pipeline", entry["file"],
                              *entry["overrides"]], stdout=out, stderr=log)
    try:
        run_id = json.loads((folder / "out.json").read_text())["run_id"]
    except (ValueError, KeyError):
        run_id = ""
    return {**entry, "rc": rc, "run_id": run_id, "seconds": round(time.time() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("files", nargs="+")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", action="append", default=[], metavar="KEY=VALUE",
                        help="run only the matrix points with this value (repeatable; values of one key add up)")
    parser.add_argument("--also", action="store_true", help="print the report command over the finished slices")
    args = parser.parse_args()
    if args.also:
        done = [s for s in json.loads((args.root / "slices.json").read_text()) if s["file"] in args.files and
                s["run_id"] and s["rc"] == 0]
        also = ", ".join(f"{{run: {s['run_id']}, uri: 'sqlite:///{s['folder']}/mlflow.db'}}" for s in done[1:])
        print(f"nope-lightning run report run={done[0]['run_id']} tracking.uri=sqlite:///{done[0]['folder']}/mlflow.db "
              f"\"also=[{also}]\"")
        return
    only: dict[str, list[str]] = {}
    for item in args.only:
        key, value = item.split("=", 1)
        only.setdefault(key, []).append(value)
    todo = [s for f in args.files for s in slices(f, args.root, only)]
    finished: list[dict] = []
    with ThreadPoolExecutor(args.workers) as pool:
        for future in as_completed([pool.submit(run_slice, s) for s in todo]):
            finished.append(result := future.result())
            (args.root / "slices.json").write_text(json.dumps(finished, indent=1))
            print(f"{result['folder']}: rc {result['rc']} in {result['seconds']} s", flush=True)


if __name__ == "__main__":
    main()
