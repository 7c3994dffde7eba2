"""One module per stage, and the registry that dispatches to them (``registry``: ``STAGES`` maps stage names to
their entry points, as ``module:name`` strings imported when used). The registry lives here because stages call
it themselves (a search's trial is a stage run) while it imports only configs and the store."""
