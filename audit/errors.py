"""Typed errors. The CLI turns each into a one-line message and an exit code."""


class AuditError(Exception):
    """A problem the user can fix: bad input, missing file, unreachable source.

    ``exit_code`` follows the documented convention: 2 for usage or input errors.
    """

    exit_code = 2


class InputError(AuditError):
    """A source file or store that cannot be read or parsed."""


class SourceUnavailable(AuditError):
    """A tracking server or database that did not answer after retries."""


class WarehouseError(AuditError):
    """The warehouse file is missing, locked, damaged or of an unknown version."""
