"""Save the default esg-prefect block documents to the current Prefect API.

    python blocks/create_defaults.py            # saves "default" documents of each type
    python blocks/create_defaults.py --overwrite

Then, in a flow:  ESGTaskRunner(settings="default", prices="default").
"""

from __future__ import annotations

import argparse
import re

from esg_prefect.integration.api_check import require_prefect_api


def block_name(text: str) -> str:
    """A ``--name`` Prefect accepts for a block document: lowercase letters, digits and dashes."""
    if not re.fullmatch(r"[a-z0-9-]+", text):
        raise argparse.ArgumentTypeError(
            f"a block document's name holds lowercase letters, digits and dashes only, got {text!r}"
        )
    return text


def main() -> None:
    # --help, a bad --name, an API that is not up: one answer each, before Prefect is imported.
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--name", type=block_name, default="default", help="name of the saved documents")
    parser.add_argument("--overwrite", action="store_true", help="replace documents of that name")
    args = parser.parse_args()
    require_prefect_api()

    from prefect.blocks.core import Block

    from esg_prefect.integration.blocks import ESGPool, ESGPriceSheet, ESGSchedulerSettings

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
