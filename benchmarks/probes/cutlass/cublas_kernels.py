"""Which kernels does cuBLAS run for issue 23's shapes? (torch.mm, TF32 off; needs torch and a GPU)

One ``FACT`` line per kernel of one ``torch.mm(x, W)`` at each (M, K = N): its device time under
the PyTorch profiler, grid, block, registers, shared memory and name. Run from the repository root:

    python3 benchmarks/probes/cutlass/cublas_kernels.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile


def main() -> int:
    """Profile one torch.mm per shape and print its kernels."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError as e:
        print(f"NO GPU: torch is not importable ({e})")
        return 2
    if not torch.cuda.is_available():
        print("NO GPU: torch.cuda.is_available() is False")
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"FACT device = {torch.cuda.get_device_name()}")
    shapes = (
        (4096, (64, 72, 96, 104, 128, 136, 144, 152, 192, 200, 256)),
        (1024, (16, 32, 40, 64, 104, 120, 128, 256)),
    )
    with tempfile.TemporaryDirectory() as tmp:
        for k, rows in shapes:
            w = torch.randn(k, k, device="cuda")
            for m in rows:
                x = torch.randn(m, k, device="cuda")
                for _ in range(3):
                    torch.mm(x, w)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    torch.mm(x, w)
                    torch.cuda.synchronize()
                path = os.path.join(tmp, "trace.json")
                prof.export_chrome_trace(path)
                with open(path) as f:
                    events = [e for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"]
                for e in events:
                    a = e.get("args", {})
                    print(
                        f"FACT K=N={k} M={m} us={e['dur']:.1f} grid={a.get('grid')} block={a.get('block')} "
                        f"regs={a.get('registers per thread')} smem={a.get('shared memory')} {e['name'][:110]}"
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
