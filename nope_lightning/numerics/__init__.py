"""Numbers computed from sums, with no model, file or run in sight: the per-token loss and attention entropy
as torchmetrics states (``metrics.py``, nats) and the intervals every compared number carries (``stats.py``:
Wilson, Student t, the stratified block bootstrap).

A floor of its own, above ``config`` (the least number of resamples) and below both ``eval``, which measures
with them, and ``analysis``, which compares with them: so measurement and analysis need not import each other.
"""
