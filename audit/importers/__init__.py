"""Importers: the only code that writes the warehouse. One sub-package per source kind."""
