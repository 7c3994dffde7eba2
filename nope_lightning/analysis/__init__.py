"""The study's analysis: the papers' numbers and claims as data (``paper``), the claims engine (``claims``,
with intervals from ``numerics.stats``), the report's tables (``tables``, written through ``markdown``), the
sweep section (``sweep``) and the figures (``plots``). It reads results only through ``nope_lightning.results``."""
