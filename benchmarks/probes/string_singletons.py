"""Probe: does something in a rawgraph process overwrite CPython's one-character strings?

    PYTHONPATH=. python3 benchmarks/probes/string_singletons.py [--no-torch]

Seen on the H200 (2026-12-03): ``import torch`` late in a rawgraph process failed in torch's own
custom-op registration, ``_C.parse_schema`` reporting "expected ident but found ')'" on the text
``annotate(strtag) -> ()``, where torch builds ``str tag`` with an f-string. In CPython 3.12 every
one-character latin-1 string (the ``" "`` of that f-string among them) is one static object, so a
stray host write into it would drop that character from every string the process builds later.

This probe runs a bind/apply/replay loop and the bind breakdown itself (20 rounds) under ``sys.setprofile``, checking after every call returns that all 256 one-character
strings still have length 1 and their own code point, and prints ``FACT first corrupt after =
<function>`` at the first call after which one does not. Then it imports torch (unless
``--no-torch``) and says whether that works.
"""

from __future__ import annotations

import sys

LATIN1 = [chr(i) for i in range(256)]


def intact() -> bool:
    for i, c in enumerate(LATIN1):
        if len(c) != 1 or ord(c) != i:
            return False
    return True


def broken_chars() -> list[int]:
    return [i for i, c in enumerate(LATIN1) if len(c) != 1 or (len(c) == 1 and ord(c) != i)]


first: list[str] = []


def hook(frame, event, arg):  # noqa: ANN001
    if first or event not in ("return", "c_return"):
        return
    if len(LATIN1[32]) != 1 or not intact():
        where = f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}"
        if event == "c_return":
            where += f" (C call {getattr(arg, '__qualname__', arg)!r})"
        first.append(where)


def main() -> int:
    print(f"FACT python = {sys.version.split()[0]}")
    print(f"CHECK one-character strings at start: {'PASS' if intact() else 'MISMATCH'}")
    use_torch = "--no-torch" not in sys.argv
    sys.setprofile(hook)
    try:
        import numpy as np

        from rawgraph.graphs.capture import capture_plan
        from rawgraph.models.tinyblock import TinyBlock
        from rawgraph.runtime.memory import DeviceBuffer
        from rawgraph.runtime.stream import Stream
        from rawgraph.updates.manager import ExecUpdateManager

        rng = np.random.default_rng(5)
        s = Stream()
        for form in ("fused", "block"):
            model = TinyBlock(128, 1, 1, seed=3, form=form)
            xs = [DeviceBuffer.from_numpy(rng.standard_normal((1, 128), dtype=np.float32), stream=s) for _ in range(2)]
            outs = [DeviceBuffer((1, 128)) for _ in range(2)]
            graph = capture_plan(model.plan(xs[0], outs[0]), s)
            exe = graph.instantiate()
            mgr = ExecUpdateManager(graph, exe)
            pairs = [{"x": xs[0], "out": outs[0]}, {"x": xs[1], "out": outs[1]}]
            for p in pairs:
                mgr.bind_many(p)
            prepared = [mgr.prepare(p) for p in pairs]
            for i in range(50):
                mgr.apply(prepared[i & 1])
                mgr.launch(s)
            s.synchronize()
            got = outs[1].to_numpy()
            print(f"FACT {form} output finite = {bool(np.isfinite(got).all())}")
            print(f"CHECK one-character strings after the {form} set-up: {'PASS' if intact() else 'MISMATCH'}")
            from rawgraph.bench.microcosts import bind_breakdown

            bind_breakdown(rounds=20, form=form, torch_ok=False)
            print(f"CHECK one-character strings after the {form} bind breakdown: {'PASS' if intact() else 'MISMATCH'}")
    finally:
        sys.setprofile(None)
    print(f"FACT first corrupt after = {first[0] if first else 'none'}")
    if not intact():
        print(f"FACT broken one-character strings = {broken_chars()}")
    if use_torch:
        try:
            import torch

            print(f"STEP import torch: OK ({torch.__version__})")
        except Exception as exc:  # the finding, not a failure of the probe
            print(f"STEP import torch: EXC {type(exc).__name__}: {str(exc).splitlines()[0]}")
    print(f"CHECK f-string with a space: {'PASS' if f'{1} {2}' == '1 2' else 'MISMATCH ' + repr(f'{1} {2}')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
