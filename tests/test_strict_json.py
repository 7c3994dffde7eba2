"""Every stage's stdout is strict JSON (RFC 8259): a NaN or infinite number is ``null``, never a bare ``NaN`` or
``Infinity`` that strict parsers reject. The stages run through the command line on tiny models (the pipeline's
stdout is checked by ``test_cli``)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from nope_lightning import cli
from tests.conftest import REPO


def reject(constant: str):
    raise ValueError(f"not strict JSON: {constant}")


def strict(text: str) -> dict:
    """The whole of ``text`` as one strict JSON object."""
    return json.loads(text, parse_constant=reject)


def test_non_finite_numbers_become_null():
    value = {"nan": math.nan, "list": [math.inf, -math.inf, 1.5, (2, np.float32("nan"))], "np": np.float64(0.25),
             "int": np.int64(3), "flag": True, "text": "NaN"}
    assert cli.strict_json(value) == {"nan": None, "list": [None, None, 1.5, [2, None]], "np": 0.25, "int": 3,
                                      "flag": True, "text": "NaN"}
    assert strict(json.dumps(cli.strict_json(value), allow_nan=False))["nan"] is None


def test_every_stage_prints_strict_json(tmp_path, data_cache, capsys):
    """prepare, pretrain (a tiny RoPE model), evaluate, scale-search, headscale, finetune and synthetic. A search
    at 2x with 2 position buckets has one bucket past L, too few to fit: its fit_a and fit_r2 are NaN, printed
    as null."""
    store = [f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"tracking.artifact_root={tmp_path}/artifacts"]
    quiet = "trainer.progress_bar=false"

    def run(stage: str, *args: str) -> dict:
        code = cli.main(["run", stage, *args])
        out, err = capsys.readouterr()
        assert code == 0, err[-3000:]
        return strict(out)

    assert run("prepare", "data.corpus=tiny", "data.vocab_size=512", f"data.cache_dir={data_cache}")
    pretrained = run("pretrain", str(REPO / "conf/pretrain/tiny.yaml"), *store, f"data.cache_dir={data_cache}",
                     f"out_dir={tmp_path}/pretrain", "model.pos_encoding=rope", "trainer.max_steps=6", quiet)
    model = f"checkpoint={pretrained['model']}"
    assert run("evaluate", model, *store, "eval_lengths=[64,128]", "ppl_tokens=256", "passkey_keys=0",
               "longctx_samples=0", "position_buckets=8", quiet)
    searched = run("scale-search", model, *store, "target_lengths=[128]", "grid=[1.0,1.5]", "ppl_tokens=256",
                   "position_buckets=2", "stride=32", f"storage=sqlite:///{tmp_path}/optuna.db")
    assert searched["scale_search/fit_r2"] is None and searched["scale_search/fit_a"] is None
    assert run("headscale", str(REPO / "conf/headscale/tiny.yaml"), model, *store, "steps=2",
               f"out_dir={tmp_path}/headscale", quiet)
    assert run("finetune", str(REPO / "conf/finetune/tiny.yaml"), model, *store, "steps=2",
               f"out_dir={tmp_path}/finetune", quiet)
    assert run("synthetic", str(REPO / "conf/synthetic/tiny.yaml"), *store, "trainer.max_steps=2")


@pytest.mark.parametrize("text", ["NaN", "[Infinity]", '{"a": -Infinity}'])
def test_the_strict_parser_rejects_what_python_would_print(text):
    with pytest.raises(ValueError, match="not strict JSON"):
        strict(text)
