"""One module per stage; ``nope_lightning.pipeline.registry.STAGES`` maps stage names to their entry points."""
