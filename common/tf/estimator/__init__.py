"""The Estimator contract users port from: ``from common.tf.estimator import CSEstimatorSpec, ModeKeys``."""

from common.tf.estimator.cs_estimator import CerebrasEstimator
from common.tf.estimator.cs_estimator_spec import CSEstimatorSpec, EstimatorSpec
from common.tf.estimator.mode_keys import ModeKeys
from common.tf.estimator.run_config import CSRunConfig, RunConfig
from common.tf.estimator.training import EvalSpec, TrainSpec, train_and_evaluate
from common.tf.estimator.warm_start import WarmStartSettings

__all__ = ["CerebrasEstimator", "CSEstimatorSpec", "CSRunConfig", "EstimatorSpec", "EvalSpec", "ModeKeys", "RunConfig", "WarmStartSettings",
           "TrainSpec", "train_and_evaluate"]
