"""Capture frontends: a framework's training step, lowered to the device IR.

``device.capture.torch`` (PyTorch, through ``torch.export``) and ``device.capture.tf``
(TensorFlow) each turn one training step of a user's model into a ``device.ir.Graph``:
the forward pass up to a scalar loss, the parameters and state by their framework names,
the optimizer as an ``OptimizerSpec``, and every op with the user's file and line.

This package imports neither framework; import the frontend you need by its module.
``refused_torch`` and ``refused_tf`` are each frontend's table of the framework ops it
cannot lower, with what to use instead: framework-free, so that device.api reads them.
"""
