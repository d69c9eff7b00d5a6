"""From driver facts about one address to the classes 1 to 4 of the graph doctor
(:func:`classify_pointer`), and the host mappings that are never device memory
(:func:`host_mappings`). No driver call here: the facts come from :mod:`.facts`.
"""

from __future__ import annotations

from .facts import PointerFacts, TorchBlock


def host_mappings(maps: str | None = None) -> list[tuple[int, int]]:
    """Address ranges this process maps as plain host memory: its stack and heap and its mapped
    files outside ``/dev`` (``/proc/self/maps``; empty where there is none). No device
    allocation lies there, so a foreign kernel's parameter word inside one is not taken for a
    device pointer (cuBLASLt's split-K kernels carry host stack addresses in their parameters).
    Mappings of ``/dev/nvidia*`` (pinned host memory, UVA) and anonymous ones are kept."""
    if maps is None:
        try:
            with open("/proc/self/maps") as f:
                maps = f.read()
        except OSError:
            return []
    out = []
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        name = parts[5].strip()
        if name.startswith("[stack") or name == "[heap]" or (name.startswith("/") and not name.startswith("/dev/")):
            lo, _, hi = parts[0].partition("-")
            try:
                out.append((int(lo, 16), int(hi, 16)))
            except ValueError:
                continue
    return out


def classify_pointer(
    known: bool,
    whole: bool,
    host: bool,
    facts: PointerFacts,
    block: TorchBlock | None = None,
    old: PointerFacts | None = None,
    old_block: TorchBlock | None = None,
) -> list[tuple[int, str, str, str]]:
    """The classes 1 to 4 one address falls in, from its facts alone (no GPU needed).

    Parameters
    ----------
    known : bool
        The address is certainly a pointer (a memcpy or memset side, a pointer argument of a
        rawgraph launch). A foreign kernel's word is taken for a pointer only when the driver
        knows an allocation there, or (for class 1) when it is a whole 8-byte parameter.
    whole : bool
        The word is a whole 8-byte parameter of a foreign kernel.
    host : bool
        A memcpy side whose memory type is host.
    facts : PointerFacts
        The driver now.
    block : TorchBlock, optional
        PyTorch's block holding the address now.
    old, old_block : optional
        The same at the baseline.

    Returns
    -------
    list of (class, severity, owner, advice)
    """
    out: list[tuple[int, str, str, str]] = []
    if host:
        kind = facts.host_kind
        was = old.host_kind if old is not None else None
        if facts.live and old is not None and old.live and _realloc(old, facts):
            out.append(
                (
                    3,
                    "error",
                    f"{kind} host memory at this address was freed and allocated again since the "
                    f"baseline (buffer id {old.buffer_id} -> {facts.buffer_id})",
                    "the graph copies to/from whoever owns it now: keep the staging buffer alive as long as the "
                    "graph, or rebind the memcpy node (cuGraphExecMemcpyNodeSetParams)",
                )
            )
        elif not facts.live and was in ("pinned", "registered"):
            out.append(
                (
                    3,
                    "error",
                    f"host memory that was {was} at the baseline is no longer known to the driver "
                    f"(freed or unregistered)",
                    "the graph copies to/from freed host memory: keep the staging buffer alive as long as the "
                    "graph, or rebind the memcpy node",
                )
            )
        elif not facts.live:
            out.append(
                (
                    3,
                    "warning",
                    "pageable host memory, or pinned memory already freed: cuPointerGetAttributes "
                    "and cuMemHostGetFlags know no allocation there",
                    "stage through pinned memory the graph owns (cuMemHostAlloc, rawgraph HostBuffer) and keep "
                    "it alive as long as the graph",
                )
            )
        else:
            flags = f" (cuMemHostGetFlags 0x{facts.host_flags:x})" if facts.host_flags is not None else ""
            out.append(
                (
                    3,
                    "info",
                    f"{kind} host memory{flags}, alive now",
                    "its owner must outlive the graph: a pool that recycles it (CuPy's pinned pool, torch's "
                    "pin_memory cache) lets the graph copy into someone else's buffer",
                )
            )
        return out
    if facts.live and old is not None and old.live and _realloc(old, facts):
        out.append(
            (
                1,
                "error",
                f"{facts.memory_type} allocation [0x{facts.range_start:x}, +{facts.range_size}) is "
                f"not the one at the baseline (buffer id {old.buffer_id} -> {facts.buffer_id})",
                "the memory the graph was captured with was freed and this address allocated again: keep the "
                "original owner alive as long as the graph, or rebind the node",
            )
        )
        return out
    if not facts.live:
        if old is not None and old.live and old.mempool:
            # The driver forgets memory given back to a stream-ordered pool (cuPointerGetAttributes
            # answers as for freed memory) though the pool keeps it for its next allocation.
            out.append(
                (
                    2,
                    "error",
                    f"memory of stream-ordered pool 0x{old.mempool:x} at the baseline, freed since "
                    f"(cuMemFreeAsync): the pool gives this address to its next cuMemAllocAsync",
                    "the graph reads or writes whatever the pool hands this address to next: allocate it inside "
                    "the graph (memory nodes), or with cuMemAlloc, and keep it alive as long as the graph",
                )
            )
            return out
        if known or (old is not None and old.live):
            sev, what = "error", ("freed since the baseline" if old is not None and old.live else "no live allocation")
        elif whole:
            sev, what = "warning", "possible pointer (a whole 8-byte parameter) into no live allocation"
        else:
            return out
        out.append(
            (
                1,
                sev,
                f"{what}: cuPointerGetAttributes knows no memory at this address",
                "a replay reads or writes freed memory: keep the buffer alive as long as the graph (or its "
                "execs), or rebind the node to a live buffer",
            )
        )
        return out
    if facts.mempool:
        out.append(
            (
                2,
                "warning",
                f"memory of stream-ordered pool 0x{facts.mempool:x} (cuMemAllocAsync / "
                f"cudaMallocAsync), [0x{facts.range_start:x}, +{facts.range_size})",
                "after its cuMemFreeAsync the pool gives this address to the next allocation while the graph "
                "still uses it: allocate it inside the graph (memory nodes), or with cuMemAlloc, and keep it "
                "alive as long as the graph",
            )
        )
    if block is not None:
        if block.state != "active_allocated" and not block.private:
            out.append(
                (
                    4,
                    "error",
                    f"PyTorch block [0x{block.address:x}, +{block.size}) is {block.state} in the "
                    f"caching allocator (segment 0x{block.segment:x}); the driver still has the memory",
                    "the tensor the graph was captured with has been freed and the next allocation takes its "
                    "memory: keep it alive as long as the graph",
                )
            )
        elif (
            old_block is not None
            and (old_block.address, old_block.size) != (block.address, block.size)
            and not block.private
        ):
            out.append(
                (
                    4,
                    "error",
                    f"PyTorch block at this address changed since the baseline "
                    f"([0x{old_block.address:x}, +{old_block.size}) -> [0x{block.address:x}, "
                    f"+{block.size}) {block.state})",
                    "the tensor the graph was captured with was freed and its memory given to another tensor: "
                    "keep it alive as long as the graph",
                )
            )
    return out


def _realloc(old: PointerFacts, now: PointerFacts) -> bool:
    if old.buffer_id and now.buffer_id and old.buffer_id != now.buffer_id:
        return True
    return bool(
        old.range_size and now.range_size and (old.range_start, old.range_size) != (now.range_start, now.range_size)
    )
