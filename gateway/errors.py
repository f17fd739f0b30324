"""Errors the user can act on. Messages name the bad setting and the fix, never a raw value."""


class PrivgwError(Exception):
    """Base class: anything the CLI reports as one clear line instead of a traceback."""


class PolicyError(PrivgwError):
    """The policy file is invalid."""


class InputDataError(PrivgwError):
    """An input file or record does not match the policy."""


class MechanismError(PrivgwError):
    """A privacy mechanism was configured with impossible parameters."""


class StateDamagedError(PrivgwError):
    """Stored state cannot be read as it was written (cut short or altered): restore it."""
