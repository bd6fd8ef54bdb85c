"""User-facing errors. A ``UserError`` is a mistake in what the user asked for (bad flag, bad file,
a layout that cannot work); the CLI prints its message as one line and exits with code 2.
An ``InvalidPlanError`` is a well-formed plan that breaks a rule of the plan format (coverage, slice
order, schedule); the CLI exits with code 1 for it, so scripts can tell "not a plan" from "a wrong plan".
Internal invariants use ``assert`` instead."""


class UserError(ValueError):
    """Bad input from the user; the message names the offending value."""


class InvalidPlanError(UserError):
    """A plan that fails the checker; the message names the offending entry."""


class ScheduleError(InvalidPlanError):
    """A schedule that cannot run: an order that misses or repeats actions, that deadlocks, or that
    runs an action before its inputs (the checker and the runtime raise the same class)."""
