"""The one error type for bad user input.

Anything a user can get wrong (a params file, a data folder, a checkpoint, an op the
device lacks) raises ``UserError`` with one line that names what is wrong and where.
The runners print that line and exit with status 2, without a traceback unless
``--verbose`` was given; any other exception is a bug and keeps its traceback.
"""


class UserError(Exception):
    """Bad input: the message is one line naming the file, key or op at fault."""

    exit_code = 2


class NonFiniteLossError(UserError):
    """The loss became NaN or inf; the last good checkpoint is kept."""

    exit_code = 3


class NonFiniteGradient(NonFiniteLossError):
    """A gradient is NaN or inf and no loss scaling skips the step: the update is not applied
    (the weights stay those of the step before). The runners add the step and the last good
    checkpoint to the message."""

    def __init__(self, name: str, value: float):
        super().__init__(f"the gradient of {name} is {value}")
        self.name, self.value = name, value
