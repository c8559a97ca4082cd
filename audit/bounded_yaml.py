"""YAML from files other people wrote, with its size bounded after alias expansion.

Aliases let a few hundred bytes stand for billions of values ("billion laughs": nine levels
of ten ``*a`` each), and an anchor may contain itself (``a: &a {x: *a}``). The loaded
object shares the repeated parts, so loading is cheap, but whoever walks it afterwards
(``repr``, hashing, flattening a training config) expands it: gigabytes and minutes, or a
RecursionError. Here the document is first composed into nodes, its expanded size is
counted over the node graph (each shared node counted once per use, in linear time) and
a cycle or a size beyond the limit is an ``InputError``; only then is it constructed.
libyaml already refuses nesting deeper than 1,000 levels.
"""

from __future__ import annotations

from typing import Any

import yaml

from audit.errors import InputError

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_VALUES = 100_000  # scalars, sequences and mappings after expanding every alias


def load(data: bytes | str, where: object, what: str = "YAML", max_values: int = MAX_VALUES) -> Any:
    """The document in ``data``; ``where`` (a path) prefixes every error, ``what`` names
    the content in a syntax error (``cannot read <what> (problem)``)."""
    loader = _Loader(data)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expanded_size(node, where, max_values)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise InputError(f"{where}{line}: cannot read {what} ({problem})") from None
    finally:
        loader.dispose()


def _check_expanded_size(root: yaml.Node, where: object, max_values: int) -> None:
    sizes: dict[int, int] = {}  # node id -> values it expands to
    visiting: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        children = _children(node)
        if children_done:
            visiting.discard(key)
            size = 1 + sum(sizes[id(c)] for c in children)
            if size > max_values:
                line = node.start_mark.line + 1 if node.start_mark else 0
                raise InputError(
                    f"{where}:{line}: the YAML expands to more than {max_values:,} values "
                    "through its aliases (&anchor / *alias); refused as an alias bomb"
                )
            sizes[key] = size
            continue
        if key in visiting:
            line = node.start_mark.line + 1 if node.start_mark else 0
            raise InputError(
                f"{where}:{line}: a YAML anchor contains an alias of itself (a recursive "
                "structure); refused"
            )
        visiting.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in visiting:
                line = child.start_mark.line + 1 if child.start_mark else 0
                raise InputError(
                    f"{where}:{line}: a YAML anchor contains an alias of itself (a recursive "
                    "structure); refused"
                )
            if id(child) not in sizes:
                stack.append((child, False))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []
