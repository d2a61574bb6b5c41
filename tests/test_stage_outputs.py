"""What a stage hands back to its task run: only its own output, and persisted when the user asks for it."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from esg_prefect.control.calls import StageCall, StageResult, WorkflowDecl
from esg_prefect.integration.stage import Pipeline
from esg_prefect.model import PriceSheet
from esg_prefect.runtime.pool import Pool
from esg_prefect.runtime.workers import InlineBackend
from tests.toy_stages import load_inc, toy_profile

padded_pipe = Pipeline("padded", slo_ms=5_000)


@padded_pipe.stage(load=load_inc, name="padded", profile_name="double")
def padded(model: dict[str, Any], items: list[float]) -> list[torch.Tensor]:
    """Pads its batch to 8 rows (a bucketed batch), and returns row views of the padded tensor."""
    out = torch.zeros(8, 1_000)
    for i, x in enumerate(items):
        out[i] = x
    return list(out[: len(items)])


def test_an_inline_worker_hands_each_call_only_its_own_tensor() -> None:
    # A view keeps its whole batch alive, and pickling it (result persistence, caching) writes
    # every other row of the batch, other flow runs' outputs included.
    pool = Pool(toy_profile(), PriceSheet(1e-5, {}), backend=InlineBackend(vcpus=2))
    try:
        call = StageCall(
            call_id="c1",
            stage="padded",
            stage_path="tests.test_stage_outputs:padded",
            workflow=WorkflowDecl("padded", 5_000, ()),
            request_id="r1",
            run_id="r1",
            item=3.0,
            profile_stage="double",
        )
        result = pool.submit(call).result(timeout=60)
    finally:
        pool.close()
    assert isinstance(result, StageResult)
    out = result.output
    assert float(out[0]) == 3.0 and tuple(out.shape) == (1_000,)
    held = out.untyped_storage().nbytes()
    assert held == 4_000, f"the output holds {held} bytes of its batch, not its own 4000"


@pytest.mark.parametrize(
    "options",
    [{"persist_result": True}, {"result_storage_key": "k-{parameters[item]}"}, {"result_serializer": "json"}],
)
def test_a_stage_asked_to_persist_its_result_is_not_held_to_no_cache(options: dict[str, Any]) -> None:
    # Prefect persists nothing under NO_CACHE: persist_result=True would be silently ignored.
    from prefect.cache_policies import NO_CACHE

    pipe = Pipeline(f"persisted-{len(options)}-{next(iter(options))}", slo_ms=1_000)
    stage = pipe.stage(load=load_inc, import_path="tests.toy_stages:inc", name="kept", **options)(
        lambda model, items: items
    )
    assert stage.cache_policy is not NO_CACHE
    assert stage.persist_result is True
    plain = pipe.stage(load=load_inc, import_path="tests.toy_stages:inc", name="plain")(lambda model, items: items)
    assert plain.cache_policy is NO_CACHE  # nothing asked: no hashing of tensor inputs
    off = pipe.stage(load=load_inc, import_path="tests.toy_stages:inc", name="off", persist_result=False)(
        lambda model, items: items
    )
    assert off.cache_policy is NO_CACHE
