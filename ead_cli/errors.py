"""The one exception type the CLI turns into a one-line message and a non-zero exit."""


class EadError(Exception):
    """A problem the user can fix: bad input, a missing model, an incompatible pair.

    The message is a single line meant for a person; the CLI prints it as ``error: <message>``
    and exits with ``exit_code`` (2 for usage errors, 1 otherwise).
    """

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code
