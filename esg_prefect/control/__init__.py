"""The platform around the scheduler, once: what the runtime pool and the simulator both drive.

Plain data and bookkeeping with no clock, no threads, no asyncio and no I/O:
the calls that cross into a pool (:mod:`~esg_prefect.control.calls`) and the
records it keeps of them (:mod:`~esg_prefect.control.records`), which the cost
store, the artifacts and the reports read.
"""
