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


def utf8_problem(path, data: bytes, exc: UnicodeDecodeError) -> str:
    """'<path>:<line>: invalid UTF-8 (byte 0xff at column 3)' for a failed decode of ``data``."""
    line = data.count(b"\n", 0, exc.start) + 1
    column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
    byte = data[exc.start : exc.start + 1].hex()
    return (
        f"{path}:{line}: invalid UTF-8 (byte 0x{byte} at column {column}); save the file as UTF-8"
    )


def install_hint(extra: str) -> str:
    """How to install an optional extra today: audit is not on a package registry yet, so
    from a checkout or a git URL (docs/install.md), never ``pip install audit-waste[...]``."""
    return (
        f"pip install -e '.[{extra}]' in a checkout of audit, or "
        f"pip install 'audit-waste[{extra}] @ git+GIT_URL' (docs/install.md)"
    )
