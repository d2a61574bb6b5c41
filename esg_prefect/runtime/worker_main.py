"""The body of a local worker process.

A worker starts as a *spare*: a process that has already imported torch (the
slow part of a Python cold start) and waits for a stage. When the pool assigns
it one, it applies its resources (threads = vCPUs; GPU pinning, MPS share and
memory fraction), loads the model (the cold start the profile measures), then
serves batches until told to stop. Messages travel on a pipe to the parent
that spawned it, which is trusted: it is this process's own parent, never the
network.

Messages travel as plain pickles (:func:`send` / :func:`recv`), not through
multiprocessing's own pickler: with torch imported, that one moves every tensor
through a shared-memory file descriptor that the receiver fetches from a helper
thread of the sender, a handshake that waits for the sender's GIL. In the pool's
process, shared with tens of flow-run threads, that made a 600 KB tensor's trip
take 100-300 ms under load. Here tensors travel as numpy buffers inside the
pickle (one copy each way, about 1 ms per MB).

Messages (parent -> worker): ``("load", stage_path, vcpus, gpu_share, device)``,
``("run", batch_id, items)``, ``("stop",)``. Replies: ``("spare",)``,
``("ready", load_ms, enforcement, lines)``, ``("load_error", type, message, traceback)``,
``("ok", batch_id, outputs, elapsed_ms, lines)``, ``("error", batch_id, type, message, traceback, lines)``,
``lines`` being what the batch printed or logged (:mod:`~esg_prefect.runtime.batch_output`).
"""

from __future__ import annotations

import io
import os
import pickle
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any


class _Pickler(pickle.Pickler):
    """A pickler that sends CPU tensors as numpy arrays (raw buffers), never as shared-memory handles."""

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if (
            torch is not None
            and type(obj) is torch.Tensor
            and obj.device.type == "cpu"
            and not obj.requires_grad
            and obj.dtype in _NUMPY_DTYPES
        ):
            return _tensor_from_numpy, (obj.detach().numpy(),)
        return NotImplemented


_NUMPY_DTYPES: set[Any] = set()


def _init_dtypes() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and not _NUMPY_DTYPES:
        _NUMPY_DTYPES.update(
            {torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.int16}
            | {torch.int8, torch.uint8, torch.bool, torch.complex64}
        )


def _tensor_from_numpy(array: Any) -> Any:
    import torch

    return torch.from_numpy(array)


def dumps(obj: Any) -> bytes:
    """Pickle ``obj`` for the pipe between the pool and a worker (tensors as raw buffers)."""
    _init_dtypes()
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def send(conn: Connection, obj: Any) -> None:
    """Send one message on a pool-worker pipe."""
    conn.send_bytes(dumps(obj))


def recv(conn: Connection) -> Any:
    """Receive one message from a pool-worker pipe (both ends are this package's own processes)."""
    return pickle.loads(conn.recv_bytes())


def _apply_resources(vcpus: int, gpu_share: float, device: str) -> str:
    import torch

    torch.set_num_threads(vcpus)
    if device == "cpu":
        return f"cpu: {vcpus} thread(s)"
    parts = ["CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "")]
    if "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in os.environ:
        parts.append("MPS active threads " + os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] + "%")
    else:
        parts.append("compute share logical (no MPS daemon: time-sliced)")
    if torch.cuda.is_available() and 0 < gpu_share < 1:
        torch.cuda.set_per_process_memory_fraction(gpu_share, 0)
        parts.append(f"memory fraction {gpu_share:.2f}")
    return "; ".join(parts)


POOL_PID_ENV = "ESG_PREFECT_POOL_PID"  # set by the backend: the process whose pool this worker serves


def _exit_with_pool(pool_pid: int | None, every_s: float = 1.0) -> None:
    """Exit when the pool's process goes (killed with SIGKILL, say): an orphan would run its batch to the end,
    holding its share of the GPU, which a restarted pool plans as free. A daemon thread watches that pid (the
    worker's parent is the fork server, which outlives a killed pool)."""
    if pool_pid is None:
        return

    def watch() -> None:
        while True:
            time.sleep(every_s)
            try:
                os.kill(pool_pid, 0)
            except ProcessLookupError:
                os._exit(0)
            except PermissionError:  # alive, another user's (the pid was reused): keep serving
                pass

    threading.Thread(target=watch, name="esg-worker-orphan-watch", daemon=True).start()


def worker_main(conn: Connection, preload: tuple[str, ...], env: dict[str, str]) -> None:
    """Entry point of a spawned worker process; ``env`` is applied before CUDA can initialise."""
    import importlib

    os.environ.update(env)
    _exit_with_pool(int(env[POOL_PID_ENV]) if env.get(POOL_PID_ENV) else None)
    for mod in preload:
        importlib.import_module(mod)
    try:
        import torch

        torch.set_num_interop_threads(1)
    except (ImportError, RuntimeError):
        pass
    send(conn, ("spare",))
    try:
        msg = recv(conn)
    except EOFError:
        return
    if msg[0] != "load":
        return
    _, stage_path, vcpus, gpu_share, device = msg
    from esg_prefect.runtime.batch_output import run_caught, with_output
    from esg_prefect.runtime.stages import resolve_stage, run_checked

    def load() -> tuple[str, Any, Any]:
        enforcement = _apply_resources(vcpus, gpu_share, device)
        spec = resolve_stage(stage_path)
        return enforcement, spec, spec.load(device)

    t0 = time.perf_counter()
    got = run_caught(load)  # any load failure goes to the pool, which fails the calls clearly
    if (failed := got.failed) is not None:
        kind, message, trace = failed
        send(conn, ("load_error", kind, message, with_output(trace, got.lines, "the model load")))
        return
    enforcement, spec, model = got.value
    send(conn, ("ready", (time.perf_counter() - t0) * 1000.0, enforcement, got.lines))
    _serve(conn, spec, model, run_checked)


def compact(obj: Any) -> Any:
    """Outputs with every tensor owning just its own data.

    A batch function often returns views into one batched tensor (``list(out)``);
    torch's own pickling of a view (Ray's object store) sends the whole batch's
    storage with every item. Cloning the views first keeps what crosses to each
    item's size. The local pipe does not need it (:func:`dumps`).
    """
    try:
        import torch
    except ImportError:  # no torch: nothing to compact
        return obj
    if isinstance(obj, torch.Tensor):
        if obj.untyped_storage().nbytes() > obj.numel() * obj.element_size():
            return obj.clone()
        return obj
    if isinstance(obj, dict):
        return {k: compact(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [compact(v) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    return obj


def _serve(conn: Connection, spec: Any, model: Any, run_checked: Any) -> None:
    try:
        _serve_batches(conn, spec, model, run_checked)
    except (BrokenPipeError, ConnectionResetError):  # the pool went away while a batch ran: nothing to answer
        return


def _serve_batches(conn: Connection, spec: Any, model: Any, run_checked: Any) -> None:
    from esg_prefect.runtime.batch_output import run_caught

    while True:
        try:
            msg = recv(conn)
        except EOFError:
            return
        if msg[0] == "stop":
            return
        _, batch_id, items = msg
        t0 = time.perf_counter()
        got = run_caught(run_checked, spec, model, items)  # the batch function's own error: reported
        lines = got.lines
        if (failed := got.failed) is not None:
            send(conn, ("error", batch_id, *failed, lines))
            continue
        # No compact() here: dumps() sends each tensor as a numpy array, which pickles only its own data.
        try:
            reply = dumps(("ok", batch_id, got.value, (time.perf_counter() - t0) * 1000.0, lines))
        except Exception as exc:  # outputs that cannot travel back (a lock, a lambda): the batch fails, not the worker
            why = f"the stage's outputs cannot be sent back to the pool (they must pickle): {exc}"
            send(conn, ("error", batch_id, type(exc).__qualname__, why, traceback.format_exc(), lines))
            continue
        conn.send_bytes(reply)
