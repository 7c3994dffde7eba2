"""The study's analysis: the claims engine (``claims``: the claims of ``config.paper`` tested, with intervals from
``numerics.stats``), the report's tables (``tables``, written through ``markdown``), the sweep section
(``sweep``) and the figures (``plots``). It reads results only through ``nope_lightning.results``."""
