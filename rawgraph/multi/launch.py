"""One process per GPU: the launcher, the rank environment, the rendezvous, the watchdog.

``python -m rawgraph.multi --nproc N [options] script.py args...`` (or ``-m module args...``)
starts ``N`` copies of the script, one per GPU, each with

- ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` (the names torchrun sets, so a
  script written for torchrun runs unchanged, and one written for this launcher runs under
  torchrun: :meth:`RankEnv.from_environ` reads either);
- ``RAWGRAPH_DEVICE``: the device ordinal to use (the local rank; or 0 with ``--isolate``, which
  also sets ``CUDA_VISIBLE_DEVICES`` to the one GPU). All GPUs stay visible by default because a
  CUDA IPC mapping of a peer's memory (the custom all-reduce) needs the peer GPU in the process;
- ``RAWGRAPH_RENDEZVOUS``: a private folder the parent makes (mode 0700) and removes at the end,
  through which the ranks pass small byte strings: the NCCL unique id (rank 0 makes it with
  ``ncclGetUniqueId`` and publishes it; the others read it), the custom all-reduce's IPC handles,
  barriers. Files, written to a temporary name and renamed into place, so a reader never sees a
  partial id. Only one host: that is all this library needs (NCCL's graph guide advises one GPU
  per process; across hosts, use torchrun's store instead);
- ``RAWGRAPH_HEARTBEAT``: a file the rank touches with :func:`heartbeat` (e.g. every 100 replays).

The parent is a watchdog. It polls the children; the first that exits non-zero, dies of a
signal, stops beating for ``--stall-timeout`` seconds after its first beat, or outlives
``--timeout`` makes it stop every other rank (``SIGTERM`` to each rank's process group, then
``SIGKILL`` after ``--grace`` seconds) and exit non-zero with a line naming the rank. A rank
blocked in a collective whose peer died never returns on its own: without this, a dead rank
leaves the others hung forever. Exit code: the failing rank's code, 128 + signal for a signal,
124 for a timeout or a stall, 0 when every rank exits 0.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ..runtime.errors import RawgraphError

RENDEZVOUS_ENV = "RAWGRAPH_RENDEZVOUS"
DEVICE_ENV = "RAWGRAPH_DEVICE"
HEARTBEAT_ENV = "RAWGRAPH_HEARTBEAT"
TIMEOUT_EXIT = 124


class LaunchError(RawgraphError, ValueError):
    """The launcher's arguments or a rank's environment are wrong (refused before anything starts)."""


class RendezvousError(RawgraphError, TimeoutError):
    """A rank waited too long for another rank's message or barrier (that rank died or stalled)."""


class RankFailedError(RawgraphError, RuntimeError):
    """A rank exited non-zero, died of a signal, stalled, or ran past the timeout.

    Attributes
    ----------
    rank : int
    returncode : int
        What the launcher exits with (the rank's code, 128 + signal, or 124).
    reason : str
    """

    def __init__(self, rank: int, returncode: int, reason: str):
        super().__init__(f"rank {rank} {reason}")
        self.rank = rank
        self.returncode = returncode
        self.reason = reason


def _int_env(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise LaunchError(f"${name} must be an integer, got {raw!r}") from None


@dataclass(frozen=True)
class RankEnv:
    """Who this process is: read from the environment the launcher (or torchrun) set.

    Attributes
    ----------
    rank, world, local_rank : int
    device : int
        The device ordinal to open (``$RAWGRAPH_DEVICE``, else ``$LOCAL_RANK``).
    rendezvous : Path or None
        The folder ranks exchange bytes through (None: a one-rank run needs none).
    heartbeat : Path or None
    """

    rank: int
    world: int
    local_rank: int
    device: int
    rendezvous: Path | None
    heartbeat: Path | None

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> "RankEnv":
        """Validate ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (torchrun's names) and rawgraph's own.

        None of them set: one rank (rank 0 of 1 on device 0). Under torchrun without
        ``$RAWGRAPH_RENDEZVOUS`` the folder is derived from ``MASTER_PORT`` and
        ``TORCHELASTIC_RUN_ID`` under the temporary folder (one host).

        Raises
        ------
        LaunchError
            Non-integer values, a rank outside ``[0, WORLD_SIZE)``, ``WORLD_SIZE`` > 1 with no way
            to rendezvous, or a missing rendezvous folder.
        """
        env = os.environ if env is None else env
        rank, world, local = _int_env(env, "RANK"), _int_env(env, "WORLD_SIZE"), _int_env(env, "LOCAL_RANK")
        if rank is None and world is None:
            rank, world = 0, 1
        elif rank is None or world is None:
            raise LaunchError("set both $RANK and $WORLD_SIZE (or neither, for one rank)")
        if world < 1:
            raise LaunchError(f"$WORLD_SIZE must be >= 1, got {world}")
        if not 0 <= rank < world:
            raise LaunchError(f"$RANK {rank} is outside [0, {world})")
        local = rank if local is None else local
        if local < 0:
            raise LaunchError(f"$LOCAL_RANK must be >= 0, got {local}")
        device = _int_env(env, DEVICE_ENV)
        device = local if device is None else device
        if device < 0:
            raise LaunchError(f"${DEVICE_ENV} must be >= 0, got {device}")
        rdzv_raw = env.get(RENDEZVOUS_ENV)
        rdzv: Path | None
        if rdzv_raw:
            rdzv = Path(rdzv_raw)
            if not rdzv.is_dir():
                raise LaunchError(f"${RENDEZVOUS_ENV} {rdzv_raw!r} is not a folder")
        elif world > 1 and env.get("MASTER_PORT"):
            run_id = env.get("TORCHELASTIC_RUN_ID", "none")
            rdzv = Path(tempfile.gettempdir()) / f"rawgraph-rdzv-{env['MASTER_PORT']}-{run_id}"
            rdzv.mkdir(mode=0o700, exist_ok=True)
        elif world > 1:
            raise LaunchError(f"WORLD_SIZE {world} but no ${RENDEZVOUS_ENV} (or torchrun's $MASTER_PORT): "
                              f"start the ranks with python -m rawgraph.multi --nproc {world} ...")
        else:
            rdzv = None
        hb = env.get(HEARTBEAT_ENV)
        return cls(rank, world, local, device, rdzv, Path(hb) if hb else None)

    def rendezvous_for(self, timeout: float = 120.0) -> "Rendezvous":
        if self.rendezvous is None:
            raise LaunchError("this rank has no rendezvous folder (one rank needs none)")
        return Rendezvous(self.rendezvous, self.rank, self.world, timeout)


class Rendezvous:
    """Byte strings and barriers between the ranks of one launch, through a shared folder.

    ``publish(key, data)`` writes ``key.<rank>`` atomically (a temporary name, then
    ``os.replace``); ``fetch(key, rank)`` polls for it until ``timeout`` seconds pass
    (:class:`RendezvousError` naming the rank that never wrote). Keys are single-use: each call
    site names its own (``"nccl_id"``, ``"ipc.0"``).
    """

    def __init__(self, path: str | Path, rank: int, world: int, timeout: float = 120.0):
        self.path = Path(path)
        self.rank, self.world, self.timeout = int(rank), int(world), float(timeout)
        self._barriers = 0

    def _file(self, key: str, rank: int) -> Path:
        if not key or "/" in key or key.startswith("."):
            raise LaunchError(f"bad rendezvous key {key!r}")
        return self.path / f"{key}.{rank}"

    def publish(self, key: str, data: bytes) -> None:
        final = self._file(key, self.rank)
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        tmp.write_bytes(bytes(data))
        os.replace(tmp, final)

    def fetch(self, key: str, rank: int, timeout: float | None = None) -> bytes:
        path = self._file(key, rank)
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        delay = 0.001
        while True:
            try:
                return path.read_bytes()
            except FileNotFoundError:
                pass
            if time.monotonic() > deadline:
                raise RendezvousError(f"rank {self.rank} waited {self.timeout if timeout is None else timeout:.0f} s "
                                      f"for {key!r} from rank {rank}: it never came (that rank died or stalled)")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def broadcast(self, key: str, data: bytes | None, root: int = 0) -> bytes:
        """``data`` from ``root`` to every rank (``data`` is ignored elsewhere)."""
        if self.rank == root:
            if data is None:
                raise LaunchError("the root of a broadcast must give the data")
            self.publish(key, data)
            return bytes(data)
        return self.fetch(key, root)

    def all_gather(self, key: str, data: bytes) -> list[bytes]:
        """Every rank's ``data``, in rank order."""
        self.publish(key, data)
        return [bytes(data) if r == self.rank else self.fetch(key, r) for r in range(self.world)]

    def barrier(self, name: str = "barrier", timeout: float | None = None) -> None:
        """Wait until every rank reached the barrier with this name (numbered per call)."""
        self._barriers += 1
        key = f"{name}-{self._barriers}"
        self.publish(key, b"1")
        for r in range(self.world):
            if r != self.rank:
                self.fetch(key, r, timeout)


def heartbeat(env: RankEnv | None = None) -> None:
    """Tell the launcher's watchdog this rank still makes progress (touch ``$RAWGRAPH_HEARTBEAT``).
    Cheap (one ``utime``); nothing when not launched by rawgraph.multi."""
    path = env.heartbeat if env is not None else (Path(os.environ[HEARTBEAT_ENV]) if os.environ.get(HEARTBEAT_ENV) else None)
    if path is None:
        return
    try:
        os.utime(path)
    except FileNotFoundError:
        path.touch()


# ------------------------------------------------------------------------------------ launcher
def _positive(name: str, value: float) -> float:
    if not value > 0:
        raise LaunchError(f"{name} must be > 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m rawgraph.multi",
        description="Start one process per GPU (RANK, WORLD_SIZE, LOCAL_RANK, RAWGRAPH_DEVICE, RAWGRAPH_RENDEZVOUS set) "
                    "and watch them: the first rank that fails, stalls or times out stops the rest.")
    p.add_argument("--nproc", "--nproc-per-node", dest="nproc", type=int, required=True, help="processes (one per GPU)")
    p.add_argument("--devices", default=None, help="comma-separated device ordinals, one per rank (default 0..nproc-1)")
    p.add_argument("--isolate", action="store_true",
                   help="set CUDA_VISIBLE_DEVICES to the rank's one GPU (then RAWGRAPH_DEVICE=0); breaks CUDA IPC between ranks")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds the whole run may take (default 1800)")
    p.add_argument("--stall-timeout", type=float, default=None,
                   help="seconds a rank may go without a heartbeat after its first one (default: no stall check)")
    p.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL when stopping ranks")
    p.add_argument("-m", dest="module", action="store_true", help="the first argument is a module, run with python -m")
    p.add_argument("target", help="script.py (or a module with -m)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to every rank")
    return p


@dataclass
class _Rank:
    rank: int
    proc: subprocess.Popen
    heartbeat: Path


def _stop(ranks: Sequence[_Rank], grace: float) -> list[int]:
    """SIGTERM each live rank's process group, then SIGKILL what is left after ``grace`` s; the
    ranks that had to be stopped."""
    live = [r for r in ranks if r.proc.poll() is None]
    for r in live:
        try:
            os.killpg(r.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    for r in live:
        try:
            r.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(r.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            r.proc.wait()
    return [r.rank for r in live]


def launch(target: str, args: Sequence[str] = (), nproc: int = 1, devices: Sequence[int] | None = None,
           module: bool = False, isolate: bool = False, timeout: float = 1800.0, stall_timeout: float | None = None,
           grace: float = 5.0, env: Mapping[str, str] | None = None, poll: float = 0.05) -> int:
    """Run ``nproc`` ranks of ``target`` and watch them (see the module docstring).

    Returns 0 when every rank exited 0.

    Raises
    ------
    LaunchError
        Bad arguments (before any process starts).
    RankFailedError
        The first rank that failed, stalled or timed out (the others already stopped).
    """
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise LaunchError(f"--nproc must be an integer >= 1, got {nproc!r}")
    _positive("--timeout", timeout)
    _positive("--grace", grace)
    if stall_timeout is not None:
        _positive("--stall-timeout", stall_timeout)
    devs = list(range(nproc)) if devices is None else [int(d) for d in devices]
    if len(devs) != nproc:
        raise LaunchError(f"--devices names {len(devs)} device(s) for {nproc} rank(s)")
    if len(set(devs)) != len(devs) or min(devs) < 0:
        raise LaunchError(f"--devices must be distinct ordinals >= 0, got {devs} (NCCL needs one GPU per rank)")
    if not module and not Path(target).is_file():
        raise LaunchError(f"no such script: {target!r} (use -m for a module)")
    base = dict(os.environ if env is None else env)
    rdzv = Path(tempfile.mkdtemp(prefix="rawgraph-rdzv-"))
    ranks: list[_Rank] = []
    try:
        for r, dev in enumerate(devs):
            child = dict(base)
            hb = rdzv / f".heartbeat.{r}"
            child.update({"RANK": str(r), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(r),
                          "LOCAL_WORLD_SIZE": str(nproc), RENDEZVOUS_ENV: str(rdzv), HEARTBEAT_ENV: str(hb),
                          DEVICE_ENV: "0" if isolate else str(dev)})
            if isolate:
                child["CUDA_VISIBLE_DEVICES"] = str(dev)
            cmd = [sys.executable, *(["-m", target] if module else [target]), *args]
            # Its own session: stopping a rank stops whatever it started too.
            ranks.append(_Rank(r, subprocess.Popen(cmd, env=child, start_new_session=True), hb))
        return _watch(ranks, timeout, stall_timeout, grace, poll)
    finally:
        _stop(ranks, grace)
        shutil.rmtree(rdzv, ignore_errors=True)


def _watch(ranks: list[_Rank], timeout: float, stall_timeout: float | None, grace: float, poll: float) -> int:
    start = time.monotonic()
    while True:
        running = 0
        for r in ranks:
            code = r.proc.poll()
            if code is None:
                running += 1
            elif code != 0:
                why = f"died of signal {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
                rc = 128 - code if code < 0 else code
                raise RankFailedError(r.rank, rc, f"(pid {r.proc.pid}) {why}; stopped ranks {_stop(ranks, grace)}")
        if not running:
            return 0
        now = time.monotonic()
        if now - start > timeout:
            late = [r.rank for r in ranks if r.proc.poll() is None]
            raise RankFailedError(late[0], TIMEOUT_EXIT,
                                  f"still running after --timeout {timeout:g} s (ranks {late} unfinished); "
                                  f"stopped ranks {_stop(ranks, grace)}")
        if stall_timeout is not None:
            for r in ranks:
                try:
                    beat = r.heartbeat.stat().st_mtime
                except FileNotFoundError:
                    continue  # not started beating yet: only --timeout applies
                if r.proc.poll() is None and time.time() - beat > stall_timeout:
                    raise RankFailedError(r.rank, TIMEOUT_EXIT,
                                          f"(pid {r.proc.pid}) stalled: no heartbeat for {stall_timeout:g} s; "
                                          f"stopped ranks {_stop(ranks, grace)}")
        time.sleep(poll)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; prints the failing rank on stderr and returns the exit code."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        devices = None if ns.devices is None else [int(d) for d in ns.devices.split(",") if d.strip()]
    except ValueError:
        print(f"rawgraph.multi: --devices must be comma-separated integers, got {ns.devices!r}", file=sys.stderr)
        return 2
    args = list(ns.args)
    if args and args[0] == "--":
        args = args[1:]
    try:
        return launch(ns.target, args, ns.nproc, devices, ns.module, ns.isolate, ns.timeout, ns.stall_timeout, ns.grace)
    except LaunchError as exc:
        print(f"rawgraph.multi: {exc}", file=sys.stderr)
        return 2
    except RankFailedError as exc:
        print(f"rawgraph.multi: {exc}", file=sys.stderr)
        return exc.returncode or 1
    except KeyboardInterrupt:
        print("rawgraph.multi: interrupted; every rank stopped", file=sys.stderr)
        return 130
