"""The pipeline: the stage registry (``registry``), an experiment file expanded into step instances (``steps``),
their run identity (``runkey``), the dry run (``dry_run``) and the runner (``runner``). The experiment file's
schema lives with every other config, in ``nope_lightning.config.pipeline``."""
