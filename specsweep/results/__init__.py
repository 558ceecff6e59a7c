"""Results: where they live (``location``) and the Parquet datasets under it (``store``)."""

from specsweep.results.location import DEFAULT_ROOT, ResultsLocation
from specsweep.results.store import ResultsStore, comparison_folder, new_run_id, now_iso, tuning_folder

__all__ = ["DEFAULT_ROOT", "ResultsLocation", "ResultsStore", "comparison_folder", "new_run_id", "now_iso",
           "tuning_folder"]
