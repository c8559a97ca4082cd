"""Jinja templates for reports, shipped inside the package as ``audit.templates``."""
