"""--device picks the step backend the PyTorch runner's loops call."""

from common.pytorch.device_run import EmulatorSteps
from common.pytorch.run import step_backend
from common.pytorch.runner import FrameworkSteps


def test_device_picks_the_step_backend():
    assert step_backend("cpu") is FrameworkSteps
    assert step_backend("gpu") is FrameworkSteps
    assert step_backend("emulator") is EmulatorSteps
