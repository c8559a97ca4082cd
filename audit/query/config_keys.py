"""Which logged params a key of a planned run's config stands for (``runs similar``).

A training config is often nested (``training: {learning_rate: …}``, ``lora: {r: 16}``)
while trackers log what the trainer flattened: the HF Trainer's callbacks log
TrainingArguments flat (``learning_rate``), LLaMA-Factory's YAML is flat, TRL and axolotl
name the LoRA rank ``lora_r``, LLaMA-Factory and verl ``lora_rank``, PEFT's LoraConfig
``r``; verl's Hydra config is nested and W&B logs it so (``actor_rollout_ref.actor.optim.lr``,
``model.lora_rank``). A query key is compared with, best first:

1. the logged key written the same;
2. one spelled the same apart from case and the separators ``.``, ``-`` and ``_``
   (``lora.r`` is ``lora_r``, ``lora.rank`` is ``lora_rank``);
3. one that names the same setting in another trainer (``SAME_SETTING``, and the
   configured [attribution] key lists: base model, dataset, method, teacher);
4. for a nested query key, a flat logged key spelled as its tail, or naming the same
   setting as it (``training.learning_rate`` is ``learning_rate``, ``lora.r`` also
   ``r``); for a flat query key, a nested logged key whose tail it is
   (``lora_rank`` is ``model.lora_rank``). A tail two keys of the query share
   (``actor.lr``, ``critic.lr``), or two logged keys share, stands for neither. Two
   nested keys with different heads (``model.path``, ``data.path``) never match.

Each run is compared on the best of these it logged, so one query compares a TRL run on
``lora_r`` and a LLaMA-Factory run on ``lora_rank``.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

# Names several trainers give one setting (spelled as ``spelling`` gives them).
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
# Forms of a key: the whole key, then each shorter tail of its dotted parts.
_MAX_PARTS = 32


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
    """Each query key's logged counterparts, best first (a key with none is missing)."""

    candidates: dict[str, list[str]]  # query key -> logged keys, best first
    missing: list[str]  # query keys no run logged under any of their names
    _by_spelling: dict[str, list[str]]

    def suggestions(self, key: str, n: int = 3) -> list[str]:
        """Logged keys spelled close to ``key`` or to its last part (difflib), closest
        first; none when nothing is close."""
        close: list[str] = []
        for form in dict.fromkeys([spelling(key), spelling(key.rsplit(".", 1)[-1])]):
            close += difflib.get_close_matches(form, list(self._by_spelling), n=n, cutoff=0.75)
        return list(dict.fromkeys(k for form in close for k in sorted(self._by_spelling[form])))[:n]


def match_keys(
    wanted: list[str], logged: list[str], same_setting: list[tuple[str, ...]] = ()
) -> KeyMatch:
    """The logged keys each of ``wanted`` may be compared with (see the module's doc)."""
    groups: dict[str, set[str]] = {}
    for group in (*SAME_SETTING, *same_setting):
        spelled = {spelling(k) for k in group}
        for name in spelled:
            groups.setdefault(name, set()).update(spelled)

    def synonyms(form: str) -> list[str]:
        return sorted(groups.get(form, set()) - {form})

    by_spelling: dict[str, list[str]] = {}
    by_tail: dict[str, set[str]] = {}
    for key in logged:
        by_spelling.setdefault(spelling(key), []).append(key)
        for tail in _tails(key):
            by_tail.setdefault(tail, set()).add(key)
    query_tails: dict[str, int] = {}
    for key in wanted:
        for tail in set(_tails(key)):
            query_tails[tail] = query_tails.get(tail, 0) + 1
    present = set(logged)

    candidates: dict[str, list[str]] = {}
    missing: list[str] = []
    for key in wanted:
        ranked: list[str] = [key] if key in present else []
        spelled = spelling(key)
        for name in (spelled, *synonyms(spelled)):
            ranked += sorted(by_spelling.get(name, []))
        if "." in key:  # a nested query key: flat logged keys spelled as a tail of it
            for tail in _tails(key):
                if query_tails[tail] == 1:
                    for name in (tail, *synonyms(tail)):
                        ranked += sorted(k for k in by_spelling.get(name, []) if "." not in k)
        else:  # a flat query key: the one nested logged key it is the tail of
            for name in (spelled, *synonyms(spelled)):
                owners = by_tail.get(name, set())
                if len(owners) == 1:
                    ranked += sorted(owners)
        if ranked:
            candidates[key] = list(dict.fromkeys(ranked))
        else:
            missing.append(key)
    return KeyMatch(candidates, missing, by_spelling)
