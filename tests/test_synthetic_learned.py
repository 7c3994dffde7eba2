"""The "tasks learned" table: which tasks a study's recipes learn in distribution, by how many PEs (the goal:
>= 4 of the 5 PEs at ID exact match >= 0.9, mean over seeds), and which of the paper's 17 tasks have not run."""

from __future__ import annotations

from nope_lightning.analysis.synthetic.claims import PAPER_TASKS
from nope_lightning.analysis.synthetic.learned import LEARNED_BY, learned_table
from tests.test_synthetic_claims import make_cell

PES = ("nope", "t5", "alibi", "rope", "sinusoidal")


def cells(task: str, id_by_pe: dict[str, tuple[float, ...]], scratchpad: str = "none") -> list:
    return [make_cell(task, pe, seed, 0.5, id_acc=acc, scratchpad=scratchpad)
            for pe, accs in id_by_pe.items() for seed, acc in enumerate(accs)]


def test_a_task_is_learned_when_four_of_the_five_pes_reach_the_floor_on_the_mean_over_seeds():
    reverse = cells("reverse", {pe: (1.0, 1.0, 1.0) for pe in PES[:4]} | {"sinusoidal": (0.2, 0.1, 0.0)})
    parity = cells("parity", {"nope": (1.0, 0.8, 0.92), "t5": (0.95,) * 3, "alibi": (0.95,) * 3,  # nope: mean 0.907
                              "rope": (0.5,) * 3, "sinusoidal": (0.89,) * 3})  # 3 PEs: not learned
    scratch = cells("addition", {pe: (1.0,) * 3 for pe in PES}, scratchpad="full")  # not a plain-format task
    table = learned_table([*parity, *reverse, *scratch])
    lines = table.splitlines()
    assert lines[2] == "| task | NoPE | T5 | ALiBi | Rotary | APE | ID split | steps | ended by the stopping rule | seeds | PEs >= floor | verdict |"
    # the paper's task order (reverse before parity), each PE's mean over seeds with the worst seed beside it
    assert lines[4] == "| reverse | 1.00 | 1.00 | 1.00 | 1.00 | 0.10 [0.00] | validation | 100 | — | 3 | 4 of 5 | **learned** |"
    assert lines[5] == "| parity | 0.91 [0.80] | 0.95 | 0.95 | 0.50 | 0.89 | validation | 100 | — | 3 | 3 of 5 | not learned |"
    not_run = [t for t in PAPER_TASKS if t not in ("reverse", "parity")]
    assert lines[-1] == (f"**1 of the paper's 17 tasks learned** by >= {LEARNED_BY} of the 5 PEs (reverse); "
                         f"not run: {', '.join(not_run)}.")
    assert "addition" in not_run  # run only with a scratchpad: not a plain-format result


def test_no_plain_cells_no_table():
    assert learned_table(cells("addition", {"nope": (1.0,)}, scratchpad="full")) == ""
