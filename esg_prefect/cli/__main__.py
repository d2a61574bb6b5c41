"""``python -m esg_prefect.cli``: the same as the ``esg-prefect`` command."""

from esg_prefect.cli import run

run()
