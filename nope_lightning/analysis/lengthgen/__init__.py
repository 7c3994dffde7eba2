"""Paper 001's analysis (Wang et al. 2024, length generalization of NoPE language models; the hybrids' claims
too): what each claim measures (``claim_tests``) and its verdict (``claims``), the entropy and log-PPL
inflections (``inflection``), the λ = 1 + a ln s fit (``log_law``), the report's tables (``tables``,
``report_sections``), the sweep section (``sweep``) and the figures (``plots``)."""
