"""Training infrastructure shared by the training stages (pretrain, finetune, headscale, synthetic).

* ``module``: ``CausalLM`` (the LightningModule: next-token loss, AdamW, warm-up + cosine), ``FSDP2Strategy``
  (beside the module it shards), the trained model/state on rank 0, and the checks on a loaded model's inputs.
* ``trainer``: ``build_trainer`` (the one place a Lightning ``Trainer`` is built) and its strategies, and
  ``resumable_fit``, the out_dir -> lock, resume checks, MLflow run, checkpoints and ``fit`` that the stages
  which train into an ``out_dir`` share.
"""
