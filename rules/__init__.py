"""Waste rules, one module per rule, shipped inside the package as ``audit.rules``."""
