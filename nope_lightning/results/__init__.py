"""What each stage produces, typed, with its on-disk JSON form (``version``ed: ``core.ResultFile``): the one
place that writes and reads a result file's keys. Every other module reads results through these types.

A run's identity in a study (``runkey.RunKey``: method, seed, matrix point, stage, step) lives here too, with the
results it places: the bundle (``bundle``) files every result under it, and a study's index (``index``) holds
every result at its place."""

from nope_lightning.results.core import ResultFile
from nope_lightning.results.evaluation import (
    Curve,
    EvaluationResult,
    HeadEntropy,
    Perplexity,
    PositionCurves,
    ScoredWindows,
)
from nope_lightning.results.headscale import ConvergedEntropy, HeadScaleResult
from nope_lightning.results.index import ResultIndex
from nope_lightning.results.passkey import PasskeyCell, PasskeyOutcome, PasskeyResults
from nope_lightning.results.search import (
    LogFit,
    PositionBest,
    ScaleSearchResult,
    SearchSamples,
    SearchTrial,
    SelectionIntervals,
)
from nope_lightning.results.synthetic import (
    BucketAccuracy,
    Failure,
    SyntheticCell,
    SyntheticGridResult,
    TaskAttention,
)

__all__ = ["BucketAccuracy", "ConvergedEntropy", "Curve", "EvaluationResult", "Failure", "HeadEntropy",
           "HeadScaleResult", "LogFit", "PasskeyCell", "PasskeyOutcome", "PasskeyResults", "Perplexity",
           "PositionBest", "PositionCurves", "ResultFile", "ResultIndex", "ScaleSearchResult", "ScoredWindows", "SearchSamples",
           "SearchTrial", "SelectionIntervals", "SyntheticCell", "SyntheticGridResult", "TaskAttention"]
