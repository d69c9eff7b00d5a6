"""One process per GPU: the launcher, the rank environment, the rendezvous, the watchdog.

``python -m rawgraph.multi --nproc N [options] script.py args...`` (or ``-m module args...``)
starts ``N`` copies of the script, one per GPU, each with

- ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` (the names torchrun sets, so a
  script written for torchrun runs unchanged, and one written for this launcher runs under
  torchrun: :meth:`RankEnv.from_environ` reads either);
- ``RAWGRAPH_DEVICE``: the device ordinal to use (the local rank; or 0 with ``--isolate``, which
  also sets ``CUDA_VISIBLE_DEVICES`` to the one GPU). All GPUs stay visible by default because a
  CUDA IPC mapping of a peer's memory (the custom all-reduce) needs the peer GPU in the process;
- ``RAWGRAPH_RENDEZVOUS``: a private folder the parent makes fresh (``tempfile.mkdtemp``, mode
  0700) and removes at the end, through which the ranks pass small byte strings: the NCCL unique
  id (rank 0 makes it with ``ncclGetUniqueId`` and publishes it; the others read it), the custom
  all-reduce's IPC handles, barriers. Files, written to a temporary name and renamed into place,
  so a reader never sees a partial id. Only one host: that is all this library needs (NCCL's
  graph guide advises one GPU per process; across hosts, use torchrun's store instead);
- ``RAWGRAPH_RUN_ID``: a random id of this launch, written at the head of every published value;
  a reader skips a value with another run id, so a value left behind by another run is never read;
- ``RAWGRAPH_HEARTBEAT``: a file the rank touches with :func:`heartbeat` (e.g. every 100 replays).

What travels through the folder is a bootstrap address and handles that ``cuIpcOpenMemHandle``
maps, so nothing another local user could plant is trusted: a folder that is a symbolic link, is
owned by another uid, or is open to group or others is refused (:class:`LaunchError` naming it
and why), files are opened with ``O_NOFOLLOW`` and written through ``O_EXCL`` temporaries.

The parent is a watchdog. It polls the children; the first that exits non-zero, dies of a
signal, stops beating for ``--stall-timeout`` seconds after its first beat, or outlives
``--timeout`` makes it stop every other rank (``SIGTERM`` to each rank's process group, then
``SIGKILL`` after ``--grace`` seconds) and exit non-zero with a line naming the rank. A rank
blocked in a collective whose peer died never returns on its own: without this, a dead rank
leaves the others hung forever. ``SIGTERM`` or ``SIGINT`` sent to the parent (what Slurm,
Kubernetes, systemd and Ctrl-C send) goes on to every rank's process group the same way: the
ranks lead their own sessions, so nothing else reaches them. Exit code: the failing rank's code,
128 + signal for a rank that died of a signal or a signal the parent got, 124 for a timeout or
a stall, 0 when every rank exits 0.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..runtime.errors import RawgraphError

RENDEZVOUS_ENV = "RAWGRAPH_RENDEZVOUS"
RUN_ID_ENV = "RAWGRAPH_RUN_ID"
DEVICE_ENV = "RAWGRAPH_DEVICE"
HEARTBEAT_ENV = "RAWGRAPH_HEARTBEAT"
TIMEOUT_EXIT = 124

# What may name a run or a part of a folder's name: letters, digits, "_", "." and "-", starting
# with a letter or a digit (so never "", "." or ".."): nothing that leaves the folder it is put in.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class LaunchError(RawgraphError, ValueError):
    """The launcher's arguments or a rank's environment are wrong, or the rendezvous folder is not
    private to this user (refused before anything starts)."""


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


class LaunchInterrupted(RawgraphError):
    """The launcher got ``SIGTERM`` or ``SIGINT``: it sent that signal on to every rank's process
    group, stopped them, and removed the rendezvous folder.

    Attributes
    ----------
    signum : int
    returncode : int
        128 + ``signum``: what the launcher exits with.
    stopped : list of int
        The ranks that were still running.
    """

    returncode: int

    def __init__(self, signum: int, stopped: list[int]):
        super().__init__(f"got {_signal_text(signum)}: sent it to ranks {stopped} and stopped them")
        self.signum = signum
        self.returncode = 128 + signum
        self.stopped = stopped


def _signal_text(signum: int) -> str:
    """``signal 9 (SIGKILL)``; a real-time signal, which ``signal.Signals`` cannot name, as
    ``signal 35 (SIGRTMIN+1)``; a number with no name as ``signal n``."""
    try:
        return f"signal {signum} ({signal.Signals(signum).name})"
    except ValueError:
        pass
    rtmin, rtmax = getattr(signal, "SIGRTMIN", None), getattr(signal, "SIGRTMAX", None)
    if rtmin is not None and rtmax is not None and rtmin < signum < rtmax:
        return f"signal {signum} (SIGRTMIN+{signum - rtmin})"
    return f"signal {signum}"


def _int_env(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise LaunchError(f"${name} must be an integer, got {raw!r}") from None


def _name_env(env: Mapping[str, str], name: str) -> str | None:
    """``$name`` where it may name a run or part of a folder (:data:`_NAME`); None where unset."""
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    if not _NAME.fullmatch(raw):
        raise LaunchError(
            f"${name} must be 1-128 letters, digits, '_', '.' or '-', starting with a letter or a digit, got {raw!r}"
        )
    return raw


# ---------------------------------------------------------------------------- a private folder
def _unsafe(st: os.stat_result) -> str | None:
    """Why a folder with this ``os.lstat`` / ``os.fstat`` result may not carry a rendezvous, or None.

    Safe is a folder no other local user made or can change or read: not a symbolic link (whoever
    made the link chose where it leads), owned by this process's effective uid (``os.geteuid``:
    the owner of what this process makes), no permission bit for group or others (another user
    must neither plant a value nor read the NCCL id or an IPC handle)."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o077:
        return f"has mode {oct(stat.S_IMODE(st.st_mode))}: group or others may use it (it must be 0700)"
    return None


def _refused(what: str, path: Path, why: str) -> LaunchError:
    return LaunchError(f"{what} {str(path)!r} {why}; refused: the ranks take the NCCL id and CUDA IPC handles from it")


def _check_private(path: Path, what: str) -> None:
    """Refuse ``path`` unless :func:`_unsafe` finds nothing in its ``os.lstat`` (a symbolic link is
    judged itself, never followed). Raises :class:`LaunchError` naming the path and the reason."""
    try:
        why = _unsafe(os.lstat(path))
    except FileNotFoundError:
        why = "is not a folder (it does not exist)"
    if why:
        raise _refused(what, path, why)


def _torchrun_folder(env: Mapping[str, str], run: str) -> Path:
    """The folder every rank of a torchrun launch on this host derives alike, with no launcher of
    rawgraph's to make it: ``rdzv-<MASTER_PORT>-<run>`` in a per-user ``rawgraph-<euid>`` in the
    temporary folder. Each of the two is made with mode 0700 (``os.mkdir``) or, where it exists
    (a rank before this one made it, or another user did), checked with :func:`_check_private`."""
    port = env.get("MASTER_PORT", "")
    if not re.fullmatch(r"[0-9]{1,5}", port) or not 0 < int(port) < 65536:
        raise LaunchError(f"$MASTER_PORT must be a port number (1-65535), got {port!r}")
    base = Path(tempfile.gettempdir()) / f"rawgraph-{os.geteuid()}"
    folder = base / f"rdzv-{int(port)}-{run}"
    for path in (base, folder):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        _check_private(path, "rendezvous folder")
    return folder


def _start_time(pid: int) -> str:
    """When ``pid`` started, in clock ticks since boot: field 22 of ``/proc/<pid>/stat``, counted
    after the last ")" (the command name before it may hold spaces and parentheses); "0" without
    ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return "0"


def _torchrun_run_id(env: Mapping[str, str]) -> str:
    """One torchrun launch's run id, alike in its ranks and unlike any other launch's (the folder's
    name holds ``$TORCHELASTIC_RUN_ID`` already).

    torchrun's elastic agent starts every local rank as its own child, so the agent's pid
    (``os.getppid``) with its start time (which tells a reused pid apart) names the launch, and
    ``$TORCHELASTIC_RESTART_COUNT`` the attempt (a restarted rank must not read the NCCL id of the
    attempt before it). Where a wrapper process stands between the agent and the ranks, set
    ``$RAWGRAPH_RUN_ID`` to one value per launch instead."""
    agent = os.getppid()
    restart = _int_env(env, "TORCHELASTIC_RESTART_COUNT") or 0
    return f"torchrun.{restart}.{agent}.{_start_time(agent)}"


# ---------------------------------------------------------------------------- rank environment
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
    run_id : str or None
        Heads every value this rank publishes; a value headed by another is never read.
    ranks_remove_rendezvous : bool
        The folder was derived from torchrun's variables: no launcher removes it, so the last rank
        of the run to exit does (:meth:`Rendezvous.leave`).
    """

    rank: int
    world: int
    local_rank: int
    device: int
    rendezvous: Path | None
    heartbeat: Path | None
    run_id: str | None = None
    ranks_remove_rendezvous: bool = False

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> RankEnv:
        """Validate ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (torchrun's names) and rawgraph's own.

        None of them set: one rank (rank 0 of 1 on device 0). ``$RAWGRAPH_RENDEZVOUS`` needs
        ``$RAWGRAPH_RUN_ID`` with it (the launcher sets both). Under torchrun without them the
        folder is derived from ``MASTER_PORT`` and ``TORCHELASTIC_RUN_ID`` (see
        :func:`_torchrun_folder`) and the run id from the elastic agent (:func:`_torchrun_run_id`).
        Every folder must be private to this user (:func:`_unsafe`).

        Raises
        ------
        LaunchError
            Non-integer values, a rank outside ``[0, WORLD_SIZE)``, ``WORLD_SIZE`` > 1 with no way
            to rendezvous, a missing rendezvous folder or one that is not private, a variable that
            could name a path outside it.
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
        run_id = _name_env(env, RUN_ID_ENV)
        rdzv_raw = env.get(RENDEZVOUS_ENV)
        rdzv: Path | None = None
        derived = False
        if rdzv_raw:
            rdzv = Path(rdzv_raw)
            _check_private(rdzv, f"${RENDEZVOUS_ENV}")
            if run_id is None:
                raise LaunchError(
                    f"${RENDEZVOUS_ENV} is set but ${RUN_ID_ENV} is not: the ranks of a launch "
                    f"need one run id (python -m rawgraph.multi sets both)"
                )
        elif world > 1 and env.get("MASTER_PORT"):
            run = _name_env(env, "TORCHELASTIC_RUN_ID") or "none"
            run_id = run_id or _torchrun_run_id(env)
            rdzv = _torchrun_folder(env, run)
            derived = True
        elif world > 1:
            raise LaunchError(
                f"WORLD_SIZE {world} but no ${RENDEZVOUS_ENV} (or torchrun's $MASTER_PORT): "
                f"start the ranks with python -m rawgraph.multi --nproc {world} ..."
            )
        hb = env.get(HEARTBEAT_ENV)
        return cls(rank, world, local, device, rdzv, Path(hb) if hb else None, run_id, derived)

    def rendezvous_for(self, timeout: float = 120.0) -> Rendezvous:
        """This rank's :class:`Rendezvous`; on a folder the ranks remove themselves, this rank
        leaves it at exit (:meth:`Rendezvous.leave`, through ``atexit``)."""
        if self.rendezvous is None:
            raise LaunchError("this rank has no rendezvous folder (one rank needs none)")
        if self.run_id is None:  # from_environ always pairs the two; a RankEnv made by hand may not
            raise LaunchError(f"this rank has a rendezvous folder but no run id (set ${RUN_ID_ENV})")
        rdzv = Rendezvous(self.rendezvous, self.rank, self.world, timeout, run_id=self.run_id)
        if self.ranks_remove_rendezvous:
            _leave_at_exit(rdzv)
        return rdzv


# ---------------------------------------------------------------------------------- rendezvous
class Rendezvous:
    """Byte strings and barriers between the ranks of one launch, through a private folder.

    ``publish(key, data)`` writes ``key.<rank>``: a line with the run id, then ``data``, whole or
    not at all; ``fetch(key, rank)`` polls for it until ``timeout`` seconds pass
    (:class:`RendezvousError` naming the rank that never wrote), passing over a file headed by
    another run id (another run left it) and a symbolic link. Keys are single-use: each call site
    names its own (``"nccl_id"``, ``"ipc.0"``).

    Every access opens the folder with ``O_DIRECTORY | O_NOFOLLOW``, checks what it opened
    (``os.fstat``: :func:`_unsafe`), and names files relative to that descriptor (``dir_fd``), so
    the folder cannot be swapped between the check and the use.

    Raises
    ------
    LaunchError
        A run id that is not a :data:`_NAME`, a folder that is missing or not private.
    """

    path: Path
    rank: int
    world: int
    timeout: float

    def __init__(self, path: str | Path, rank: int, world: int, timeout: float = 120.0, *, run_id: str):
        if not isinstance(run_id, str) or not _NAME.fullmatch(run_id):
            raise LaunchError(f"bad run id {run_id!r}: 1-128 letters, digits, '_', '.' or '-'")
        self.path = Path(path)
        self.rank, self.world, self.timeout = int(rank), int(world), float(timeout)
        self.run_id = run_id
        self._head = f"rawgraph-rendezvous {run_id}\n".encode()
        self._barriers = 0
        with self._folder():  # a folder that is not private is refused now, before any rank waits on it
            pass

    @contextlib.contextmanager
    def _folder(self) -> Iterator[int]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            _check_private(self.path, "rendezvous folder")  # names a link, a file, a folder gone
            raise _refused("rendezvous folder", self.path, f"cannot be opened ({exc.strerror})") from exc
        try:
            why = _unsafe(os.fstat(fd))
            if why:
                raise _refused("rendezvous folder", self.path, why)
            yield fd
        finally:
            os.close(fd)

    def _name(self, key: str, rank: int) -> str:
        if not key or "/" in key or key.startswith("."):
            raise LaunchError(f"bad rendezvous key {key!r}")
        return f"{key}.{rank}"

    def _write(self, name: str, data: bytes) -> None:
        """``data`` under ``name`` with this run's head: a new temporary file (``O_CREAT | O_EXCL |
        O_NOFOLLOW`` under a random name: nothing already there is opened), ``fsync``, then
        ``os.replace`` onto ``name`` (a rename replaces the entry there, a symbolic link included,
        and never writes through it)."""
        tmp = f".{name}.{secrets.token_hex(8)}.tmp"
        with self._folder() as folder:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
            try:
                with open(fd, "wb") as f:
                    f.write(self._head + data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=folder)
                raise

    def _read(self, name: str) -> bytes | None:
        """What this run wrote under ``name``; None where nothing is, where a symbolic link is
        (``O_NOFOLLOW`` fails with ``ELOOP``) or where another run id heads the file."""
        with self._folder() as folder:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ELOOP):
                    return None
                raise
            with open(fd, "rb") as f:
                raw = f.read()
        return raw[len(self._head) :] if raw.startswith(self._head) else None

    def publish(self, key: str, data: bytes) -> None:
        self._write(self._name(key, self.rank), bytes(data))

    def fetch(self, key: str, rank: int, timeout: float | None = None) -> bytes:
        name = self._name(key, rank)
        wait = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        delay = 0.001
        while True:
            data = self._read(name)
            if data is not None:
                return data
            if time.monotonic() > deadline:
                raise RendezvousError(
                    f"rank {self.rank} waited {wait:g} s for {key!r} from rank {rank} of run "
                    f"{self.run_id}: it never came (that rank died or stalled)"
                )
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

    def leave(self) -> bool:
        """Mark this rank gone for good (``.left.<rank>``); the rank that then finds the mark of
        every rank of this run removes the folder (``shutil.rmtree``) and returns True.

        A rank that left reads nothing more, so once all have left no file there is needed; each
        rank writes its mark before it reads the others', so the last to leave sees them all. Only
        for a folder no launcher removes (torchrun's: :meth:`RankEnv.rendezvous_for`)."""
        self._write(f".left.{self.rank}", b"")
        if all(self._read(f".left.{r}") is not None for r in range(self.world)):
            shutil.rmtree(self.path, ignore_errors=True)  # two ranks leaving at once may both remove
            return True
        return False


_leaving: set[tuple[str, str]] = set()  # (folder, run id) this process leaves at exit


def _leave_at_exit(rdzv: Rendezvous) -> None:
    """``rdzv.leave()`` at interpreter exit (``atexit``), once per folder and run: a rank may open
    several Rendezvous on one folder."""
    key = (str(rdzv.path), rdzv.run_id)
    if key not in _leaving:
        _leaving.add(key)
        atexit.register(_leave_quietly, rdzv)


def _leave_quietly(rdzv: Rendezvous) -> None:
    # At exit nothing is left to handle an error; a folder not removed stays private to this user,
    # and the next run passes over its values (another run id).
    with contextlib.suppress(OSError, RawgraphError):
        rdzv.leave()


def heartbeat(env: RankEnv | None = None) -> None:
    """Tell the launcher's watchdog this rank still makes progress (touch ``$RAWGRAPH_HEARTBEAT``).
    Cheap (one ``utime``); nothing when not launched by rawgraph.multi."""
    path = (
        env.heartbeat
        if env is not None
        else (Path(os.environ[HEARTBEAT_ENV]) if os.environ.get(HEARTBEAT_ENV) else None)
    )
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
        "and watch them: the first rank that fails, stalls or times out stops the rest.",
    )
    p.add_argument("--nproc", "--nproc-per-node", dest="nproc", type=int, required=True, help="processes (one per GPU)")
    p.add_argument("--devices", default=None, help="comma-separated device ordinals, one per rank (default 0..nproc-1)")
    p.add_argument(
        "--isolate",
        action="store_true",
        help="set CUDA_VISIBLE_DEVICES to the rank's one GPU (then RAWGRAPH_DEVICE=0); breaks CUDA IPC between ranks",
    )
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds the whole run may take (default 1800)")
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=None,
        help="seconds a rank may go without a heartbeat after its first one (default: no stall check)",
    )
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


def _stop(ranks: Sequence[_Rank], grace: float, signum: int = signal.SIGTERM) -> list[int]:
    """``signum`` to each live rank's process group (``os.killpg``), then ``SIGKILL`` to what is
    left after ``grace`` s; the ranks that had to be stopped."""
    live = [r for r in ranks if r.proc.poll() is None]
    for r in live:
        try:
            os.killpg(r.proc.pid, signum)
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


@contextlib.contextmanager
def _noted_signals() -> Iterator[list[int]]:
    """While open, ``SIGTERM`` and ``SIGINT`` are noted in the list it yields instead of ending the
    launcher (``signal.signal``); the old handlers come back after.

    The handler only notes: the watch loop acts between two polls, so a signal never lands half-way
    through starting a rank (one started but not yet recorded would be left running). Python lets
    only the main thread set handlers; from another thread the list stays empty."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return
    old = {s: signal.signal(s, lambda signum, _frame: got.append(signum)) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield got
    finally:
        for s, handler in old.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)


def launch(
    target: str,
    args: Sequence[str] = (),
    nproc: int = 1,
    devices: Sequence[int] | None = None,
    module: bool = False,
    isolate: bool = False,
    timeout: float = 1800.0,
    stall_timeout: float | None = None,
    grace: float = 5.0,
    env: Mapping[str, str] | None = None,
    poll: float = 0.05,
) -> int:
    """Run ``nproc`` ranks of ``target`` and watch them (see the module docstring).

    Returns 0 when every rank exited 0.

    Raises
    ------
    LaunchError
        Bad arguments (before any process starts).
    RankFailedError
        The first rank that failed, stalled or timed out (the others already stopped).
    LaunchInterrupted
        ``SIGTERM`` or ``SIGINT`` came (from the main thread only): sent on to the ranks, which
        then stopped.
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
    run_id = secrets.token_hex(8)
    ranks: list[_Rank] = []
    with _noted_signals() as got:
        rdzv = Path(tempfile.mkdtemp(prefix="rawgraph-rdzv-"))  # new, mode 0700, this user's
        try:
            for r, dev in enumerate(devs):
                if got:
                    break  # _watch sends it on to the ranks already started
                child = dict(base)
                hb = rdzv / f".heartbeat.{r}"
                child.update(
                    {
                        "RANK": str(r),
                        "WORLD_SIZE": str(nproc),
                        "LOCAL_RANK": str(r),
                        "LOCAL_WORLD_SIZE": str(nproc),
                        RENDEZVOUS_ENV: str(rdzv),
                        RUN_ID_ENV: run_id,
                        HEARTBEAT_ENV: str(hb),
                        DEVICE_ENV: "0" if isolate else str(dev),
                    }
                )
                if isolate:
                    child["CUDA_VISIBLE_DEVICES"] = str(dev)
                cmd = [sys.executable, *(["-m", target] if module else [target]), *args]
                # Its own session: stopping a rank stops whatever it started too, and only the
                # launcher's signals reach it (a terminal's Ctrl-C reaches the launcher alone).
                ranks.append(_Rank(r, subprocess.Popen(cmd, env=child, start_new_session=True), hb))
            return _watch(ranks, timeout, stall_timeout, grace, poll, got)
        finally:
            _stop(ranks, grace)
            shutil.rmtree(rdzv, ignore_errors=True)


def _watch(
    ranks: list[_Rank], timeout: float, stall_timeout: float | None, grace: float, poll: float, got: list[int]
) -> int:
    """0 once every rank exited 0; before that, the first rank that fails, stalls or runs late, or
    a signal noted in ``got``, stops them all and raises."""
    start = time.monotonic()
    while True:
        if got:
            raise LaunchInterrupted(got[0], _stop(ranks, grace, got[0]))
        running = 0
        for r in ranks:
            code = r.proc.poll()
            if code is None:
                running += 1
            elif code != 0:
                why = f"died of {_signal_text(-code)}" if code < 0 else f"exited with code {code}"
                rc = 128 - code if code < 0 else code
                raise RankFailedError(r.rank, rc, f"{why} (pid {r.proc.pid}); stopped ranks {_stop(ranks, grace)}")
        if not running:
            return 0
        now = time.monotonic()
        if now - start > timeout:
            late = [r.rank for r in ranks if r.proc.poll() is None]
            raise RankFailedError(
                late[0],
                TIMEOUT_EXIT,
                f"still running after --timeout {timeout:g} s (ranks {late} unfinished); "
                f"stopped ranks {_stop(ranks, grace)}",
            )
        if stall_timeout is not None:
            for r in ranks:
                try:
                    beat = r.heartbeat.stat().st_mtime
                except FileNotFoundError:
                    continue  # not started beating yet: only --timeout applies
                if r.proc.poll() is None and time.time() - beat > stall_timeout:
                    raise RankFailedError(
                        r.rank,
                        TIMEOUT_EXIT,
                        f"stalled: no heartbeat for {stall_timeout:g} s (pid {r.proc.pid}); "
                        f"stopped ranks {_stop(ranks, grace)}",
                    )
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
    except (RankFailedError, LaunchInterrupted) as exc:
        print(f"rawgraph.multi: {exc}", file=sys.stderr)
        return exc.returncode or 1
    except KeyboardInterrupt:
        print("rawgraph.multi: interrupted; every rank stopped", file=sys.stderr)
        return 130
