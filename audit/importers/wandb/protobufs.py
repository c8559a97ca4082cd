"""Loading the protobuf ``Record`` class of the installed ``wandb``, without starting its SDK."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path


def protobufs():
    """The ``Record`` class of the installed wandb, or None when wandb is not installed.

    Only the generated protobuf modules are loaded: ``import wandb`` itself starts the
    SDK (settings models, error reporting) and costs 2-3 s per command. The ``wandb`` and
    ``wandb.proto`` packages stand in as bare namespaces while ``wandb.proto``'s own
    version switch loads the definitions, then step aside for the real package.
    """
    if "wandb" in sys.modules:  # the real package is loaded already: use it
        try:
            from wandb.proto import wandb_internal_pb2
        except ImportError:
            return None
        return wandb_internal_pb2.Record
    spec = importlib.util.find_spec("wandb")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    stand_ins = {"wandb": root, "wandb.proto": root / "proto"}
    for name, folder in stand_ins.items():
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]
        sys.modules[name] = package
    try:
        module = importlib.import_module("wandb.proto.wandb_internal_pb2")
    except ImportError:
        return None
    finally:
        for name in stand_ins:
            sys.modules.pop(name, None)
        sys.modules.pop("wandb.proto.wandb_internal_pb2", None)
    return module.Record
