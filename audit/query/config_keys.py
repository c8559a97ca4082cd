"""Which logged params a key of a planned run's config stands for (``runs similar``).

A training config is often nested (``training: {learning_rate: …}``, ``lora: {r: 16}``)
while trackers log what the trainer flattened: the HF Trainer's callbacks log
TrainingArguments flat (``learning_rate``), LLaMA-Factory's YAML is flat, TRL and axolotl
name the LoRA rank ``lora_r``, LLaMA-Factory and verl ``lora_rank``, PEFT's LoraConfig
``r``; verl's Hydra config is nested and W&B logs it so (``optim.lr``,
``actor_rollout_ref.model.lora_rank``). A query key is compared with, best first:

1. the logged key written the same;
2. one spelled the same apart from case and the separators ``.``, ``-`` and ``_``
   (``lora.r`` is ``lora_r``, ``lora.rank`` is ``lora_rank``);
3. one that names the same setting in another trainer (``SAME_SETTING``, and the
   configured [attribution] key lists: base model, dataset, method, teacher);
4. for a nested query key, a flat logged key spelled as one of its tails or naming the
   same setting (``training.learning_rate`` is ``learning_rate``, ``lora.r`` also ``r``),
   unless another key of the query has that tail (``actor.lr`` and ``critic.lr`` are
   neither ``lr``); for a flat query key, the nested logged keys it is the tail of
   (``lora_rank`` is ``model.lora_rank``). Two nested keys with different heads
   (``model.path``, ``data.path``) never match.

Each run is compared on the best tier of these it logged, so one query compares a TRL run
on ``lora_r`` and a LLaMA-Factory run on ``lora_rank``. The names of one tier are equally
good: a run that logged several of them (verl's ``actor_rollout_ref.model.lora_rank`` and
``critic.model.lora_rank`` for ``lora_rank``) matches when they agree.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

# Names several trainers give one setting (compared as ``spelling`` gives them).
SAME_SETTING: tuple[tuple[str, ...], ...] = (
    # HF TrainingArguments, TRL, LLaMA-Factory and axolotl; verl's optim.lr and PyTorch scripts
    ("learning_rate", "lr"),
    # TRL's ModelConfig and axolotl; LLaMA-Factory and verl; PEFT's LoraConfig under a lora section
    ("lora_r", "lora_rank"),
    # TRL and axolotl; LLaMA-Factory; PEFT's LoraConfig and verl's model.target_modules
    ("lora_target_modules", "lora_target", "target_modules"),
    # HF TrainingArguments and LLaMA-Factory; axolotl; verl's trainer.total_epochs
    ("num_train_epochs", "num_epochs", "total_epochs"),
)
_SEPARATORS = re.compile(r"[.\-_\s]+")
_MAX_PARTS = 32  # dotted parts of a key looked at


def spelling(key: str) -> str:
    """``key`` in lower case with every run of separators one underscore."""
    return _SEPARATORS.sub("_", key.strip().lower()).strip("_")


def _tails(key: str) -> list[str]:
    """The spelled tails of a dotted key, longest first, the key itself excluded:
    ``a.b.c`` gives ``b_c`` and ``c``."""
    parts = [p for p in key.split(".") if p][-_MAX_PARTS:]
    return [spelling(".".join(parts[i:])) for i in range(1, len(parts))]


@dataclass
class KeyMatch:
    """Each query key's logged names in tiers, best first; a key with none is missing."""

    tiers: dict[str, list[list[str]]]  # query key -> tiers of equally good logged keys
    missing: list[str]  # query keys no run logged under any of their names
    _by_spelling: dict[str, list[str]]

    def names(self, key: str) -> list[str]:
        """The logged keys ``key`` is compared with, best first."""
        return [name for tier in self.tiers.get(key, []) for name in tier]

    def suggestions(self, key: str, n: int = 3) -> list[str]:
        """Logged keys spelled close to ``key`` or to its last part (difflib), closest
        first; none when nothing is close."""
        known = list(self._by_spelling)
        close: list[str] = []
        for form in dict.fromkeys([spelling(key), spelling(key.rsplit(".", 1)[-1])]):
            close += difflib.get_close_matches(form, known, n=n, cutoff=0.75)
        found = (k for form in close for k in sorted(self._by_spelling[form]))
        return list(dict.fromkeys(found))[:n]


def match_keys(
    wanted: list[str], logged: list[str], same_setting: list[tuple[str, ...]] = ()
) -> KeyMatch:
    """The logged keys each of ``wanted`` may be compared with (see the module's doc)."""
    groups: dict[str, set[str]] = {}
    for group in (*SAME_SETTING, *same_setting):
        spelled = {spelling(k) for k in group}
        for name in spelled:
            groups.setdefault(name, set()).update(spelled)

    def forms(name: str) -> list[str]:
        """``name`` and the other names of its setting."""
        return [name, *sorted(groups.get(name, set()) - {name})]

    by_spelling: dict[str, list[str]] = {}
    by_tail: dict[str, list[str]] = {}
    for key in sorted(logged):
        by_spelling.setdefault(spelling(key), []).append(key)
        for tail in _tails(key):
            by_tail.setdefault(tail, []).append(key)
    shared_tails: dict[str, int] = {}
    for key in wanted:
        for tail in set(_tails(key)):
            shared_tails[tail] = shared_tails.get(tail, 0) + 1
    present = set(logged)

    tiers: dict[str, list[list[str]]] = {}
    missing: list[str] = []
    for key in wanted:
        found: list[list[str]] = [[key]] if key in present else []
        spelled = spelling(key)
        found += [by_spelling.get(name, []) for name in forms(spelled)]
        if "." in key:
            found += [
                [k for k in by_spelling.get(name, []) if "." not in k]
                for tail in _tails(key)
                if shared_tails[tail] == 1
                for name in forms(tail)
            ]
        else:
            found += [by_tail.get(name, []) for name in forms(spelled)]
        seen: set[str] = set()
        kept = []
        for tier in found:
            tier = [k for k in tier if k not in seen]
            seen.update(tier)
            if tier:
                kept.append(tier)
        if kept:
            tiers[key] = kept
        else:
            missing.append(key)
    return KeyMatch(tiers, missing, by_spelling)
