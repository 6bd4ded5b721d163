"""The one exception type the CLI turns into a one-line message and a non-zero exit, and the one check
every layer shares: a number llama.cpp keeps in 32 bits."""


class EadError(Exception):
    """A problem the user can fix: bad input, a missing model, an incompatible pair.

    The message is a single line meant for a person; the CLI prints it as ``error: <message>``
    and exits with ``exit_code`` (2 for usage errors, 1 otherwise).
    """

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# The most llama.cpp's 32-bit fields hold (a context's positions, offloaded layers, top-k): a larger value
# wraps around to another, silently (2**32 + 16 is a context of 16)
MAX_INT32 = 2**31 - 1


def check_int32(value: int | None, flag: str) -> None:
    """A usage error for an option's value past llama.cpp's 32 bits."""
    if value is not None and value > MAX_INT32:
        raise EadError(f"{flag} must be at most {MAX_INT32} (llama.cpp's 32 bits), got {value}", exit_code=2)
