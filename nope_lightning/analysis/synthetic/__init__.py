"""Paper 002's analysis (Kazemnejad et al. 2023, length generalization on synthetic tasks): the grid's cells
indexed with their intervals (``cells``), its claims (``claims``, ``attention_claims``), the tables (``tables``,
``learned``) and figures (``figures``) of a report, the trained models' attention and PE ranking (``grid``) and
the linear read-out of position behind its Theorem 1 (``position_probe``)."""
