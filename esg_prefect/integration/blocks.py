"""Prefect blocks: the pool, the price sheet and the scheduler settings as saved configuration.

Registered through the ``prefect.collections`` entry point, so ``prefect block
register -m esg_prefect.integration.blocks`` (or installing the package) makes
them appear in the UI. :class:`~esg_prefect.integration.runner.ESGTaskRunner`
accepts each of them, or the name of a saved document, in place of the plain
objects. ``blocks/create_defaults.py`` saves the default documents.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

from prefect.blocks.core import Block
from pydantic import ConfigDict, Field, SecretStr, ValidationError, model_validator

from esg_prefect.exceptions import InvalidInputError, close_match
from esg_prefect.model.config import ConfigSpace
from esg_prefect.model.pricing import PriceSheet
from esg_prefect.scheduling.paldia import corun_model
from esg_prefect.scheduling.settings import ESGSettings
from esg_prefect.service.address import address_refusal

# The same image ships in the package as esg_prefect/data/logo.png.
_LOGO = "https://raw.githubusercontent.com/esg-prefect/esg-prefect/main/esg_prefect/data/logo.png"
_DOCS = "https://github.com/esg-prefect/esg-prefect#readme"

_VALIDATED = ConfigDict(validate_assignment=True)
"""Blocks whose values the model checks: a field set after construction is checked again (before a save)."""


def _refused(convert: Callable[[], object]) -> None:
    """Run a block's conversion to the model's object, so that the model's rules refuse a bad value now.

    A bad value in a saved block otherwise surfaced inside a flow run's first stage call. The
    model's one-line error (naming the value) becomes the ``ValueError`` pydantic reports.
    """
    try:
        convert()
    except InvalidInputError as exc:
        raise ValueError(str(exc)) from None


def _no_field(cls: type[Block], name: str) -> str:
    """The line for a name that is none of a block's fields, with the field most likely meant."""
    guess = close_match(name, cls.model_fields)
    hint = f": did you mean {guess!r}?" if guess else f"; its fields: {', '.join(sorted(cls.model_fields))}"
    return f"{cls.__name__} has no field {name!r}{hint}"


def _prefects(key: str) -> bool:
    """Whether a key is Prefect's own in a block's data (its type's slug, private and reference keys)."""
    return key == "block_type_slug" or key.startswith(("_", "$"))


def _fields_only(cls: type[Block], data: Any) -> Any:
    """Refuse a name that is none of the block's fields (Prefect's own keys pass).

    Prefect's blocks keep unknown keywords (``extra="allow"``): ``ESGSchedulerSettings(keep_alive=10)``
    made a block with ``keep_alive_s`` still 60 s, and saved the misspelling beside it.
    """
    if isinstance(data, dict):
        for key in data:
            if isinstance(key, str) and key not in cls.model_fields and not _prefects(key):
                raise ValueError(_no_field(cls, key))
    return data


_KNOWN_NAMES: Any = model_validator(mode="before")(_fields_only)
"""The blocks' validator refusing a misspelt field name (pydantic makes it the class's classmethod)."""


def _assign_or_keep(block: Block, name: str, value: Any) -> None:
    """Set a field of a block; a misspelt name, or a value the block's checks refuse, leaves it as it was.

    pydantic takes back a value its field constraints refuse, but not one refused by a model
    validator (a setting :class:`ESGSettings` refuses, a co-run table that cannot be read): the
    bad value stayed on the block, and a ``save()`` after the error stored it.
    """
    _fields_only(type(block), {name: value})
    had = name in block.__dict__
    old = block.__dict__.get(name)
    try:
        Block.__setattr__(block, name, value)
    except ValidationError:
        if had:
            block.__dict__[name] = old
        raise


class ESGPool(Block):
    """Where a flow's DNN stage calls are pooled: the embedded pool or a pool service.

    Examples:
        Load a saved pool and use it in a flow:
        ```python
        from esg_prefect import ESGTaskRunner
        from esg_prefect.integration.blocks import ESGPool

        pool_block = ESGPool.load("BLOCK_NAME")
        runner = ESGTaskRunner(pool=pool_block)
        ```
    """

    _block_type_name: ClassVar[str] = "ESG Pool"
    _logo_url: ClassVar[Any] = _LOGO
    _documentation_url: ClassVar[Any] = _DOCS

    address: str | None = Field(
        default=None, description="URL of an esg-prefect pool service; empty for the embedded in-process pool."
    )
    token: SecretStr | None = Field(
        default=None, description="Bearer token of the pool service; required when it listens beyond 127.0.0.1."
    )
    backend: Literal["process", "inline"] = Field(
        default="process", description="Workers of the embedded pool: worker processes, or threads (tests)."
    )
    scheduler: str = Field(default="esg", description="Registered scheduler name (esg-prefect schedulers lists them).")
    profile_path: str | None = Field(
        default=None, description="Latency profile CSV; empty for the profiles shipped with esg-prefect."
    )

    model_config = _VALIDATED
    __setattr__ = _assign_or_keep
    _known_names = _KNOWN_NAMES

    @model_validator(mode="after")
    def _check_pool(self) -> ESGPool:
        """Refuse what ``ESGTaskRunner(pool=...)`` refuses, naming it: a malformed address, an address
        beside options of the embedded pool (a pool service has its own), or, for the embedded pool, an
        unknown scheduler (the UI's empty field too), a profile path that is no file, or a token, which
        only a pool service takes. Such a block saved fine and failed each deployment run as it imported
        its flow, or (the token) was dropped without a word."""
        if not self.address:  # None, or the UI's empty field: the embedded pool, checked by the runner's rules
            if self.token is not None and self.token.get_secret_value():  # "": the UI's empty field
                raise ValueError(
                    "token is the bearer token of a pool service; the embedded pool (no address) takes none: "
                    "set the address or leave the token empty"
                )
            from esg_prefect.integration.runner import check_embedded  # the runner imports the pool: only here

            _refused(lambda: check_embedded(self.scheduler, None, self.profile_path or None, None))
            return self
        if refusal := address_refusal(self.address):
            raise ValueError(f"address: {refusal}")
        # As the runner reads them: an empty profile_path (the UI's empty field) is no profile there.
        # An empty scheduler is not the default one, there as here; backend takes no empty value.
        read = {"scheduler": self.scheduler, "profile_path": self.profile_path or None, "backend": self.backend}
        given = [name for name, value in read.items() if value != _POOL_DEFAULTS[name]]
        if given:
            verb = "configure" if len(given) > 1 else "configures"
            raise ValueError(
                f"{', '.join(given)} {verb} an embedded pool; the pool service at {self.address} has its own "
                "(esg-prefect pool serve --scheduler, --profile): leave the address empty or these at their defaults"
            )
        return self


_POOL_DEFAULTS = {name: field.default for name, field in ESGPool.model_fields.items()}
"""ESGPool's defaults: the embedded pool's options left as they are beside an address."""


class ESGPriceSheet(Block):
    """Prices of a vCPU and of each GPU type, per hour or per second, for cost planning and records.

    Examples:
        Load a saved price sheet:
        ```python
        from esg_prefect.integration.blocks import ESGPriceSheet
        prices = ESGPriceSheet.load("BLOCK_NAME")
        ```
    """

    _block_type_name: ClassVar[str] = "ESG Price Sheet"
    _logo_url: ClassVar[Any] = _LOGO
    _documentation_url: ClassVar[Any] = _DOCS

    unit: Literal["per_hour", "per_second"] = Field(default="per_hour", description="Unit of the prices below.")
    vcpu: float = Field(default=0.04, ge=0, description="Price of one vCPU in the unit above.")
    gpu: dict[str, float] = Field(
        default_factory=lambda: {"T4": 0.35, "V100": 2.48, "A10": 1.00, "A100": 3.67, "H100": 6.98, "H200": 10.60},
        description="Price of one whole GPU of each type in the unit above.",
    )

    model_config = _VALIDATED
    __setattr__ = _assign_or_keep
    _known_names = _KNOWN_NAMES

    @model_validator(mode="after")
    def _check_prices(self) -> ESGPriceSheet:
        """Refuse a price the model's :class:`PriceSheet` refuses (a negative, NaN or infinite one), naming it."""
        _refused(self.to_price_sheet)
        return self

    def to_price_sheet(self) -> PriceSheet:
        """The model's :class:`PriceSheet` (per second)."""
        if self.unit == "per_hour":
            return PriceSheet.from_hourly(self.vcpu, self.gpu)
        return PriceSheet(self.vcpu, dict(self.gpu))


_DEFAULTS = ESGSettings().to_dict()


def _knob(name: str) -> Any:
    """ESGSettings' default of ``name``: the block writes no default of its own."""
    return _DEFAULTS[name]


class ESGSchedulerSettings(Block):
    """Every ESG knob, with ESGSettings' defaults (docs/settings.md says what each decides).

    Examples:
        Load saved settings:
        ```python
        from esg_prefect.integration.blocks import ESGSchedulerSettings
        settings = ESGSchedulerSettings.load("BLOCK_NAME")
        ```
    """

    _block_type_name: ClassVar[str] = "ESG Scheduler Settings"
    _logo_url: ClassVar[Any] = _LOGO
    _documentation_url: ClassVar[Any] = _DOCS

    batches: list[int] = Field(default=_knob("config_space")["batches"], description="Candidate batch sizes.")
    vcpus: list[int] = Field(default=_knob("config_space")["vcpus"], description="Candidate vCPU counts.")
    gpu_shares: list[float] = Field(
        default=_knob("config_space")["gpu_shares"], description="Candidate GPU shares (0 = CPU)."
    )
    tick_ms: float = Field(default=_knob("tick_ms"), gt=0, description="Period of the controller's timer round.")
    max_expansions: int = Field(default=_knob("max_expansions"), ge=1, description="A* expansion budget per decision.")
    time_budget_ms: float = Field(default=_knob("time_budget_ms"), gt=0, description="A* time budget per decision.")
    latency_blade: bool = Field(
        default=_knob("latency_blade"), description="Prune plans that cannot finish within the slack."
    )
    cost_blade: bool = Field(
        default=_knob("cost_blade"), description="Prune plans that cannot beat the best complete plan."
    )
    heuristic: Literal["frontier", "min_cost"] = Field(default=_knob("heuristic"), description="A* heuristic.")
    search_horizon: Literal["segment", "workflow"] = Field(
        default=_knob("search_horizon"), description="Plan to the end of the SLO segment, or of the workflow."
    )
    percentile: Literal["p95", "mean"] = Field(
        default=_knob("percentile"), description="Profile statistic planned with."
    )
    wait_for_batch: bool = Field(
        default=_knob("wait_for_batch"), description="Hold a queue for a fuller batch while feasible."
    )
    max_batch_wait_ms: float = Field(
        default=_knob("max_batch_wait_ms"),
        ge=0,
        description="Longest a queue's oldest job is held for a fuller batch, in ms (0: bounded by the slack only).",
    )
    rate_ewma_alpha: float = Field(
        default=_knob("rate_ewma_alpha"), gt=0, le=1, description="Weight of the newest arrival gap."
    )
    infeasible_policy: Literal["best_effort", "reject"] = Field(
        default=_knob("infeasible_policy"), description="What to do when no plan meets the slack."
    )
    keep_alive_s: float = Field(default=_knob("keep_alive_s"), gt=0, description="How long idle warm workers are kept.")
    keep_alive_by_price: bool = Field(
        default=_knob("keep_alive_by_price"),
        description="Dearer GPU types keep idle workers for less: the cheapest type's price over theirs.",
    )
    keep_alive_policy: Literal["histogram", "fixed"] = Field(
        default=_knob("keep_alive_policy"),
        description="Keep idle workers for a percentile of their stage's measured idle gaps, or the fixed window.",
    )
    keep_alive_percentile: float = Field(
        default=_knob("keep_alive_percentile"), gt=0, le=100, description="Percentile of the gaps kept for."
    )
    keep_alive_percentile_waves: float = Field(
        default=_knob("keep_alive_percentile_waves"),
        gt=0,
        le=100,
        description="Percentile of the gaps kept for where a stage's calls come in waves.",
    )
    keep_alive_cold_starts: float = Field(
        default=_knob("keep_alive_cold_starts"),
        ge=0,
        description="The least keep-alive of the histogram policy, in cold starts of the worker's stage.",
    )
    best_effort_keep_alive: float = Field(
        default=_knob("best_effort_keep_alive"),
        ge=0,
        description="Keep a worker started for a best-effort dispatch this many cold starts once idle (0: off).",
    )
    scale_down_utilization: float = Field(
        default=_knob("scale_down_utilization"),
        ge=0,
        le=1,
        description="Keep the workers a stage's measured load needs at this utilisation; the rest expire "
        "after the keep-alive floor (0: off).",
    )
    scale_down_waves: float = Field(
        default=_knob("scale_down_waves"),
        ge=0,
        le=1,
        description="For a stage whose calls come in waves: keep the workers its load needs at this utilisation; "
        "the rest expire once idle for a lull (0: off).",
    )
    shed_after_slo: float = Field(
        default=_knob("shed_after_slo"),
        ge=0,
        description="Fail a request whose calls still wait this many times its SLO after it arrived "
        "(0: off; else at least 1).",
    )
    redistribute_slack: bool = Field(
        default=_knob("redistribute_slack"), description="Recompute later deadlines from real finish times."
    )
    cost_split: Literal["equal", "input_size"] = Field(
        default=_knob("cost_split"), description="Batch cost split among jobs."
    )
    idle_billing: Literal["attribute", "separate"] = Field(
        default=_knob("idle_billing"), description="Bill idle time to the runs served before it, or on its own line."
    )
    idle_vcpus: bool = Field(
        default=_knob("idle_vcpus"),
        description="Bill an idle worker's vCPUs too (a platform that holds them for a worker's life).",
    )
    allow_eviction: bool = Field(
        default=_knob("allow_eviction"), description="Stop idle workers of other stages to make room."
    )
    reserve_overhead: bool = Field(
        default=_knob("reserve_overhead"),
        description="Plan jobs to leave the caller's measured time between stages free.",
    )
    correction_alpha: float = Field(
        default=_knob("correction_alpha"),
        ge=0,
        le=1,
        description="Weight of the newest batch in the online profile correction; 0: off.",
    )
    best_effort_tolerance: float = Field(
        default=_knob("best_effort_tolerance"),
        ge=0,
        description="Best effort takes the cheapest option at most this fraction slower than the fastest; 0: fastest.",
    )
    wait_for_busy_warm: bool = Field(
        default=_knob("wait_for_busy_warm"),
        description="Best effort waits for a busy warm worker rather than evict idle ones to start one.",
    )
    idle_aware: bool = Field(
        default=_knob("idle_aware"),
        description="Price the idle time an option causes, not only its busy time (the whole bill).",
    )
    wait_for_taken: float = Field(
        default=_knob("wait_for_taken"),
        ge=0,
        le=1,
        description="A planned cold start waits for a worker the round took that runs the batch within this "
        "fraction of the cold option's latency; 0: off.",
    )
    consolidate_slack: float = Field(
        default=_knob("consolidate_slack"),
        ge=0,
        le=1,
        description="A queue waits for a busy, no dearer worker of its stage ending within this fraction of its slack "
        "rather than use a surplus idle one; 0: off.",
    )
    consolidate_idle_ms: float = Field(
        default=_knob("consolidate_idle_ms"),
        ge=0,
        description="How long (ms) an idle worker must have idled to count as surplus for consolidate_slack.",
    )
    share_batches: bool = Field(
        default=_knob("share_batches"),
        description="A batch takes on waiting calls of the same stage from other workflows' queues "
        "(in stages packing does not re-size).",
    )
    prewarm: bool = Field(
        default=_knob("prewarm"),
        description="Start a cheaper worker off the requests' path when a queue is served by an overpriced warm one.",
    )
    prewarm_saving: float = Field(
        default=_knob("prewarm_saving"),
        gt=0,
        lt=1,
        description="Least relative saving per job that justifies a pre-warm start.",
    )
    stage_plan: bool = Field(
        default=_knob("stage_plan"),
        description="Hold a steady stage's worker starts to one kind and a count sized to its measured rate.",
    )
    stage_plan_utilization: float = Field(
        default=_knob("stage_plan_utilization"),
        gt=0,
        le=1,
        description="Utilisation a stage's planned workers are sized for.",
    )
    stage_plan_gate: float = Field(
        default=_knob("stage_plan_gate"),
        gt=1,
        description="A stage is held only while its peak 1 s call count over 30 s is within this multiple of its mean.",
    )
    stage_plan_drain: int = Field(
        default=_knob("stage_plan_drain"),
        ge=0,
        description="A held stage at a count of at least this many workers serves only on its plan's kind (0: off).",
    )
    stage_plan_retire: float = Field(
        default=_knob("stage_plan_retire"),
        ge=0,
        le=1,
        description="A held stage stops its surplus idle workers while its plan's carry its peak rate at this load.",
    )
    stage_plan_retire_spares: int = Field(
        default=_knob("stage_plan_retire_spares"),
        ge=0,
        description="Of the workers stage_plan_retire would stop, keep this many of the cheapest as spares.",
    )
    stage_plan_retire_clump: bool = Field(
        default=_knob("stage_plan_retire_clump"),
        description="Retire a held stage's surplus only while its count and spares serve its 100 ms clump in time.",
    )
    stage_plan_retire_cheap_spare: float = Field(
        default=_knob("stage_plan_retire_cheap_spare"),
        ge=0,
        le=1,
        description="Keep or start a held stage's cheapest spare, one that runs a call in this part of its budget.",
    )
    lookahead_starts: bool = Field(
        default=_knob("lookahead_starts"),
        description="Start a next stage's worker as a batch goes out, where its calls come in waves and none is idle.",
    )
    size_aware: bool = Field(
        default=_knob("size_aware"),
        description="Cypress: pack batches by their items' predicted time where the profile has a size model.",
    )
    hardware_selection: bool = Field(
        default=_knob("hardware_selection"),
        description="PALDIA: each stage uses the cheapest hardware type whose pool carries its arrival rate in time.",
    )
    hardware_utilization: float = Field(
        default=_knob("hardware_utilization"),
        gt=0,
        le=1,
        description="Fraction of a hardware pool's throughput the selector plans to use.",
    )
    hybrid_sharing: bool = Field(
        default=_knob("hybrid_sharing"),
        description="PALDIA: co-run beside busy tenants (paying the slowdown) or wait for them, the cheaper in time.",
    )
    corun_table: str = Field(
        default=_knob("corun_table"), description="Co-run table for hybrid sharing: 'default' (shipped) or a CSV path."
    )

    model_config = _VALIDATED
    __setattr__ = _assign_or_keep
    _known_names = _KNOWN_NAMES

    @model_validator(mode="after")
    def _check_settings(self) -> ESGSchedulerSettings:
        """Refuse what :class:`ESGSettings` refuses (:meth:`to_settings`), and a co-run table that cannot be read.

        The table is read as the pool reads it (``corun_model``), and only when the pool
        would: with hybrid sharing on. A block is validated again each time it is loaded, on
        the machine that loads it, and a path saved elsewhere must not stop a pool that never
        reads it.
        """
        _refused(self.to_settings)
        if self.hybrid_sharing:
            _refused(lambda: corun_model(self.corun_table))
        return self

    def to_settings(self) -> ESGSettings:
        """The scheduler's :class:`ESGSettings` (validated there, with errors naming the bad value)."""
        data = self.model_dump(exclude={"batches", "vcpus", "gpu_shares", "block_type_slug"})
        data = {k: v for k, v in data.items() if k in ESGSettings.__dataclass_fields__}
        space = ConfigSpace(tuple(self.batches), tuple(self.vcpus), tuple(self.gpu_shares))
        return ESGSettings(config_space=space, **data)
