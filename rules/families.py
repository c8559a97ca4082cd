"""What the rules of one family declare alike, declared once: the family's label (its row
in summaries) and, where every rule of the family reads the same, its scope, the tables it
needs and the shared computations it reads. A rule names its family first:
``class OrphanCheckpoints(RedundantCheckpoints, Rule)``; what it declares itself wins."""

from __future__ import annotations

from audit.rule_api import needing


class RedundantCheckpoints:
    family_label = "redundant checkpoints"
    waste_scope = "storage"  # bytes and $ per month, not GPU spend
    reads_shared = frozenset({"checkpoint_rows", "facts"})
    needs = needing("checkpoints")


class IdleCapacity:
    family_label = "idle capacity"


class OverProvisioning:
    family_label = "over-provisioning"


class EvaluationCost:
    family_label = "evaluation cost"


class UnmonitoredRegression:
    family_label = "unmonitored regression"
