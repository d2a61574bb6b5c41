"""Which code each stage of a pool runs, so that a worker only ever serves calls of its own code.

The scheduler matches warm workers to queues by stage name, and plans a stage
with the profile of that name: workflows that share a stage (the same name and
the same import path) share its workers, which is what consolidation wants.
Two *different* codes must never share a name there, or one workflow's calls
run the other's model. :class:`StageBindings` gives every (workflow, stage)
the pool's name for it:

* the stage's own name, when no other code holds that name in the pool;
* ``"<stage>@<workflow>"`` when another workflow's stage of that name runs
  other code (two pipelines that each have a ``classify`` stage): planned with
  the profile of ``<stage>``, served by workers of its own.

Within one workflow a stage name means one code: a call that names another
import path for it is refused with :class:`~esg_prefect.exceptions.CallConflictError`.
"""

from __future__ import annotations

from dataclasses import dataclass

from esg_prefect.exceptions import CallConflictError


@dataclass(frozen=True, slots=True)
class Binding:
    """The pool's name for one (workflow, stage) and the code it runs.

    Attributes:
        name: the name the scheduler, queues and workers use.
        stage: the name the workflow declares.
        path: the stage's import path.
        new: whether this call binds it for the first time (the pool then commits it).
    """

    name: str
    stage: str
    path: str
    new: bool

    @property
    def aliased(self) -> bool:
        """Whether the pool's name differs from the stage's declared name."""
        return self.name != self.stage


class StageBindings:
    """Stage names to import paths, per workflow and pool-wide."""

    def __init__(self) -> None:
        self._path_of: dict[str, str] = {}  # the pool's stage name -> import path
        self._name_of: dict[tuple[str, str], str] = {}  # (workflow, declared stage) -> the pool's name

    def path_of(self, name: str) -> str | None:
        """The import path bound to the pool's stage ``name``, in any workflow (None before its first call)."""
        return self._path_of.get(name)

    def resolve(self, workflow: str, stage: str, path: str) -> Binding:
        """The binding of a call's stage, without recording it (see :meth:`commit`).

        Raises:
            CallConflictError: the workflow's stage of that name runs another path.
        """
        name = self._name_of.get((workflow, stage))
        if name is not None:
            bound = self._path_of[name]
            if bound != path:
                raise CallConflictError(
                    f"stage {stage!r} of workflow {workflow!r} runs {bound!r}; this call names {path!r} "
                    "(one stage name, one code per workflow: rename one of them)"
                )
            return Binding(name, stage, path, False)
        name = stage
        n = 1
        while self._path_of.get(name, path) != path:  # taken by other code: a name of its own
            name = f"{stage}@{workflow}" if n == 1 else f"{stage}@{workflow}#{n}"
            n += 1
        return Binding(name, stage, path, True)

    def commit(self, workflow: str, binding: Binding) -> None:
        """Record a binding :meth:`resolve` returned as new."""
        self._name_of[(workflow, binding.stage)] = binding.name
        self._path_of[binding.name] = binding.path
