"""Run the example text pipeline (tokenize -> encode -> classify_text -> summarize), pooled.

python flows/text_pipeline.py --requests 24
"""

from __future__ import annotations

import concurrent.futures

from esg_prefect.integration.api_check import script_requests


def main() -> None:
    requests = script_requests(24, __doc__)
    from esg_prefect import ESGTaskRunner
    from esg_prefect.examples.pipelines import text_flow

    pooled = text_flow.with_options(task_runner=ESGTaskRunner())
    pooled(request_seed=0)  # one run first: concurrent first runs would race to start Prefect's ephemeral API
    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        for i, out in enumerate(ex.map(lambda s: pooled(request_seed=s), range(requests))):
            print(i, out["text"][:60])


if __name__ == "__main__":
    main()
