"""Accuracy against expert verdicts on real data (``verdicts.yml``; ``make accuracy``)."""
