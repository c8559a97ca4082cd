"""Finding the rules: built-in modules in ``rules/`` and plug-ins of the ``audit.rules``
entry-point group, selection by code or family, and validation of their settings."""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
import sys
from importlib.metadata import entry_points

from audit.config import load_config
from audit.errors import InputError
from audit.rule_api import Rule

ENTRY_POINT_GROUP = "audit.rules"


def _builtin_modules() -> list[str]:
    import audit.rules as package

    return sorted(
        m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_")
    )


def all_rules() -> dict[str, type[Rule]]:
    """Every rule, built-in and from the ``audit.rules`` entry-point group, by code.

    Found once per import path: the entry points are read from the installed
    distributions (12 ms a time), and a report asks for a finding's rule thousands of
    times (25 s of a 48 s scan at size L before)."""
    return dict(_rules_on(tuple(sys.path)))


@functools.lru_cache(maxsize=4)
def _rules_on(_import_path: tuple[str, ...]) -> dict[str, type[Rule]]:
    rules: dict[str, type[Rule]] = {}
    for module_name in _builtin_modules():
        module = importlib.import_module(f"audit.rules.{module_name}")
        for obj in vars(module).values():
            if (
                inspect.isclass(obj)
                and issubclass(obj, Rule)
                and obj is not Rule
                and obj.__module__ == module.__name__
            ):
                rules[obj.code] = obj
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = entry.load()
        except Exception as exc:  # a broken plug-in must not take the built-in rules down
            raise InputError(
                f"rule plug-in {entry.name!r} ({entry.value}) failed to load: {exc}"
            ) from None
        if not (inspect.isclass(obj) and issubclass(obj, Rule)):
            raise InputError(f"rule plug-in {entry.name!r} is not an audit.rule_api.Rule subclass")
        rules[obj.code] = obj
    for code, rule in rules.items():
        if not getattr(rule, "family_label", ""):
            raise InputError(f"rule {code} declares no family_label")
    return dict(sorted(rules.items()))


def families() -> dict[str, str]:
    """Family prefix -> label, as the rules declare them (sorted by prefix)."""
    out: dict[str, str] = {}
    for code, rule in all_rules().items():
        out.setdefault(code[:3], rule.family_label)
    return out


def get_rule(code: str) -> type[Rule]:
    rules = all_rules()
    if code.upper() not in rules:
        raise InputError(f"unknown rule {code!r}; valid: {', '.join(rules)}")
    return rules[code.upper()]


def effective_thresholds(rule: type[Rule], config) -> dict[str, float]:
    """A rule's thresholds: its defaults, overridden by ``[rules.CODE]`` of the config
    (checked against the rule's schema)."""
    values = {key: threshold.default for key, threshold in rule.thresholds.items()}
    settings = config.rules.get(rule.code, {})
    values.update(_validated(rule, settings, _where(config)))
    return values


def check_rule_settings(config) -> None:
    """Every ``[rules.CODE]`` table of ``config`` against its rule's thresholds: an unknown
    rule or key, or a value out of range, is an input error naming it (exit 2) before a
    command does any work."""
    for code, settings in config.rules.items():
        validate_rule_settings(code, settings, _where(config))


def load_checked_config(path):
    """``audit.config.load_config`` with its ``[rules.CODE]`` tables checked: what every
    command uses."""
    config = load_config(path)
    check_rule_settings(config)
    return config


def _where(config) -> str:
    return f"config {config.path}" if config.path is not None else "config"


def validate_rule_settings(code: str, settings: dict, where: str) -> dict[str, float]:
    return _validated(get_rule(code), settings, where)


def _validated(rule: type[Rule], settings: dict, where: str) -> dict[str, float]:
    code = rule.code
    out = {}
    for key, value in settings.items():
        if key not in rule.thresholds:
            valid = ", ".join(sorted(rule.thresholds)) or "none"
            raise InputError(f"{where}: unknown key '{key}' in [rules.{code}]; valid keys: {valid}")
        out[key] = rule.thresholds[key].validate(value, f"{where}: [rules.{code}] {key}")
    return out


def select_rules(select: str | None = None, ignore: str | None = None) -> list[type[Rule]]:
    """``--select``/``--ignore`` take codes or family prefixes (``OVP``), comma separated."""
    rules = all_rules()

    def parse(text: str | None) -> list[str]:
        items = [c.strip().upper() for c in (text or "").split(",") if c.strip()]
        for item in items:
            if not any(code.startswith(item) for code in rules):
                raise InputError(f"no rule matches {item!r}; valid codes: {', '.join(rules)}")
        return items

    chosen, dropped = parse(select), parse(ignore)
    return [
        rule
        for code, rule in rules.items()
        if (not chosen or any(code.startswith(c) for c in chosen))
        and not any(code.startswith(d) for d in dropped)
    ]
