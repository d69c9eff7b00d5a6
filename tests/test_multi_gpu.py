"""rawgraph.multi on GPUs: a captured all-reduce inside a rawgraph graph.

One GPU (gpu marker): a one-rank NCCL communicator, the tensor-parallel block's graph with the
captured all-reduce against the eager block and the float64 reference, the manager's refusal to
move a buffer the collective's node holds, the one-shot kernel on one rank.

Two GPUs (skipped unless two are visible): this file run as a script under
``python -m rawgraph.multi --nproc 2`` is each rank's worker (``__main__`` below); the tests drive it.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from helpers import random_input, rel_err  # noqa: E402


def _nccl_or_skip():
    from rawgraph.multi.comm import nccl_available

    ok, why = nccl_available()
    if not ok:
        pytest.skip(f"NCCL unavailable: {why}")


def _gpu_count():
    try:
        from cuda.bindings import driver

        if driver.cuInit(0)[0] != driver.CUresult.CUDA_SUCCESS:
            return 0
        err, n = driver.cuDeviceGetCount()
        return int(n) if err == driver.CUresult.CUDA_SUCCESS else 0
    except Exception:
        return 0


two_gpus = pytest.mark.skipif(_gpu_count() < 2, reason="needs 2 visible GPUs (the 2-GPU kind)")


# ------------------------------------------------------------------------------ one GPU
@pytest.fixture
def comm(device):
    _nccl_or_skip()
    from rawgraph.multi.comm import NcclComm

    c = NcclComm.single(device)
    yield c
    c.close()
    c.close()  # safe twice


@pytest.mark.gpu
def test_one_rank_all_reduce(comm, stream, rng):
    from rawgraph import DeviceBuffer
    from rawgraph.multi.comm import NcclBuffer

    a, b = NcclBuffer(comm, 1000), NcclBuffer(comm, 1000)
    h = random_input(rng, (1000,))
    # the NCCL buffers are plain device memory: fill and read them through rawgraph buffers
    src = DeviceBuffer.from_numpy(h)
    from cuda.bindings import driver

    D = driver.CUdeviceptr
    driver.cuMemcpyDtoDAsync(D(a.ptr), D(src.ptr), 4000, stream.ptr)
    comm.all_reduce(a.view(), b.view(), stream)
    out = DeviceBuffer((1000,), np.float32)
    driver.cuMemcpyDtoDAsync(D(out.ptr), D(b.ptr), 4000, stream.ptr)
    np.testing.assert_array_equal(out.to_numpy(stream), h)
    for buf in (a, b, src, out):
        buf.close()
        buf.close()


@pytest.mark.gpu
@pytest.mark.parametrize("width, batch", [(256, 1), (1024, 8)])
def test_captured_all_reduce_replays_the_eager_block(comm, device, stream, rng, width, batch):
    from rawgraph import DeviceBuffer, ExecUpdateManager
    from rawgraph.models.tp_block import TPBlock

    block = TPBlock(width, batch, 0, 1, "nccl", comm=comm, seed=7, device=device)
    x = DeviceBuffer.from_numpy(random_input(rng, (batch, width)))
    out = DeviceBuffer((batch, width), np.float32)
    block.forward(x, out, stream)
    eager = out.to_numpy(stream)
    assert rel_err(eager, block.reference(x.to_numpy(stream))) < 1e-5
    graph = block.capture(x, out, stream)
    assert graph.foreign_nodes, "the all-reduce should be a node rawgraph did not record"
    ex = graph.instantiate()
    mgr = ExecUpdateManager(graph, ex, names=("x", "out"))
    xs = [DeviceBuffer.from_numpy(random_input(rng, (batch, width))) for _ in range(3)]
    for xi in xs:
        mgr.bind("x", xi)
        out.poison(stream)
        ex.launch(stream)
        ref = block.reference(xi.to_numpy(stream))
        assert rel_err(out.to_numpy(stream), ref) < 1e-5
    mgr.bind("x", x)
    ex.launch(stream)
    np.testing.assert_array_equal(out.to_numpy(stream), eager)  # same kernels, same bits
    mgr.close()
    ex.close()
    graph.close()
    for b in (x, out, *xs):
        b.close()
    block.close()
    block.close()


@pytest.mark.gpu
def test_manager_refuses_to_move_the_collective_buffers(comm, device, stream, rng):
    from rawgraph import DeviceBuffer, ExecUpdateManager, ForeignNodeError
    from rawgraph.models.tp_block import TPBlock

    block = TPBlock(256, 4, 0, 1, "nccl", comm=comm, device=device)
    x = DeviceBuffer.from_numpy(random_input(rng, (4, 256)))
    out = DeviceBuffer((4, 256), np.float32)
    graph = block.capture(x, out, stream)
    ex = graph.instantiate()
    mgr = ExecUpdateManager(graph, ex, names=("x", "z", "zsum", "out"))
    other = DeviceBuffer((4, 256), np.float32)
    for name in ("z", "zsum"):
        with pytest.raises(ForeignNodeError, match=name):
            mgr.bind(name, other)
    mgr.bind("x", x)  # x is read by rawgraph's own nodes only: still bindable
    mgr.bind("out", other)
    mgr.close()
    ex.close()
    graph.close()
    for b in (x, out, other):
        b.close()
    block.close()


@pytest.mark.gpu
def test_one_shot_kernel_on_one_rank(device, stream, rng):
    from rawgraph import DeviceBuffer, ExecUpdateManager, ForeignNodeError
    from rawgraph.models.tp_block import TPBlock
    from rawgraph.multi.allreduce import PeerAllReduce

    peer = PeerAllReduce(0, 1, 8 * 1024, device=device)
    block = TPBlock(1024, 8, 0, 1, "custom", peer=peer, device=device)
    x = DeviceBuffer.from_numpy(random_input(rng, (8, 1024)))
    out = DeviceBuffer((8, 1024), np.float32)
    graph = block.capture(x, out, stream)
    ex = graph.instantiate()
    for _ in range(50):  # the epoch advances every replay; unchanged arguments still match
        ex.launch(stream)
    assert rel_err(out.to_numpy(stream), block.reference(x.to_numpy(stream))) < 1e-5
    assert not peer.error(stream)
    mgr = ExecUpdateManager(graph, ex, names=("x", "zsum"))
    with pytest.raises(ForeignNodeError):
        mgr.bind("zsum", DeviceBuffer((8, 1024), np.float32))
    mgr.close()
    ex.close()
    graph.close()
    block.close()
    peer.close()
    peer.close()
    x.close()
    out.close()


# ------------------------------------------------------------------------------ two GPUs
def _launch(*args, timeout=540):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "rawgraph.multi", "--nproc", "2", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


@pytest.mark.gpu
@pytest.mark.slow
@two_gpus
@pytest.mark.parametrize("allreduce", ["nccl", "custom"])
def test_two_ranks_thousand_replays(allreduce):
    _nccl_or_skip()
    res = _launch("--timeout", "500", "--stall-timeout", "60", __file__, "replays", allreduce)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.count("OK replays") == 2, res.stdout


@pytest.mark.gpu
@two_gpus
def test_two_ranks_eager_graph_custom_agree():
    _nccl_or_skip()
    res = _launch("--timeout", "300", __file__, "agree")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.count("OK agree") == 2, res.stdout


@pytest.mark.gpu
@two_gpus
def test_watchdog_stops_a_stalled_rank():
    _nccl_or_skip()
    res = _launch("--timeout", "120", "--stall-timeout", "10", "--grace", "3", __file__, "stall")
    assert res.returncode == 124, res.stdout[-2000:] + res.stderr[-2000:]
    assert "rank 1" in res.stderr and "stalled" in res.stderr


# ------------------------------------------------------------------------------ the worker
def _worker(mode: str, *rest: str) -> int:
    import time

    from rawgraph import DeviceBuffer, ExecUpdateManager, Stream, get_device
    from rawgraph.models.tp_block import TPBlock
    from rawgraph.multi import RankEnv, heartbeat
    from rawgraph.multi.allreduce import PeerAllReduce
    from rawgraph.multi.comm import NcclComm

    env = RankEnv.from_environ()
    device = get_device(env.device)
    rdzv = env.rendezvous_for()
    comm = NcclComm.from_env(env, device, rdzv)
    stream = Stream()
    width, batch = 1024, 8
    rng = np.random.default_rng(1234)  # the same inputs on every rank
    peer = PeerAllReduce(env.rank, env.world, batch * width, rdzv, device)
    kinds = {
        "nccl": TPBlock(width, batch, env.rank, env.world, "nccl", comm=comm, seed=3, device=device),
        "custom": TPBlock(width, batch, env.rank, env.world, "custom", peer=peer, seed=3, device=device),
    }
    x = DeviceBuffer.from_numpy(rng.standard_normal((batch, width), dtype=np.float32))
    out = DeviceBuffer((batch, width), np.float32)
    try:
        if mode == "replays":
            block = kinds[rest[0]]
            graph = block.capture(x, out, stream)
            ex = graph.instantiate()
            mgr = ExecUpdateManager(graph, ex, names=("x",))
            inputs = [DeviceBuffer.from_numpy(rng.standard_normal((batch, width), dtype=np.float32)) for _ in range(4)]
            host = [b.to_numpy(stream) for b in inputs]
            refs = [block.reference(h) for h in host]
            worst = 0.0
            for i in range(1000):
                mgr.bind("x", inputs[i % 4])
                ex.launch(stream)
                if i % 50 == 0 or i == 999:
                    got = out.to_numpy(stream)
                    worst = max(worst, float(np.linalg.norm(got - refs[i % 4]) / np.linalg.norm(refs[i % 4])))
                    heartbeat(env)
            assert worst < 1e-5, worst
            if rest[0] == "custom":
                assert not peer.error(stream)
            mgr.close()
            ex.close()
            graph.close()
            for b in inputs:
                b.close()
            print(f"OK replays rank {env.rank} {rest[0]} worst rel err {worst:.2e}", flush=True)
        elif mode == "agree":
            ref = kinds["nccl"].reference(x.to_numpy(stream))
            results = {}
            for name, block in kinds.items():
                block.forward(x, out, stream)
                results[f"eager-{name}"] = out.to_numpy(stream)
                graph = block.capture(x, out, stream)
                ex = graph.instantiate()
                out.poison(stream)
                ex.launch(stream)
                results[f"graph-{name}"] = out.to_numpy(stream)
                ex.close()
                graph.close()
            for k, v in results.items():
                err = float(np.linalg.norm(v - ref) / np.linalg.norm(ref))
                assert err < 1e-5, (k, err)
            np.testing.assert_array_equal(results["eager-nccl"], results["graph-nccl"])
            np.testing.assert_array_equal(results["eager-custom"], results["graph-custom"])
            print(f"OK agree rank {env.rank}", flush=True)
        elif mode == "stall":
            graph = kinds["nccl"].capture(x, out, stream)
            ex = graph.instantiate()
            for i in range(10_000):
                if env.rank == 1 and i == 100:
                    time.sleep(600)  # this rank stops replaying; rank 0 blocks in the collective
                ex.launch(stream)
                stream.synchronize()
                heartbeat(env)
        return 0
    finally:
        for block in kinds.values():
            block.close()
        x.close()
        out.close()
        peer.close()  # barrier with the peer, then unmap and free
        stream.close()
        comm.close()
        rdzv.barrier("closed", timeout=30)
        print(f"closed rank {env.rank}", flush=True)


if __name__ == "__main__":
    sys.exit(_worker(*sys.argv[1:]))
