"""One module per stage; ``nope_lightning.run.STAGES`` maps stage names to their entry points."""
