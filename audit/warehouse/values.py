"""Names and values the importers write and the readers interpret, defined once.

Tags the importers derive (``audit.*``) are the warehouse's own vocabulary: an importer
writes them, ``audit.costs``, the rules and the reports read them.
"""

from __future__ import annotations

# The world size a run's console log stated (``audit.importers.console``), and the line
# that stated it under WORLD_SIZE_TAG + ".evidence".
WORLD_SIZE_TAG = "audit.world_size"

# How long a run ran when its log says so but nothing places it in time (a copied folder
# whose file times are all the copy's): seconds, and how its times were found.
RUN_SECONDS_TAG = "audit.run_seconds"
TIME_BASIS_TAG = "audit.time_basis"
