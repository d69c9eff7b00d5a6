"""What a CUBIN says about its kernels, read from the ELF image alone (no driver).

NVRTC's CUBIN is an ELF64 little-endian image. Each kernel ``sym`` has a ``.text.<sym>`` section
and, when it has parameters or attributes, a ``.nv.info.<sym>`` section of attribute records.
:func:`cubin_kernels` reads, for each kernel, the parameter layout the driver reports through
``cuFuncGetParamInfo`` once the image is loaded (``EIATTR_KPARAM_INFO``: each parameter's offset
and size) and the cluster shape compiled in with ``__cluster_dims__`` (``EIATTR_CTA_PER_CLUSTER``).
So a kernel compiled for an architecture this machine does not have (or on a machine with no
driver at all) can have its parameter layout checked.

Record format of a ``.nv.info`` section, records 4-byte aligned: a format byte, an attribute
byte, then 2 bytes (unused for ``EIFMT_NVAL`` (1), the value for ``EIFMT_BVAL`` / ``EIFMT_HVAL``
(2, 3)) or, for ``EIFMT_SVAL`` (4), a 16-bit size and that many bytes. ``EIATTR_KPARAM_INFO``
(0x17) carries ``u32 index, u16 ordinal, u16 offset, u32 flags`` with the parameter's size in
bits 18-31 of ``flags``; ``EIATTR_CTA_PER_CLUSTER`` (0x3d) three ``u32``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_EIFMT_SVAL = 4
_EIATTR_KPARAM_INFO = 0x17
_EIATTR_CTA_PER_CLUSTER = 0x3D
_ELF_HEADER = 64  # bytes of an ELF64 file header
_SECTION_HEADER = 64  # bytes of an ELF64 section header


@dataclass(frozen=True)
class CubinKernel:
    """One kernel of a CUBIN.

    Attributes
    ----------
    params : list of (offset, size)
        Each parameter's byte offset and size in the parameter buffer, by ordinal (what
        ``cuFuncGetParamInfo`` answers for the loaded function); ``[]`` for a kernel without
        parameters.
    cluster_dims : (x, y, z)
        The cluster shape compiled in with ``__cluster_dims__``, ``(0, 0, 0)`` without one.

    See Also
    --------
    cuFuncGetParamInfo : https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__EXEC.html
    """

    params: list[tuple[int, int]]
    cluster_dims: tuple[int, int, int] = (0, 0, 0)


def cubin_kernels(image: bytes) -> dict[str, CubinKernel]:
    """Kernel symbol (the mangled name, as ``CompiledImage.lowered`` gives it) -> its
    :class:`CubinKernel`, for every ``.text.<sym>`` or ``.nv.info.<sym>`` section of ``image``.

    Raises
    ------
    ValueError
        ``image`` is not an ELF64 little-endian image, or a header, section or record runs past
        its end (a truncated or damaged image is refused, never read past).
    """
    data = bytes(image)
    if data[:4] != b"\x7fELF" or len(data) < _ELF_HEADER:
        raise ValueError("not a CUBIN: no ELF header")
    if data[4] != 2 or data[5] != 1:
        raise ValueError("not a CUBIN: not a 64-bit little-endian ELF image")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shentsize < _SECTION_HEADER or shnum == 0 or shstrndx >= shnum or shoff + shnum * shentsize > len(data):
        raise ValueError("not a CUBIN: its section header table is missing or runs past the image")
    sections = []
    for i in range(shnum):
        name, typ, _flags, _addr, offset, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        # SHT_NOBITS (8) takes no space in the file: its offset and size say nothing of the image.
        if typ != 8 and offset + size > len(data):
            raise ValueError(f"damaged CUBIN: section {i} runs past the image")
        sections.append((name, typ, offset, size))
    _n, _t, strtab, strsize = sections[shstrndx]

    def section_name(off: int) -> str:
        end = data.find(b"\0", strtab + off, strtab + strsize)
        if off >= strsize or end < 0:
            raise ValueError("damaged CUBIN: a section name runs past its string table")
        return data[strtab + off : end].decode("utf-8", "replace")

    kernels: dict[str, CubinKernel] = {}
    for name_off, _typ, offset, size in sections:
        name = section_name(name_off)
        if name.startswith(".text."):
            kernels.setdefault(name[len(".text.") :], CubinKernel([]))
        elif name.startswith(".nv.info."):
            kernels[name[len(".nv.info.") :]] = _info(data[offset : offset + size], name)
    return kernels


def _info(records: bytes, section: str) -> CubinKernel:
    """The parameters and cluster shape in one ``.nv.info.<sym>`` section's records."""
    params: dict[int, tuple[int, int]] = {}
    cluster = (0, 0, 0)
    p = 0
    while p + 4 <= len(records):
        fmt, attr = records[p], records[p + 1]
        if fmt == _EIFMT_SVAL:
            (n,) = struct.unpack_from("<H", records, p + 2)
            if p + 4 + n > len(records):
                raise ValueError(f"damaged CUBIN: a record of {section} runs past the section")
            payload = records[p + 4 : p + 4 + n]
            p += 4 + n
        else:
            payload, p = records[p + 2 : p + 4], p + 4
        if attr == _EIATTR_KPARAM_INFO and fmt == _EIFMT_SVAL and len(payload) >= 12:
            _index, ordinal, offset, flags = struct.unpack_from("<IHHI", payload)
            params[ordinal] = (offset, (flags >> 18) & 0x3FFF)
        elif attr == _EIATTR_CTA_PER_CLUSTER and fmt == _EIFMT_SVAL and len(payload) >= 12:
            x, y, z = struct.unpack_from("<III", payload)
            cluster = (x, y, z)
    if sorted(params) != list(range(len(params))):
        raise ValueError(f"damaged CUBIN: {section} describes parameters {sorted(params)}, not 0..{len(params) - 1}")
    return CubinKernel([params[i] for i in range(len(params))], cluster)
