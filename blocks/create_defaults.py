"""Save the default esg-prefect block documents to the current Prefect API.

    python blocks/create_defaults.py            # saves "default" documents of each type
    python blocks/create_defaults.py --overwrite

Then, in a flow:  ESGTaskRunner(settings="default", prices="default").
"""

from __future__ import annotations

import argparse

from prefect.blocks.core import Block

from esg_prefect.integration.blocks import ESGPool, ESGPriceSheet, ESGSchedulerSettings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--name", default="default", help="name of the saved documents")
    parser.add_argument("--overwrite", action="store_true", help="replace documents of that name")
    args = parser.parse_args()
    documents: list[Block] = [ESGPool(), ESGPriceSheet(), ESGSchedulerSettings()]
    for doc in documents:
        try:
            doc.save(args.name, overwrite=args.overwrite)
        except ValueError as exc:  # Prefect's "... a name that is already in use ..."
            if "already in use" not in str(exc):
                raise
            print(f"kept {type(doc).__name__} {args.name!r}: already saved (--overwrite replaces it with the defaults)")
            continue
        print(f"saved {type(doc).__name__} {args.name!r}")


if __name__ == "__main__":
    main()
