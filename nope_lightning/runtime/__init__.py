"""What a run does around its computation, with no model or data in sight: records itself and what it searched
(the MLflow store: ``tracking.py``; Optuna studies: ``search.py``), guards files shared by processes
(``locks.py``), reports progress on stderr (``progress.py``) and silences third-party chatter (``quiet.py``).

One floor above ``config`` (the store reads ``TrackingConfig``) and below everything that runs; importing this
package loads nothing: ``cli.main`` imports ``quiet`` before Lightning, MLflow or tqdm.
"""
