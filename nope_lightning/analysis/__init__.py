"""The studies' analysis, one subfolder per paper and what both papers' reports use beside them.

- ``lengthgen``: paper 001 (Wang et al. 2024, NoPE's length generalization in language modelling, with the
  hybrids' claims): its claims tested on evaluation, scale-search and HeadScale runs, their tables, the sweep
  section, the λ = 1 + a ln s fit and the figures;
- ``synthetic``: paper 002 (Kazemnejad et al. 2023, the synthetic length-generalization tasks): its claims on
  the task grids, their tables and figures, the attention analysis and the position probe (its Theorem 1);
- here, shared: a claim's outcome and verdict (``verdicts``), markdown tables and interval cells
  (``markdown``), the report's frame (``report_frame``: title, captions, provenance, pre-training recipes)
  and its sources (``sources``: pipeline runs in stores, committed results bundles).

A shared module imports neither paper's, and neither paper's imports the other's (``tests/test_import_graph.py``).
Everything reads results only through ``nope_lightning.results``.
"""
