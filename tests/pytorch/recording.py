"""A step backend that keeps each training step's loss, for the tests that compare runs step by step."""


def recording(backend):
    """``backend`` (FrameworkSteps, EmulatorSteps), each training step's loss appended to its ``losses``."""

    class Recording(backend):
        def __init__(self, runner):
            super().__init__(runner)
            self.losses = []

        def train(self, batch):
            self.losses.append(float(super().train(batch)))
            return self.losses[-1]

    return Recording
