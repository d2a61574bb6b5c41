"""The toy pipeline's calls and pools, for tests that drive a :class:`Pool` or the pool service directly.

One place for what many test files built alike: the ``toy`` workflow of
:mod:`tests.toy_stages` as the pool sees it, its calls (as objects and as the
service's JSON), and a pool of the toy profile on the inline backend. The
``pool`` fixture in ``tests/conftest.py`` is :func:`toy_pool` with its defaults;
a module that needs another scope or options defines its own ``pool`` with it.
"""

from __future__ import annotations

from typing import Any

from esg_prefect.control.calls import StageCall, WorkflowDecl
from esg_prefect.model import PriceSheet
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.workers import InlineBackend
from esg_prefect.scheduling import ESGSettings
from esg_prefect.service.wire import call_body
from tests.toy_stages import toy_profile

TOY = WorkflowDecl("toy", 800, (("double", "inc"),))
"""``tests.toy_stages.toy``: double then inc, an SLO of 800 ms."""
PRICES = PriceSheet(1e-5, {})
"""A vCPU-second at 1e-5 and no GPU prices: the toy pools' price sheet."""


def toy_call(
    i: int,
    stage: str = "inc",
    *,
    call_id: str | None = None,
    run: str | None = None,
    wf: WorkflowDecl = TOY,
    path: str | None = None,
    item: Any = None,
    **fields: Any,
) -> StageCall:
    """Call ``i`` of ``stage`` in a run of its own: id ``c{i}``, run ``r{i}``, input ``i``, unless given.

    ``path`` defaults to the stage of that name in :mod:`tests.toy_stages`; ``fields``
    are further :class:`StageCall` fields (``input_size``, ``upstream``, ...).
    """
    run = f"r{i}" if run is None else run
    return StageCall(
        call_id or f"c{i}",
        stage,
        path or f"tests.toy_stages:{stage}",
        wf,
        run,
        run,
        i if item is None else item,
        **fields,
    )


def flow_call(stage: str, run: str, item: Any, **fields: Any) -> StageCall:
    """The call run ``run`` makes of ``stage`` on ``item``: id ``{run}-{stage}`` (a run calls each stage once)."""
    return StageCall(f"{run}-{stage}", stage, f"tests.toy_stages:{stage}", TOY, run, run, item, **fields)


def toy_body(i: int, stage: str = "inc", call_id: str | None = None, **over: Any) -> dict[str, Any]:
    """The JSON the service gets for :func:`toy_call` ``(i, stage, call_id=call_id)``, with ``over`` replacing fields.

    ``over`` replaces keys of the JSON only (``stage_path``, ``item``, ``workflow``, ...), so that
    a test can send what no :class:`StageCall` would hold.
    """
    body = call_body(toy_call(i, stage, call_id=call_id))
    body.update(over)
    return body


def toy_pool(vcpus: int | None = None, settings: ESGSettings | None = None) -> Pool:
    """A pool of the toy profile at :data:`PRICES` on the inline backend (``vcpus``: the machine's); close it after.

    ``with toy_pool() as pool:`` closes it (a :class:`Pool` is a context manager).
    """
    return Pool(toy_profile(), PRICES, settings=settings, backend=InlineBackend(vcpus=vcpus))
