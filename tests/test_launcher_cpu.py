"""The launcher's trust boundary and its signals, without a GPU.

The rendezvous folder carries the NCCL unique id (the bootstrap address) and the CUDA IPC handles
that ``cuIpcOpenMemHandle`` maps, so nothing another local user could plant there may be read,
followed or written through; a value left by another run is never read. Signals sent to the
launcher reach the ranks, and a rank's death by any signal is reported, not a traceback.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from test_multi_cpu import ROOT, _run, _script

from rawgraph.multi.launch import LaunchError, RankEnv, Rendezvous, RendezvousError

CHILD_ENV = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _torchrun_env(port=29500, run="t", rank=0, world=2):
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": run}


def _rank(folder, rank, run="r1", timeout=5.0):
    """A rank of a launch that named ``folder`` and run id ``run`` (what the launcher sets)."""
    env = {"RANK": str(rank), "WORLD_SIZE": "2", "RAWGRAPH_RENDEZVOUS": str(folder), "RAWGRAPH_RUN_ID": run}
    return RankEnv.from_environ(env).rendezvous_for(timeout)


def _private(path):
    path.mkdir(mode=0o700)
    return path


def _wait_for(predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def _alive(pid):
    """Whether ``pid`` runs (a zombie, dead but not reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """tempfile's folder moved under ``tmp_path`` (for this process, and ``TMPDIR`` for children):
    the torchrun-style folders are made there and go with it."""
    base = _private(tmp_path / "tmp")
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    return base


# ------------------------------------------------------------------------ the folder itself
@pytest.mark.parametrize(
    "plant, reason",
    [
        ("open-folder", "mode 0o777"),
        ("symlink", "symbolic link"),
        ("open-parent", "mode 0o777"),
        ("other-owner", "owned by uid 65534"),
    ],
)
def test_a_torchrun_rendezvous_folder_someone_else_could_plant_is_refused(private_tmp, tmp_path, plant, reason):
    env = _torchrun_env()
    folder = RankEnv.from_environ(env).rendezvous  # where the ranks of this run meet
    folder.rmdir()
    bad = folder
    if plant == "open-folder":
        folder.mkdir()
        os.chmod(folder, 0o777)
    elif plant == "symlink":
        os.symlink(_private(tmp_path / "elsewhere"), folder)
    elif plant == "open-parent":
        _private(folder)
        bad = folder.parent
        os.chmod(bad, 0o777)
    else:
        if os.geteuid() != 0:
            pytest.skip("giving a folder to another uid needs root")
        _private(folder)
        os.chown(folder, 65534, 65534)
    with pytest.raises(LaunchError, match=reason) as info:
        RankEnv.from_environ(env)
    assert repr(str(bad)) in str(info.value)


@pytest.mark.parametrize("plant, reason", [("open", "mode 0o777"), ("symlink", "symbolic link")])
def test_an_explicit_rendezvous_folder_open_to_others_or_a_symlink_is_refused(tmp_path, plant, reason):
    real = _private(tmp_path / "real")
    path = real
    if plant == "open":
        os.chmod(real, 0o777)
    else:
        path = tmp_path / "link"
        os.symlink(real, path)
    with pytest.raises(LaunchError, match=reason) as info:
        _rank(path, 0)
    assert repr(str(path)) in str(info.value)


def test_an_explicit_rendezvous_folder_needs_a_run_id(tmp_path):
    env = {"RANK": "0", "WORLD_SIZE": "2", "RAWGRAPH_RENDEZVOUS": str(_private(tmp_path / "rdzv"))}
    with pytest.raises(LaunchError, match="RAWGRAPH_RUN_ID"):
        RankEnv.from_environ(env)


@pytest.mark.parametrize(
    "var, value",
    [
        ("MASTER_PORT", "../../x"),
        ("MASTER_PORT", "70000"),
        ("MASTER_PORT", "0"),
        ("TORCHELASTIC_RUN_ID", "../../etc"),
        ("TORCHELASTIC_RUN_ID", "a/b"),
        ("TORCHELASTIC_RUN_ID", ".."),
        ("RAWGRAPH_RUN_ID", "a\nb"),
    ],
)
def test_torchrun_variables_that_could_leave_the_folder_are_refused(private_tmp, var, value):
    env = dict(_torchrun_env(), **{var: value})
    with pytest.raises(LaunchError, match=var):
        RankEnv.from_environ(env)
    assert not [p for p in private_tmp.rglob("*") if "rdzv" in p.name]  # nothing made


# ------------------------------------------------------------------------ what is read and written
def test_publish_never_writes_through_a_planted_symlink(tmp_path):
    folder = _private(tmp_path / "rdzv")
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    os.symlink(victim, folder / "nccl_id.0")  # the value's own name
    os.symlink(victim, folder / f".nccl_id.0.{os.getpid()}.tmp")  # a temporary name one could guess
    r0, r1 = _rank(folder, 0), _rank(folder, 1)
    r0.publish("nccl_id", b"the id")
    assert victim.read_bytes() == b"keep"
    assert not (folder / "nccl_id.0").is_symlink()
    assert r1.fetch("nccl_id", 0) == b"the id"


def test_fetch_ignores_a_symlink_and_a_value_of_another_run(tmp_path):
    folder = _private(tmp_path / "rdzv")
    planted = tmp_path / "planted"
    planted.write_bytes(b"someone else's id")
    os.symlink(planted, folder / "nccl_id.0")
    _rank(folder, 0, run="old").publish("barrier-1", b"1")  # left by an earlier run, same name
    r1 = _rank(folder, 1, run="new", timeout=0.3)
    with pytest.raises(RendezvousError, match="from rank 0"):
        r1.fetch("nccl_id", 0)
    with pytest.raises(RendezvousError, match="barrier-1"):
        r1.barrier()
    _rank(folder, 0, run="new").publish("nccl_id", b"this run's id")
    assert r1.fetch("nccl_id", 0) == b"this run's id"


def test_a_restarted_torchrun_rank_never_reads_the_attempt_before(private_tmp):
    first, again = (
        RankEnv.from_environ(dict(_torchrun_env(rank=r), TORCHELASTIC_RESTART_COUNT=n)) for r, n in ((0, "0"), (1, "1"))
    )
    assert first.rendezvous == again.rendezvous and first.run_id != again.run_id
    Rendezvous(first.rendezvous, 0, 2, run_id=first.run_id).publish("nccl_id", b"attempt 0's id")
    with pytest.raises(RendezvousError, match="from rank 0"):
        Rendezvous(again.rendezvous, 1, 2, timeout=0.2, run_id=again.run_id).fetch("nccl_id", 0)


AGENT = "import subprocess, sys\nsys.exit(subprocess.run([sys.executable, *sys.argv[1:]]).returncode)\n"
TORCHRUN_RANK = """
    import os, sys
    from rawgraph.multi import RankEnv
    from rawgraph.multi.launch import RendezvousError
    env = RankEnv.from_environ()
    r = env.rendezvous_for(timeout=0.5)
    if env.rank == 0:  # publishes the id, waits for rank 1 that never comes, dies
        r.broadcast("nccl_id", b"run 1's id")
        try:
            r.barrier()
        except RendezvousError:
            os._exit(1)
    got = []
    for step in (lambda: r.broadcast("nccl_id", None), r.barrier):
        try:
            got.append(repr(step()))
        except RendezvousError:
            got.append("waited")
    print(" ".join(got))
"""


def test_a_second_torchrun_launch_never_reads_the_first_ones_values(private_tmp, tmp_path):
    # Two launches on one port with one run id, each rank a child of its own agent (torchrun's
    # elastic agent): the first one's rank 0 dies after publishing, the second one's rank 1 must
    # wait for its own rank 0 instead of reading the id and barrier left behind.
    agent, rank = _script(tmp_path, "agent.py", AGENT), _script(tmp_path, "rank.py", TORCHRUN_RANK)
    outs = []
    for r in (0, 1):
        env = dict(CHILD_ENV, TMPDIR=str(private_tmp), **_torchrun_env(29600, "same", r))
        outs.append(
            subprocess.run([sys.executable, agent, rank], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
        )
    assert outs[0].returncode == 1, outs[0].stderr
    assert outs[1].returncode == 0, outs[1].stderr
    assert outs[1].stdout.split() == ["waited", "waited"]


def test_torchrun_ranks_remove_their_folder_when_the_last_one_leaves(private_tmp, tmp_path):
    # Rank 0 publishes and exits before rank 1 starts: the folder stays for rank 1 (a rank still
    # to come reads it), and goes once rank 1, the last of the run, exits.
    rank = _script(
        tmp_path,
        "rank.py",
        """
        from rawgraph.multi import RankEnv
        env = RankEnv.from_environ()
        r = env.rendezvous_for(timeout=10)
        print(env.rendezvous)
        if env.rank == 0:
            r.publish("hello", b"from 0")
        else:
            assert r.fetch("hello", 0) == b"from 0"
    """,
    )
    folders = []
    for r in (0, 1):
        env = dict(CHILD_ENV, TMPDIR=str(private_tmp), **_torchrun_env(29601, "t", r))
        res = subprocess.run([sys.executable, rank], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert res.returncode == 0, res.stderr
        folders.append(Path(res.stdout.strip()))
        assert folders[-1].exists() == (r == 0)
    assert folders[0] == folders[1]


# ------------------------------------------------------------------------ signals
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_launcher_reaches_every_rank_and_stops_them(tmp_path, sig):
    out = _private(tmp_path / "out")
    script = _script(
        tmp_path,
        "c.py",
        f"""
        import os, signal, sys, time
        rank, out = os.environ["RANK"], {str(out)!r}
        if rank == "0":  # notes which signal came, then exits
            def noted(n, frame):
                open(os.path.join(out, "got"), "w").write(str(n))
                sys.exit(0)
            signal.signal({int(sig)}, noted)
        else:  # a rank that does not stop on its own: SIGKILL after --grace
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        with open(os.path.join(out, rank + ".tmp"), "w") as f:
            f.write(str(os.getpid()) + " " + os.environ["RAWGRAPH_RENDEZVOUS"])
        os.replace(os.path.join(out, rank + ".tmp"), os.path.join(out, rank))
        time.sleep(60)
    """,
    )
    log = tmp_path / "stderr"  # a file, not a pipe: a rank left running would hold a pipe open
    with open(log, "w") as f:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "rawgraph.multi", "--nproc", "2", "--grace", "1", script],
            env=CHILD_ENV,
            cwd=ROOT,
            stderr=f,
        )
    pids = []
    try:
        assert _wait_for(lambda: all((out / r).exists() for r in "01"), 30), "the ranks never started"
        pids = [int((out / r).read_text().split()[0]) for r in "01"]
        folder = Path((out / "0").read_text().split()[1])
        launcher.send_signal(sig)
        launcher.wait(30)
        err = log.read_text()
        assert launcher.returncode == 128 + sig, err
        assert (out / "got").read_text() == str(int(sig))  # the same signal, forwarded
        assert not [p for p in pids if _alive(p)]
        assert not folder.exists()
        assert signal.Signals(sig).name in err and "Traceback" not in err
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(10)
        for pid in pids:  # each rank leads its own process group
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_rank_dying_of_a_real_time_signal_is_reported_not_a_traceback(tmp_path):
    n = signal.SIGRTMIN + 1  # no name in signal.Signals
    script = _script(
        tmp_path,
        "rt.py",
        f"""
        import os, time
        if os.environ["RANK"] == "1":
            os.kill(os.getpid(), {n})
        time.sleep(60)
    """,
    )
    res = _run("--nproc", "2", "--grace", "1", script)
    assert "Traceback" not in res.stderr, res.stderr
    assert f"rank 1 died of signal {n} (SIGRTMIN+1)" in res.stderr
    assert res.returncode == 128 + n
