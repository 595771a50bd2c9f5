"""The exceptions the CLI turns into one line: `GspoError` (exit 2) and `Stopped` (128 + signal)."""

import signal


class GspoError(Exception):
    """A problem with the user's input (recipe, file, checkpoint) that the user can fix."""


class Stopped(BaseException):
    """The run stops now because of `signum`. A BaseException, like KeyboardInterrupt, so that
    no `except Exception` (in a reward function, a library) swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum
