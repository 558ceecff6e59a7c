"""Results: where they live (``location``) and the Parquet datasets under it (``store``)."""

from specsweep.results.location import DEFAULT_ROOT, ResultsLocation
from specsweep.results.store import ResultsStore, new_run_id, now_iso

__all__ = ["DEFAULT_ROOT", "ResultsLocation", "ResultsStore", "new_run_id", "now_iso"]
