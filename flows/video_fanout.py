"""Run the example fan-out pipeline: one clip -> one frame-model call per frame (.map) -> aggregate.

The frame calls of every concurrent clip land in the same AFW queue and are batched together.

    python flows/video_fanout.py --requests 16
"""

from __future__ import annotations

import argparse
import concurrent.futures

from esg_prefect.integration.api_check import ephemeral_api_defaults, require_prefect_api


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=16)
    args = parser.parse_args()
    if args.requests < 1:
        parser.exit(2, f"{parser.prog}: error: --requests must be at least 1, got {args.requests}\n")
    ephemeral_api_defaults()  # Prefect's temporary API in memory: its SQLite file locks under concurrent runs
    require_prefect_api()  # before Prefect and torch load: a server that is not up costs one line
    from esg_prefect import ESGTaskRunner
    from esg_prefect.examples.pipelines import video_flow

    pooled = video_flow.with_options(task_runner=ESGTaskRunner())
    pooled(request_seed=0)  # one run first: concurrent first runs would race to start Prefect's ephemeral API
    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        for i, out in enumerate(ex.map(lambda s: pooled(request_seed=s), range(args.requests))):
            print(i, out["label"], f"{out['score']:.3f}")


if __name__ == "__main__":
    main()
