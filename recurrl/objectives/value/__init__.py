"""Value estimators: GAE and TD(lambda) for (possibly recurrent) critics."""

from recurrl.objectives.value.advantages import GAE, TDLambdaEstimator, ValueEstimatorBase

__all__ = ["GAE", "TDLambdaEstimator", "ValueEstimatorBase"]
