"""Launch builders for the kernels in ``kernels/``: launch shape, checked operands, named arguments.

Each builder validates its operands once, at plan time, and returns a :class:`~rawgraph.Launch`
whose arguments are already packed. Nothing here runs per call. ``gemm`` holds the matmul family
and the one-kernel block, ``pointwise`` the elementwise kernels, ``rows`` the row gathers and
scatters of the slot pool.
"""

from .gemm import *  # noqa: F401,F403
from .gemm import MatmulShape, _cdiv, _pick_split  # noqa: F401
from .pointwise import add, count_mismatch, empty, fill_uniform, relu, spin  # noqa: F401
from .rows import ROW_PARAM_CAPS, gather_rows, gather_rows_param, row_param_cap, scatter_rows, scatter_rows_param  # noqa: F401
