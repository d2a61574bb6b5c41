"""Which profiler option needs which mode, and which mode ignores which option.

``esg-prefect profile`` and the flow (:func:`~esg_prefect.profiler.flow.profile_flow`)
refuse, in one line naming them, the options a run would otherwise drop without
a word: both check the same tables, the CLI by its long option names, the flow
through :data:`FLOW_PARAMETERS`. Only options the user gave count: an option
left at its default is never refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from esg_prefect.exceptions import InvalidInputError

EVERY_OTHER = ("*",)
"""In :data:`TAKES_NONE_OF`: every option but the mode's own."""

_MEASURING = ("--vcpus", "--batches", "--gpu-shares", "--wait-quiet-s")
"""The options only a new profile's measurement takes."""

TAKES_NONE_OF: dict[str, tuple[str, tuple[str, ...]]] = {
    # mode: what it does, and the options it would ignore (checked in this order)
    "--flow": ("measures a new profile", ("--profile", "--measurements", "--stalls", "--figures-dir", "--fit-sizes")),
    "--fit-sizes": ("only fits the input-size model", EVERY_OTHER),
    "--quick": (
        "is the smoke test (batches 1,2, one attempt, no wait for quiet, validation at 1,3)",
        ("--batches", "--max-attempts", "--wait-quiet-s", "--validation-batches"),
    ),
    "--profile": ("uses this profile instead of measuring one", _MEASURING),
    # --breakdown would measure another breakdown and draw it over this one's figures
    "--stalls": (
        "draws this stall breakdown again instead of measuring one or a profile",
        ("--breakdown", *_MEASURING),
    ),
    "--measurements": ("reuses these measurements", ("--validation-batches",)),
    "--no-store": ("skips the profile store", ("--store",)),
}
NEEDS_ONE_OF: dict[str, tuple[str, ...]] = {
    # option: the modes of which it needs one; without them it does nothing
    "--breakdown-batch": ("--breakdown",),
    "--co-runners": ("--breakdown",),
    "--trace": ("--breakdown",),
    "--utilisation": ("--breakdown",),
    "--validation-batches": ("--validate",),
    "--measurements": ("--validate",),
    "--profile": ("--validate", "--breakdown"),
    "--figures-dir": ("--breakdown", "--validate", "--stalls"),
}
STALLS_ALONE_TAKES_NONE_OF = ("--target", "--quick", "--max-attempts")
"""What ``--stalls`` without ``--validate`` ignores: it measures nothing, on no targets."""

FLOW_PARAMETERS: dict[str, str] = {
    # CLI option: the flow's parameter; the flow always measures a new profile, so the CLI's other
    # modes (--profile, --stalls, --measurements, --fit-sizes) have none. Not here: batches, which the
    # flow's quick takes as its smoke test's batch sizes (the CLI's --quick is a fixed preset).
    "--target": "targets",
    "--vcpus": "vcpus",
    "--gpu-shares": "gpu_shares",
    "--quick": "quick",
    "--breakdown": "breakdown",
    "--validate": "validation",
    "--store": "store_url",
    "--wait-quiet-s": "wait_quiet_s",
    "--max-attempts": "max_attempts",
    "--breakdown-batch": "breakdown_batch",
    "--co-runners": "co_runners",
    "--trace": "trace",
    "--utilisation": "utilisation",
    "--validation-batches": "validation_batches",
    "--no-store": "store",  # store=False
}


def _or(options: list[str]) -> str:
    """``a or b``, ``a, b or c``."""
    return " or ".join(options) if len(options) < 3 else f"{', '.join(options[:-1])} or {options[-1]}"


def ignored_option(given: Mapping[str, object], name: Callable[[str], str] = str) -> tuple[str, str] | None:
    """The first rule of the tables the given options break: (the mode or option to blame, one line), or None.

    Args:
        given: the options given, by long CLI name, with their values (a mode is on when its
            value is neither None nor False).
        name: how the line names an option (the flow names its parameter and value).
    """
    on = {option for option, value in given.items() if value is not None and value is not False}
    for mode, (does, takes_none_of) in TAKES_NONE_OF.items():
        if mode in on:
            ignored = [o for o in given if o != mode and (takes_none_of is EVERY_OTHER or o in takes_none_of)]
            if ignored:
                them = "it" if len(ignored) == 1 else "them"
                return mode, (
                    f"{name(mode)} {does} and takes none of {', '.join(map(name, ignored))}; "
                    f"drop {them} or {name(mode)}"
                )
    for option, modes in NEEDS_ONE_OF.items():
        if option in given and not on.intersection(modes):
            them = "it" if len(modes) == 1 else "them"
            needed = _or([name(m) for m in modes])
            return option, (
                f"{name(option)} is for {needed} and does nothing without {them}; add {needed}, or drop {name(option)}"
            )
    if "--stalls" in on and "--validate" not in on:
        ignored = [o for o in given if o in STALLS_ALONE_TAKES_NONE_OF]
        if ignored:
            them = "it" if len(ignored) == 1 else "them"
            return "--stalls", (
                f"--stalls without --validate only draws this breakdown, measuring nothing, and takes none of "
                f"{', '.join(ignored)}; drop {them} or --stalls"
            )
    return None


def refuse_ignored_parameters(values: Mapping[str, object], defaults: Mapping[str, object]) -> None:
    """Refuse the flow's parameters its run would ignore, in one line naming them and their values.

    A parameter counts as given when its value differs from its default (a flow, or a
    deployment's parameters in the UI, cannot tell a default from the same value set).

    Raises:
        InvalidInputError: e.g. ``quick=True is the smoke test (...) and takes none of max_attempts=3``.
    """
    given = {o: True for o, p in FLOW_PARAMETERS.items() if values[p] != defaults[p]}

    def name(option: str) -> str:  # a mode not given is named by the value that turns it on
        param = FLOW_PARAMETERS[option]
        value = values[param] if option in given else not defaults[param]
        return f"{param}={value!r}"

    found = ignored_option(given, name)
    if found is not None:
        raise InvalidInputError(found[1])
