"""The TensorFlow runner: the Estimator contract of the reference zoo, rebuilt on TF1 graph mode.

``tf.estimator`` is gone from TensorFlow 2.16 on, but ``tf.compat.v1.Graph``/``Session``,
``tf.compat.v1.train`` optimizers, ``tf.compat.v1.metrics`` and Keras 3 layers still work
in a v1 graph, so a ported ``model_fn``/``input_fn`` pair runs unchanged:

    common/tf/estimator/   CerebrasEstimator (the train/eval/predict loops, once, around the step
                           backend of --device: SessionSteps), EstimatorSpec/CSEstimatorSpec,
                           RunConfig, ModeKeys
    common/tf/optim.py     optimizer, LR schedule, clipping and loss scaling from params
    common/tf/run.py       run(model_fn, train_input_fn, eval_input_fn, default_params_fn)
    common/tf/device_run.py  --validate_only, --compile_only, and EmulatorSteps for --device emulator
                             (the device through device/api.py alone)

Nothing here imports torch: the TF side runs with torch absent.
"""
