"""The one exception type the CLI turns into a clean one-line error and exit code 2."""


class GspoError(Exception):
    """A problem with the user's input (recipe, file, checkpoint) that the user can fix."""
