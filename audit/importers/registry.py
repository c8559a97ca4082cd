"""Which file-based tracker importers there are: a kind -> its ``RunFolderSource``.

Built-in importers are the lines of ``BUILTIN`` below; importers of other packages are
entries of the ``audit.importers`` entry-point group (the name is the kind, the value
``module:Class``), as rules are of ``audit.rules``. ``audit ingest <kind>`` is generated
for each (``audit.cli.ingest``), so a new tracker is one module plus one line here or in
its own package's ``pyproject.toml``::

    [project.entry-points."audit.importers"]
    acme = "acme_audit_importer:AcmeSource"

Built-ins are listed here rather than as entry points of this package: an entry point
exists only once the package is (re)installed, and a checkout whose installed metadata
predates a new line would silently lack the command.

Listing the kinds imports nothing; an importer's module is imported when its command is
built (when it runs, or a listing of every command's help needs it).
"""

from __future__ import annotations

import importlib
import inspect
from importlib.metadata import entry_points

from audit.errors import InputError

ENTRY_POINT_GROUP = "audit.importers"

BUILTIN = {
    "swanlab": "audit.importers.swanlab:SwanLabSource",
    "tensorboard": "audit.importers.tensorboard:TensorBoardSource",
    "trackio": "audit.importers.trackio:TrackioSource",
    "trainer-logs": "audit.importers.trainer_logs:TrainerLogSource",
    "wandb": "audit.importers.wandb:WandbSource",
}


def importer_kinds(taken: frozenset[str] = frozenset()) -> dict[str, str]:
    """kind -> ``module:Class``, built-in and plug-in, sorted by kind. ``taken`` are the
    names of the other ``ingest`` commands: a plug-in may not reuse one, nor a built-in's."""
    kinds = dict(BUILTIN)
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in kinds or entry.name in taken:
            raise InputError(
                f"importer plug-in {entry.name!r} ({entry.value}): the kind {entry.name!r} "
                "is taken by a built-in importer; give the entry point another name"
            )
        kinds[entry.name] = entry.value
    return dict(sorted(kinds.items()))


def load_importer(kind: str, value: str):
    """The ``RunFolderSource`` subclass ``value`` (``module:Class``) names, checked."""
    from audit.importers.run_files import RunFolderSource

    module_name, _, attribute = value.partition(":")
    try:
        obj = importlib.import_module(module_name)
        for part in attribute.split(".") if attribute else ():
            obj = getattr(obj, part)
    except Exception as exc:  # a broken plug-in must not take the other commands down
        raise InputError(f"importer {kind!r} ({value}) failed to load: {exc}") from None
    if not (inspect.isclass(obj) and issubclass(obj, RunFolderSource)):
        raise InputError(
            f"importer {kind!r} ({value}) is not an audit.importers.run_files.RunFolderSource "
            "subclass"
        )
    missing = [
        name
        for name in ("kind", "noun", "command_help", "progress_label")
        if not hasattr(obj, name)
    ]
    if missing:
        raise InputError(f"importer {kind!r} ({value}) does not declare {', '.join(missing)}")
    if obj.kind != kind:
        raise InputError(
            f"importer {kind!r} ({value}) declares kind {obj.kind!r}; the entry point's name "
            "and the class's kind must be the same"
        )
    return obj
