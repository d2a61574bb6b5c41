"""The cost store: per-run cost records in SQLite (default) or PostgreSQL.

* :class:`CostStore` - writes what the pool hands its run listeners, computes
  costs per run, workflow, deployment or day on demand;
* :func:`attach_store` - makes a store a pool's run listener (and keeps the
  pool's pricing options, :class:`Billing`, with its records);
* :func:`resolve_url` / :func:`default_store_path` - where the store lives
  (``$ESG_PREFECT_STORE_URL``, else ``$PREFECT_HOME/esg_prefect/costs.db``).

The ``esg-prefect costs`` command reads it.
"""

from __future__ import annotations

from esg_prefect.store.attach import StoreAttachment, attach_store
from esg_prefect.store.billing import Billing
from esg_prefect.store.cost_store import CostStore
from esg_prefect.store.engine import ENV_URL, default_store_path, resolve_url
from esg_prefect.store.migrations import MIGRATIONS, Migration
from esg_prefect.store.report import GROUP_BYS, IDLE_KEY, NO_DEPLOYMENT, CostRow, GroupBy, RunInfo

__all__ = [
    "ENV_URL",
    "GROUP_BYS",
    "IDLE_KEY",
    "MIGRATIONS",
    "NO_DEPLOYMENT",
    "Billing",
    "CostRow",
    "CostStore",
    "GroupBy",
    "Migration",
    "RunInfo",
    "StoreAttachment",
    "attach_store",
    "default_store_path",
    "resolve_url",
]
