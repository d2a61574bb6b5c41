"""Run the example fan-out pipeline: one clip -> one frame-model call per frame (.map) -> aggregate.

The frame calls of every concurrent clip land in the same AFW queue and are batched together.

    python flows/video_fanout.py --requests 16
"""

from __future__ import annotations

import concurrent.futures

from esg_prefect.integration.api_check import script_requests


def main() -> None:
    requests = script_requests(16, __doc__)
    from esg_prefect import ESGTaskRunner
    from esg_prefect.examples.pipelines import video_flow

    pooled = video_flow.with_options(task_runner=ESGTaskRunner())
    pooled(request_seed=0)  # one run first: concurrent first runs would race to start Prefect's ephemeral API
    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        for i, out in enumerate(ex.map(lambda s: pooled(request_seed=s), range(requests))):
            print(i, out["label"], f"{out['score']:.3f}")


if __name__ == "__main__":
    main()
