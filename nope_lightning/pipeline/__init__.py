"""The pipeline: an experiment file expanded into step instances (``steps``), the dry run (``dry_run``) and the
runner (``runner``), on the floor above the stages they run. The experiment file's schema lives with every other
config, in ``nope_lightning.config.pipeline``; the stage registry with the stages (``stages.registry``); a run's
identity with the results it places (``results.runkey``)."""
