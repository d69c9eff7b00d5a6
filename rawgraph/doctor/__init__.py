"""The graph doctor: what makes a replay silently wrong, in any graph, and replays verified
against eager.

- :func:`check` (:mod:`.check`): a static report of every node's addresses and orderings, classes
  1 to 7 (dangling, stream-ordered pool, host memory, allocator-freed, unordered overlap,
  input-is-intermediate, conditional default / host callback / closed device graph), each decided
  from driver facts (:mod:`.facts`; classes 1 to 4 of one address in :mod:`.classify`), reported
  as :class:`Finding` and :class:`Report` (:mod:`.report`);
- :func:`verify`, :class:`Verifier`, :func:`watch` (:mod:`.verify`): replay against eager every N
  replays, and the first diverging node of a rawgraph graph;
- :mod:`.faults`: one seeded fault per class (tests and ``rawgraph doctor --demo``).

Layer: imports runtime, graphs and updates; PyTorch and CuPy only inside the functions that use them.
"""

from .check import CLASS_NAMES, DoctorError, Finding, Report, check, classify_pointer
from .facts import PointerFacts, TorchBlock, TorchView, pointer_facts
from .verify import (
    Mismatch,
    ReplayMismatchWarning,
    VerifiedExec,
    Verifier,
    VerifyError,
    VerifyResult,
    verified,
    verify,
    watch,
)

__all__ = [
    "CLASS_NAMES",
    "DoctorError",
    "Finding",
    "Mismatch",
    "PointerFacts",
    "ReplayMismatchWarning",
    "Report",
    "TorchBlock",
    "TorchView",
    "VerifiedExec",
    "VerifyError",
    "VerifyResult",
    "Verifier",
    "check",
    "classify_pointer",
    "pointer_facts",
    "verified",
    "verify",
    "watch",
]
