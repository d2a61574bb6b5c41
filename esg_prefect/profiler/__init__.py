"""The profiler: measured latency profiles, Stash stall breakdowns, co-run tables, validation.

* :func:`run_profile` - every target over batch sizes x vcpus (x GPU shares), one
  fresh worker process per configuration (:mod:`~esg_prefect.profiler.run`);
* :func:`stall_breakdown` - the Stash differential runs per stage
  (:mod:`~esg_prefect.profiler.breakdown`, :mod:`~esg_prefect.profiler.stalls`);
* :class:`InterferenceTable` - the measured co-run slowdowns, for the scheduler;
* :func:`validate` - the profile's predictions against fresh measurements;
* :func:`run_session` - all of it, with files and the profile store, as
  ``esg-prefect profile`` and :func:`~esg_prefect.profiler.flow.profile_flow` run it.

Targets are named by spec strings (:mod:`~esg_prefect.profiler.targets`):
``examples``, ``examples:image``, ``module:attr`` (a :class:`ProfileTarget`), or
``module:stage@module:samples``.
"""

from __future__ import annotations

from esg_prefect.profiler.breakdown import COMPONENTS, Breakdown, StallRow, stall_breakdown
from esg_prefect.profiler.interference import CoRunRow, InterferenceTable, measure_interference
from esg_prefect.profiler.measure import MeasureSettings
from esg_prefect.profiler.results import ProfiledPoint, Sample, read_profile_csv, read_samples_csv
from esg_prefect.profiler.run import Configuration, ProfileRequest, ProfileRun, run_profile
from esg_prefect.profiler.session import BreakdownOptions, SessionOptions, SessionResult, run_session
from esg_prefect.profiler.targets import ProfileTarget, input_size
from esg_prefect.profiler.validate import ValidationReport, ValidationRow, validate

__all__ = [
    "COMPONENTS",
    "Breakdown",
    "BreakdownOptions",
    "CoRunRow",
    "Configuration",
    "InterferenceTable",
    "MeasureSettings",
    "ProfileRequest",
    "ProfileRun",
    "ProfileTarget",
    "ProfiledPoint",
    "Sample",
    "SessionOptions",
    "SessionResult",
    "StallRow",
    "ValidationReport",
    "ValidationRow",
    "input_size",
    "measure_interference",
    "read_profile_csv",
    "read_samples_csv",
    "run_profile",
    "run_session",
    "stall_breakdown",
    "validate",
]
