"""User-facing errors. A ``UserError`` is a mistake in what the user asked for (bad flag, bad file,
a layout that cannot work); the CLI prints its message as one line and exits with code 2.
Internal invariants use ``assert`` instead."""


class UserError(ValueError):
    """Bad input from the user; the message names the offending value."""
