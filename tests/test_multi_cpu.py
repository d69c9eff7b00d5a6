"""rawgraph.multi without a GPU: the split arithmetic, the launcher, its watchdog, the rendezvous."""

import importlib
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

L = importlib.import_module("rawgraph.multi.launch")  # the module (the package re-exports a function of that name)
from rawgraph.multi.launch import LaunchError, RankEnv, RankFailedError, Rendezvous, RendezvousError
from rawgraph.multi.split import block_forward, check_split, partial, shard_weights, shards, split_forward
from rawgraph.runtime.errors import RawgraphError, ShapeError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------------------ split arithmetic
@pytest.mark.parametrize("width", [8, 64, 256, 1024])
@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_split_sums_to_the_one_gpu_block(rng, width, world):
    x = rng.standard_normal((5, width))
    w1 = rng.standard_normal((width, width)) / np.sqrt(width)
    w2 = rng.standard_normal((width, width)) / np.sqrt(width)
    assert check_split(x, w1, w2, world) < 1e-13


def test_non_square_and_uneven(rng):
    k, h = 12, 10  # W1 12 x 10, W2 10 x 12: 10 hidden over 3 ranks -> 4, 3, 3
    x, w1, w2 = rng.standard_normal((3, k)), rng.standard_normal((k, h)), rng.standard_normal((h, k))
    parts = shards(h, 3, "uneven")
    assert [s.size for s in parts] == [4, 3, 3] and parts[-1].stop == h
    got = sum(partial(x, w1, w2, s) for s in parts) + x
    np.testing.assert_allclose(got, block_forward(x, w1, w2), rtol=1e-12)
    np.testing.assert_allclose(split_forward(x, w1, w2, 3, "uneven"), block_forward(x, w1, w2), rtol=1e-12)


def test_shards_cover_hidden_once():
    for h, world, mult in [(1024, 2, 4), (4096, 8, 4), (40, 3, 4), (7, 7, 1)]:
        parts = shards(h, world, "uneven", mult)
        assert parts[0].start == 0 and parts[-1].stop == h
        assert all(a.stop == b.start for a, b in zip(parts, parts[1:]))
        assert all(s.size % mult == 0 and s.size > 0 for s in parts)


def test_split_refusals():
    with pytest.raises(ShapeError, match="evenly"):
        shards(10, 3)
    with pytest.raises(ShapeError, match="fewer than"):
        shards(4, 8)
    with pytest.raises(ShapeError, match="multiple of 4"):
        shards(10, 2, multiple=4)
    with pytest.raises(ShapeError):
        shards(0, 2)
    with pytest.raises(TypeError):
        shards(8, 2.0)
    with pytest.raises(ValueError):
        shards(8, 2, "round")
    assert issubclass(ShapeError, RawgraphError)
    with pytest.raises(ShapeError, match="chain"):
        shard_weights(np.zeros((4, 4)), np.zeros((5, 4)), shards(4, 2)[0])


def test_shards_are_contiguous_copies(rng):
    w1, w2 = rng.standard_normal((8, 8)), rng.standard_normal((8, 8))
    a, b = shard_weights(w1, w2, shards(8, 2)[1])
    assert a.flags.c_contiguous and b.flags.c_contiguous
    np.testing.assert_array_equal(a, w1[:, 4:]) and np.testing.assert_array_equal(b, w2[4:, :])


# ------------------------------------------------------------------------------ rank environment
def test_rank_env_defaults_to_one_rank():
    env = RankEnv.from_environ({})
    assert (env.rank, env.world, env.local_rank, env.device, env.rendezvous) == (0, 1, 0, 0, None)


def test_rank_env_reads_torchrun_names(tmp_path):
    env = RankEnv.from_environ(
        {
            "RANK": "1",
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "1",
            "RAWGRAPH_RENDEZVOUS": str(tmp_path),
            "RAWGRAPH_RUN_ID": "r1",
        }
    )
    assert (env.rank, env.world, env.device, env.rendezvous, env.run_id) == (1, 2, 1, tmp_path, "r1")
    env = RankEnv.from_environ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "29511", "TORCHELASTIC_RUN_ID": "t"})
    assert env.rendezvous is not None and env.rendezvous.is_dir() and "29511" in env.rendezvous.name
    env.rendezvous.rmdir()
    assert RankEnv.from_environ({"RAWGRAPH_DEVICE": "3"}).device == 3


@pytest.mark.parametrize(
    "environ, match",
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, "integer"),
        ({"RANK": "0"}, "both"),
        ({"RANK": "2", "WORLD_SIZE": "2", "RAWGRAPH_RENDEZVOUS": "/"}, "outside"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, ">= 1"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, "no \\$RAWGRAPH_RENDEZVOUS"),
        ({"RANK": "0", "WORLD_SIZE": "2", "RAWGRAPH_RENDEZVOUS": "/nonexistent/rdzv"}, "not a folder"),
        ({"RAWGRAPH_DEVICE": "-1"}, ">= 0"),
    ],
)
def test_rank_env_refusals(environ, match):
    with pytest.raises(LaunchError, match=match):
        RankEnv.from_environ(environ)


# ------------------------------------------------------------------------------ rendezvous
def test_rendezvous_broadcast_gather_barrier(tmp_path):
    a, b = Rendezvous(tmp_path, 0, 2, timeout=2, run_id="r1"), Rendezvous(tmp_path, 1, 2, timeout=2, run_id="r1")
    uid = os.urandom(128)
    assert a.broadcast("nccl_id", uid) == uid and b.broadcast("nccl_id", None) == uid
    a.publish("g", b"A")
    assert b.all_gather("g", b"B") == [b"A", b"B"]
    assert a.all_gather("g", b"A") == [b"A", b"B"]
    b.publish("barrier-1", b"1")
    a.barrier()  # rank 1 already arrived
    with pytest.raises(RendezvousError, match="from rank 1"):
        Rendezvous(tmp_path, 0, 2, timeout=0.1, run_id="r1").fetch("never", 1)
    with pytest.raises(LaunchError):
        a.publish("../escape", b"")
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporaries


# ------------------------------------------------------------------------------ the launcher
def _script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def _run(*args, timeout=60):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "rawgraph.multi", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def test_launcher_sets_the_environment_and_passes_the_id(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    script = _script(
        tmp_path,
        "child.py",
        f"""
        import os, sys
        from rawgraph.multi import RankEnv, heartbeat
        env = RankEnv.from_environ()
        r = env.rendezvous_for(timeout=20)
        uid = r.broadcast("nccl_id", os.urandom(128) if env.rank == 0 else None)
        heartbeat()
        r.barrier()
        open(os.path.join({str(out)!r}, str(env.rank)), "w").write(
            f"{{env.rank}} {{env.world}} {{env.local_rank}} {{env.device}} {{uid.hex()}} {{' '.join(sys.argv[1:])}}")
    """,
    )
    res = _run("--nproc", "3", script, "--flag", "v")
    assert res.returncode == 0, res.stderr
    lines = [(out / str(r)).read_text().split() for r in range(3)]
    assert [l[:4] for l in lines] == [[str(r), "3", str(r), str(r)] for r in range(3)]
    assert len({l[4] for l in lines}) == 1 and len(lines[0][4]) == 256  # one 128-byte id everywhere
    assert all(l[5:] == ["--flag", "v"] for l in lines)


def test_isolate_sets_visible_devices(tmp_path):
    script = _script(
        tmp_path,
        "c.py",
        """
        import os, sys
        assert os.environ["CUDA_VISIBLE_DEVICES"] == ["5", "7"][int(os.environ["RANK"])], os.environ["CUDA_VISIBLE_DEVICES"]
        assert os.environ["RAWGRAPH_DEVICE"] == "0"
    """,
    )
    res = _run("--nproc", "2", "--devices", "5,7", "--isolate", script)
    assert res.returncode == 0, res.stderr


def test_failing_rank_is_named_and_stops_the_others(tmp_path):
    script = _script(
        tmp_path,
        "c.py",
        """
        import os, sys, time
        if os.environ["RANK"] == "1":
            sys.exit(3)
        time.sleep(60)
    """,
    )
    t0 = time.monotonic()
    res = _run("--nproc", "3", "--grace", "2", script)
    assert res.returncode == 3
    assert "rank 1" in res.stderr and "exited with code 3" in res.stderr and "stopped ranks [0, 2]" in res.stderr
    assert time.monotonic() - t0 < 30


def test_hung_rank_is_stopped_by_the_timeout(tmp_path):
    script = _script(
        tmp_path,
        "c.py",
        """
        import os, time
        if os.environ["RANK"] == "0":
            time.sleep(120)
    """,
    )
    t0 = time.monotonic()
    res = _run("--nproc", "2", "--timeout", "3", "--grace", "1", script)
    assert res.returncode == L.TIMEOUT_EXIT
    assert "rank 0" in res.stderr and "--timeout 3" in res.stderr
    assert time.monotonic() - t0 < 20


def test_stalled_rank_is_found_by_its_heartbeat(tmp_path):
    script = _script(
        tmp_path,
        "c.py",
        """
        import os, time
        from rawgraph.multi import heartbeat
        for i in range(400):
            if os.environ["RANK"] == "1" and i > 5:
                time.sleep(120)  # stops replaying: no more beats
            heartbeat()
            time.sleep(0.05)
    """,
    )
    res = _run("--nproc", "2", "--stall-timeout", "2", "--grace", "1", script)
    assert res.returncode == L.TIMEOUT_EXIT
    assert "rank 1" in res.stderr and "stalled" in res.stderr


def test_signal_death_and_success(tmp_path):
    dead = _script(
        tmp_path, "d.py", "import os, signal\nif os.environ['RANK'] == '0': os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    res = _run("--nproc", "2", dead)
    assert res.returncode == 128 + 9 and "SIGKILL" in res.stderr
    ok = _script(tmp_path, "ok.py", "pass\n")
    assert _run("--nproc", "2", ok).returncode == 0


def test_module_mode(tmp_path):
    res = _run("--nproc", "1", "-m", "json.tool", "--help")
    assert res.returncode == 0


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(nproc=0), "--nproc"),
        (dict(nproc=2, devices=[0]), "names 1 device"),
        (dict(nproc=2, devices=[1, 1]), "distinct"),
        (dict(nproc=1, timeout=0), "--timeout"),
        (dict(nproc=1, stall_timeout=-1), "--stall-timeout"),
    ],
)
def test_launcher_refusals(tmp_path, kw, match):
    script = _script(tmp_path, "c.py", "pass\n")
    with pytest.raises(LaunchError, match=match):
        L.launch(script, **kw)
    with pytest.raises(LaunchError, match="no such script"):
        L.launch(str(tmp_path / "missing.py"))


def test_command_line_refusals(tmp_path):
    res = _run("--nproc", "2", str(tmp_path / "missing.py"))
    assert res.returncode == 2 and "no such script" in res.stderr
    res = _run("--nproc", "2", "--devices", "a,b", str(tmp_path / "missing.py"))
    assert res.returncode == 2 and "--devices" in res.stderr
    assert issubclass(RankFailedError, RawgraphError)
