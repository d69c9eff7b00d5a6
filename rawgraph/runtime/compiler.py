"""Run-time compilation with NVRTC (``cuda.bindings.nvrtc``) and an on-disk cache.

CUBIN for the exact compute capability is the default: PTX from a newer NVRTC (13.5 from pip) is
refused by an older driver (580, CUDA 13.0) with ``CUDA_ERROR_UNSUPPORTED_PTX_VERSION``,
while a CUBIN is machine code the driver loads as is. PTX is available as an explicit option.

Cache entries are keyed by source, options, name expressions, NVRTC version, architecture,
format, and the path and content of every header the compile can read (:func:`compile_source`
says which). Each file carries a header with the payload's SHA-256 and length, so a truncated or
corrupt entry is detected and recompiled, never loaded. Entries are written to a temporary file
and renamed into place, so concurrent processes never see (or make) a half-written entry.

The SHA-256 detects damage, not tampering: whoever can write the cache can plant an image (and
the symbol loaded from it) under a key computed in advance. So the cache trusts only what this
user alone can write: the directory is created 0700 (with each parent it creates), an existing
one is refused (a :class:`CacheWarning`, and the compile goes on without the cache) when it is a
symbolic link, is not owned by this user, or is writable by group or others; an entry that is
not a regular file of this user's, writable by no one else, is ignored (and replaced by a rename,
which only the directory's owner can do). Entries are opened with ``O_NOFOLLOW`` relative to the
opened directory, so neither check can be raced by swapping a path.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import struct
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from cuda.bindings import nvrtc

from .errors import NvrtcError, RawgraphWarning, nvrtc_check

CACHE_ENV = "RAWGRAPH_CACHE_DIR"
_MAGIC = b"RGKCACHE"
_SCHEMA = 1
DEFAULT_OPTIONS = ("-std=c++17",)


class CacheWarning(RawgraphWarning, RuntimeWarning):
    """The kernel cache was not used (a directory or entry others could have written, or one that
    cannot be written): the compile goes on without it, and the warning says why."""


def nvrtc_version() -> tuple[int, int]:
    """NVRTC's ``(major, minor)`` (``nvrtcVersion``).

    See Also
    --------
    nvrtcVersion : https://docs.nvidia.com/cuda/nvrtc/index.html
    """
    return tuple(nvrtc_check(nvrtc.nvrtcVersion(), "nvrtcVersion"))


def supported_archs() -> list[int]:
    """Compute capabilities this NVRTC can compile CUBIN for, e.g. ``[75, 80, ..., 90, ...]``."""
    return [int(a) for a in nvrtc_check(nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")]


def default_cache_dir() -> Path:
    """``$RAWGRAPH_CACHE_DIR``, else ``$XDG_CACHE_HOME/rawgraph/kernels``, else ``~/.cache/rawgraph/kernels``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rawgraph" / "kernels"


@dataclass(frozen=True)
class CompiledImage:
    """A compiled module image and what is needed to load it.

    Attributes
    ----------
    image : bytes
        CUBIN (ELF) or PTX text.
    fmt : str
        ``"cubin"`` or ``"ptx"``.
    arch : str
        ``"sm_90"`` and the like.
    lowered : dict
        Name expression (``"matvec_kernel<0, 4, 64, 4>"``) -> mangled symbol to load.
    log : str
        NVRTC's log (warnings), empty when clean.
    from_cache : bool
    """

    image: bytes
    fmt: str
    arch: str
    lowered: dict[str, str] = field(default_factory=dict)
    log: str = ""
    from_cache: bool = False


class KernelCache:
    """Directory of compiled images; see the module docstring for the format and the trust rules."""

    directory: Path

    def __init__(self, directory: str | os.PathLike[str] | None = None):
        self.directory = Path(directory) if directory is not None else default_cache_dir()
        self._warned: set[str] = set()

    def key(
        self,
        source: str,
        arch: str,
        fmt: str,
        names: Sequence[str],
        options: Sequence[str],
        headers: Sequence[Sequence[str]] = (),
    ) -> str:
        """SHA-256 of everything the image depends on; ``headers`` are :func:`_headers`' records."""
        blob = json.dumps(
            {
                "schema": _SCHEMA,
                "source": source,
                "arch": arch,
                "fmt": fmt,
                "names": list(names),
                "options": list(options),
                "nvrtc": list(nvrtc_version()),
                "headers": [list(h) for h in headers],
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.bin"

    def load(self, key: str) -> CompiledImage | None:
        """The entry for ``key``, or None when missing, truncated, corrupt or not trusted."""
        fd = self._open_directory(create=False)
        if fd is None:
            return None
        try:
            data = self._read_entry(fd, f"{key}.bin")
        finally:
            os.close(fd)
        if data is None:
            return None
        try:
            if data[:8] != _MAGIC:
                return None
            (hlen,) = struct.unpack_from("<I", data, 8)
            header = json.loads(data[12 : 12 + hlen].decode())
            payload = data[12 + hlen :]
            if header["key"] != key or len(payload) != header["size"]:
                return None
            if hashlib.sha256(payload).hexdigest() != header["sha256"]:
                return None
            return CompiledImage(payload, header["fmt"], header["arch"], header["lowered"], header["log"], True)
        except (ValueError, KeyError, struct.error, UnicodeDecodeError, TypeError):
            return None

    def store(self, key: str, entry: CompiledImage) -> None:
        """Write atomically: a new 0600 file (``O_EXCL``) in the trusted directory, renamed over the
        entry (``os.replace``). A cache that can't be written, or is not trusted, only warns."""
        header = json.dumps(
            {
                "key": key,
                "size": len(entry.image),
                "sha256": hashlib.sha256(entry.image).hexdigest(),
                "fmt": entry.fmt,
                "arch": entry.arch,
                "lowered": entry.lowered,
                "log": entry.log,
            }
        ).encode()
        fd = self._open_directory(create=True)
        if fd is None:
            return
        tmp = f".{key[:16]}.{os.urandom(8).hex()}.tmp"
        try:
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd)
            try:
                with os.fdopen(out, "wb") as f:
                    f.write(_MAGIC + struct.pack("<I", len(header)) + header + entry.image)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, f"{key}.bin", src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=fd)
                except OSError:
                    pass
                raise
        except OSError as exc:
            self._warn(f"rawgraph kernel cache not written ({self.directory}): {exc}")
        finally:
            os.close(fd)

    def _open_directory(self, create: bool) -> int | None:
        """A descriptor of the cache directory when it is trusted (a real directory of this user's,
        not writable by group or others); None when it is missing (and ``create`` is False) or
        refused, after a :class:`CacheWarning`. Owner and mode are read from the opened directory
        (``fstat``), so a path swapped after the check changes nothing."""
        path = self.directory
        if create:
            try:
                _make_private_dirs(path)
            except OSError as exc:
                self._warn(f"rawgraph kernel cache not written ({path}): {exc}")
                return None
        try:
            mode = os.lstat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return None  # nothing cached yet
        if stat.S_ISLNK(mode):
            self._refuse("is a symbolic link")
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as exc:
            self._refuse(f"cannot be opened as a directory ({exc})")
            return None
        st = os.fstat(fd)
        why = (
            f"is owned by uid {st.st_uid}, not this user (uid {os.getuid()})"
            if st.st_uid != os.getuid()
            else f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
            if st.st_mode & 0o022
            else ""
        )
        if why:
            os.close(fd)
            self._refuse(why)
            return None
        return fd

    def _read_entry(self, fd: int, name: str) -> bytes | None:
        """The bytes of entry ``name`` in the opened directory ``fd``, or None when it is missing or
        not trusted: a symbolic link (``O_NOFOLLOW``), not a regular file, not owned by this user,
        or writable by group or others (checked with ``fstat`` on the opened file)."""
        try:
            f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
        except FileNotFoundError:
            return None
        except OSError as exc:  # ELOOP: a symbolic link
            self._warn(f"rawgraph kernel cache entry {self.directory / name} ignored: {exc}")
            return None
        try:
            st = os.fstat(f)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
                self._warn(
                    f"rawgraph kernel cache entry {self.directory / name} ignored: not a regular file of "
                    f"this user's writable by no one else (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})"
                )
                return None
            with os.fdopen(f, "rb", closefd=False) as stream:
                return stream.read()
        except OSError:
            return None
        finally:
            os.close(f)

    def _refuse(self, why: str) -> None:
        self._warn(
            f"rawgraph kernel cache {self.directory} {why}: compiling without the cache (make it a directory "
            f"of your own that group and others cannot write: chmod 700)"
        )

    def _warn(self, message: str) -> None:
        """Each message once per cache object (a compile both looks up and stores), attributed to
        the first caller outside this module."""
        if message in self._warned:
            return
        self._warned.add(message)
        frame: FrameType | None = sys._getframe()
        level = 1
        while frame is not None and frame.f_globals.get("__name__") == __name__:
            frame, level = frame.f_back, level + 1
        warnings.warn(message, CacheWarning, stacklevel=level)


def _make_private_dirs(path: Path) -> None:
    """Create ``path`` and each missing parent with mode 0700 (``Path.mkdir(parents=True)`` gives
    the parents the default mode). Existing ones are left as they are: the trust check is the
    cache directory's own."""
    missing = []
    while not os.path.lexists(path) and path.parent != path:
        missing.append(path)
        path = path.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass


def _program_log(prog: nvrtc.nvrtcProgram) -> str:
    size = nvrtc_check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
    buf = _out_buffer(size)
    nvrtc_check(nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
    return bytes(buf).rstrip(b"\0 ").decode(errors="replace")


def _out_buffer(size: int) -> bytearray:
    """A fresh, writable buffer for NVRTC to fill.

    Never ``bytes``: NVRTC writes into the buffer it is given, and CPython keeps every one-byte
    ``bytes`` as one shared interpreter object, so an empty log (size 1, a lone NUL) written into a
    one-byte ``bytes`` would turn the interpreter's space byte into NUL for the whole process.
    """
    return bytearray(max(int(size), 1))


# A source that needs an architecture-specific feature (sm_90a's wgmma) says so with a line
# ``#define RG_ARCH_SPECIFIC_SM 90``: asked for exactly that architecture (``sm_90``), it is compiled
# for its ``a`` form (``sm_90a``), whose CUBIN loads only on that exact compute capability. Every
# other source, and that source for any other architecture, compiles for the architecture given.
_ARCH_SPECIFIC = re.compile(r"^[ \t]*#[ \t]*define[ \t]+RG_ARCH_SPECIFIC_SM[ \t]+(\d+)[ \t]*$", re.M)


def arch_for_source(source: str, arch: str) -> str:
    """The architecture :func:`compile_source` compiles ``source`` for when asked for ``arch``:
    ``arch`` itself, or its architecture-specific form (``"sm_90"`` -> ``"sm_90a"``) where the
    source defines ``RG_ARCH_SPECIFIC_SM`` as that compute capability (``90``)."""
    m = _ARCH_SPECIFIC.search(source)
    return f"{arch}a" if m is not None and arch == f"sm_{m.group(1)}" else arch


def _check_arch(arch: str, fmt: str) -> int:
    if not (arch.startswith("sm_") and arch[3:].rstrip("af").isdigit()):
        raise ValueError(f"arch must look like 'sm_90', got {arch!r}")
    cc = int(arch[3:].rstrip("af"))
    if cc not in supported_archs():
        major, minor = nvrtc_version()
        raise NvrtcError(
            "NVRTC_ERROR_INVALID_OPTION",
            f"NVRTC {major}.{minor} cannot compile for {arch} (supported: {supported_archs()})",
        )
    return cc


# An #include (or #include_next) directive, and what follows it on the line; only where the
# '#' starts its line (after blanks), which _header_names checks. Searched from the '#' rather
# than anchored at each line start: the regex engine then skips to each '#' (a literal prefix),
# several times faster over a toolkit's megabytes of headers.
_INCLUDE = re.compile(r"#[ \t]*include(?:_next)?\b(.*)")
# A header name as written: "name" or <name>.
_HEADER_NAME = re.compile(r'[ \t]*(?:"([^"\n]+)"|<([^>\n]+)>)')
# __has_include("name") / __has_include(<name>): whether a file exists changes the code too.
_HAS_INCLUDE = re.compile(r'__has_include(?:_next)?[ \t]*\([ \t]*(?:"([^"\n]+)"|<([^>\n]+)>)[ \t]*\)')
# NVRTC's precompiled-header options (--pch, --create-pch, --use-pch, --pch-dir, ...).
_PCH_OPTION = re.compile(r"--?[a-z-]*pch[a-z-]*")


def _include_options(options: Sequence[str]) -> tuple[list[str], list[str]] | None:
    """The include directories (``-I``, ``--include-path``) and pre-included headers
    (``-include``, ``--pre-include``) among NVRTC ``options``, each given as ``-Ix``, ``-I=x``,
    ``--opt=x`` or ``--opt x``; None when an option brings in files the key cannot cover
    (precompiled headers)."""
    dirs: list[str] = []
    pre: list[str] = []
    opts = [str(o) for o in options]
    i = 0
    while i < len(opts):
        name, eq, value = opts[i].partition("=")
        if name in ("-I", "--include-path", "-include", "--pre-include"):
            if not eq and i + 1 < len(opts):  # the value is the next option
                i += 1
                value = opts[i]
            (dirs if name in ("-I", "--include-path") else pre).append(value)
        elif name.startswith("-I"):  # -Idir (a '=' inside it is part of the directory)
            dirs.append(opts[i][2:])
        elif _PCH_OPTION.fullmatch(name):
            return None
        i += 1
    return dirs, pre


def _header_names(text: str) -> tuple[set[str], set[str]] | None:
    """Every header name ``text`` names in an ``#include`` / ``#include_next`` directive or a
    ``__has_include``, active or not (a superset of what the preprocessor opens), as two sets:
    those written ``"name"`` and those written ``<name>``. None when a directive names its header
    through a macro (which file that is is the preprocessor's to say)."""
    quoted: set[str] = set()
    angled: set[str] = set()
    for m in _INCLUDE.finditer(text):
        if text[text.rfind("\n", 0, m.start()) + 1 : m.start()].strip(" \t"):
            continue  # not a directive: something precedes the '#' on its line
        got = _HEADER_NAME.match(m.group(1))
        if got is None:
            return None
        (quoted.add(got.group(1)) if got.group(1) else angled.add(got.group(2)))
    for m in _HAS_INCLUDE.finditer(text):
        (quoted.add(m.group(1)) if m.group(1) else angled.add(m.group(2)))
    return quoted, angled


# The header names of a file's content, by its SHA-256 (hashed for the key anyway): a process
# compiling or looking up several kernels that include the same toolkit headers scans them once.
# Content-addressed, so never stale; frozen, so no caller can change an entry; cleared when it
# grows past a bound.
_names_by_digest: dict[str, tuple[frozenset[str], frozenset[str]] | None] = {}


_GONE: tuple[str, tuple[frozenset[str], frozenset[str]]] = (
    "",
    (frozenset(), frozenset()),
)  # _scan_header: no file there after all (skipped, not fatal)


def _scan_header(real: str) -> tuple[str, tuple[frozenset[str], frozenset[str]]] | None:
    """``(SHA-256, (quoted names, angled names))`` of the header at ``real``; :data:`_GONE` when
    there is no file there after all, None when what NVRTC would read of it is unknown (it
    cannot be read, or it includes a macro). The names are memoized by content."""
    try:
        with open(real, "rb") as f:
            data = f.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return _GONE
    except OSError:
        return None
    digest = hashlib.sha256(data).hexdigest()
    try:
        inner = _names_by_digest[digest]
    except KeyError:  # read once, kept in a local: another thread may clear the memo meanwhile
        scanned = _header_names(data.decode("utf-8", "replace"))
        inner = None if scanned is None else (frozenset(scanned[0]), frozenset(scanned[1]))
        if len(_names_by_digest) >= 16384:
            _names_by_digest.clear()
        _names_by_digest[digest] = inner
    return None if inner is None else (digest, inner)


def _headers(source: str, source_name: str, options: Sequence[str]) -> list[tuple[str, str]] | None:
    """What the cache key needs of the files a compile of ``source`` can read: ``(real path,
    SHA-256 of the content)`` of every file that an include or pre-include names, in any place
    the preprocessor could look it up, followed through those files' own includes; and
    ``(name, "absent")`` for a name found nowhere.

    The places are a superset of the preprocessor's, not its first match. A ``<name>`` is looked
    up in each include directory: NVRTC looks for angled names there only (not beside the source
    or the including file). A ``"name"`` (and a pre-included header) also in the source's
    directory (``source_name`` relative to the working directory) and in the directory of every
    header found (where its own quoted includes are looked up), until no new file turns up.
    NVRTC looks nowhere else (no system directories, no ``CPATH``), so a name found nowhere is
    built into NVRTC (keyed by its version) or fails the compile, and the key changes once a
    file of that name appears. None when the compile reads files that cannot be named here (an
    ``#include`` of a macro, a header that cannot be read, precompiled headers): such a compile
    is not cached.
    """
    # One worklist loop over (name, place) pairs, kept whole (about 70 lines): the queue, the
    # places and the two name sets grow inside it and each step reads all of them, so a split
    # would pass five mutable collections between the parts.
    parsed = _include_options(options)
    got = _header_names(source)
    if parsed is None or got is None:
        return None
    dirs, pre = parsed
    quoted, angled = got
    quoted.update(pre)
    # Real paths: a directory reached through a symbolic link is one place, so this ends.
    searched = list(dict.fromkeys(os.path.realpath(d) for d in dirs))
    places = list(dict.fromkeys([os.path.realpath(os.path.dirname(source_name) or ".")] + searched))
    known = set(places)
    files: dict[str, str] = {}
    found: set[str] = set()
    # Every (name, place) pair is looked at once: a name new to a set is queued in the places
    # its form is looked up in, a place new to the list with every quoted name. The result is
    # the fixpoint of retrying every name in every place until nothing changes, in one lookup
    # per pair instead of that times the include depth: a toolkit header such as CCCL's
    # <cuda/std/...> names hundreds of files, and the retry loop spent seconds on a cache hit.
    real_dirs: dict[str, str] = {}
    queue = [(n, p) for n in sorted(quoted) for p in places] + [(n, p) for n in sorted(angled) for p in searched]
    tried: set[tuple[str, str]] = set()
    while queue:
        name, place = queue.pop()
        if os.path.isabs(name):
            place = ""
        if (name, place) in tried:
            continue
        tried.add((name, place))
        path = os.path.join(place, name)
        try:
            mode = os.stat(path).st_mode  # one call for the common miss
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError:  # there, but what NVRTC would read of it is unknown
            return None
        if stat.S_ISDIR(mode):
            continue
        # Its quoted includes are looked up beside the path it was opened by: each such
        # directory is a place, also for a file already reached through another path.
        parent = os.path.dirname(path)
        here = real_dirs.get(parent)
        if here is None:
            here = real_dirs[parent] = os.path.realpath(parent)
        if here not in known:
            known.add(here)
            places.append(here)
            queue.extend((n, here) for n in quoted)
        # ``here`` has no link in it: the file's real path is ``here`` and its name unless the
        # file itself is a link (one lstat, not one per component as realpath does).
        real = os.path.join(here, os.path.basename(path))
        try:
            if stat.S_ISLNK(os.lstat(real).st_mode):
                real = os.path.realpath(real)
        except OSError:
            return None  # gone or changed since the stat: what NVRTC reads is unknown
        if real in files:
            found.add(name)
            continue
        scanned = _scan_header(real)
        if scanned is _GONE:
            continue
        if scanned is None:
            return None
        digest, inner = scanned
        files[real] = digest
        found.add(name)
        for n in sorted(inner[0] - quoted):
            quoted.add(n)
            queue.extend((n, p) for p in places)
        for n in sorted(inner[1] - angled):
            angled.add(n)
            queue.extend((n, p) for p in searched)
    return sorted(files.items()) + [(name, "absent") for name in sorted((quoted | angled) - found)]


class MissingHeadersError(NvrtcError):
    """A kernel includes a CUDA toolkit header (``<cuda_fp16.h>``, ``<cooperative_groups.h>``,
    ``<cuda/std/...>``, ``<mma.h>``) that no installed package provides; the message names the
    pip package to install.

    Attributes
    ----------
    headers : list of str
        The toolkit headers the compile could not open.
    packages : list of str
        The wheels that ship them (``nvidia-cuda-runtime``, ``nvidia-cuda-crt``,
        ``nvidia-cuda-cccl``).
    """

    headers: list[str]
    packages: list[str]


# The CUDA toolkit headers a user's kernel may include, by the cuda.pathfinder name of their
# include directory: the runtime's (cuda_fp16.h, cuda_bf16.h, cooperative_groups.h, mma.h, ...)
# and CCCL's (cuda/std/..., cuda/..., nv/target, cub/..., thrust/...). Each is passed to NVRTC
# as an include directory after the caller's own, so a directory the caller gives wins.
TOOLKIT_HEADER_LIBS = ("cudart", "cccl")
# A header name that belongs to the toolkit -> (cuda.pathfinder name, the wheel that ships it,
# a path under that include directory that only the wheel puts there). crt/ comes from its own
# wheel but lands in the runtime's include directory (mma.h includes crt/mma.h).
_TOOLKIT_NAMES: tuple[tuple[re.Pattern[str], str, str, str], ...] = (
    (re.compile(r"(?:cuda|nv|cub|thrust)/.+"), "cccl", "nvidia-cuda-cccl", ""),
    (re.compile(r"crt/.+"), "cudart", "nvidia-cuda-crt", "crt"),
    (
        re.compile(
            r"(?:cuda\w*|cooperative_groups|mma|sm_\d+_\w+|device_\w+|vector_\w+|math_\w+|host_\w+|driver_\w+"
            r"|(?:surface|texture)_\w+|builtin_types|channel_descriptor|library_types|cuComplex|common_functions"
            r")\.h(?:pp)?|cooperative_groups/.+"
        ),
        "cudart",
        "nvidia-cuda-runtime",
        "",
    ),
)
# NVRTC's words for an #include it could not open (with and without any include directory).
_NOT_OPENED = re.compile(r'(?:could not|cannot) open source file "([^"\n]+)"')


def _locate_headers(lib: str) -> str | None:
    """cuda.pathfinder's include directory for ``lib`` (``"cudart"``, ``"cccl"``): the installed
    wheels first, then ``$CUDA_PATH`` / ``$CUDA_HOME`` and a system toolkit; None when there is
    none. cuda.pathfinder remembers each answer for the process."""
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        found = find_nvidia_header_directory(lib)
    except Exception:  # a lookup that fails (no or an older cuda.pathfinder, a broken toolkit) finds nothing
        return None
    return str(found) if found else None


def toolkit_include_dirs() -> list[str]:
    """The include directories of the CUDA toolkit headers found here (the runtime's, then
    CCCL's), as :func:`compile_source` passes them to NVRTC for a source that names a header.
    rawgraph's dependencies install them (``cuda-toolkit[cudart,crt,cccl]``, the release of the
    NVRTC it uses); empty when none are found."""
    return [d for d in (_locate_headers(lib) for lib in TOOLKIT_HEADER_LIBS) if d]


def _toolkit_options(source: str, options: Sequence[str]) -> list[str]:
    """``-I`` options for the toolkit include directories not already among ``options``; none
    for a source that names no header (and pre-includes none): rawgraph's own kernels splice
    theirs in, so their options, cache keys and compiles stay exactly as they were, and the
    toolkit is never looked for on their account."""
    parsed = _include_options(options)
    names = _header_names(source)
    if names is not None and not names[0] and not names[1] and (parsed is None or not parsed[1]):
        return []
    given = {os.path.realpath(d) for d in parsed[0]} if parsed is not None else set()
    return [f"-I{d}" for d in toolkit_include_dirs() if os.path.realpath(d) not in given]


def _missing_headers(exc: NvrtcError) -> NvrtcError:
    """``exc`` as a :class:`MissingHeadersError` when its log says a toolkit header could not be
    opened and the package that ships that header is not installed; else ``exc`` itself (a name
    mistyped, or a header the installed toolkit does not have, is the compiler's error)."""
    missing: dict[str, str] = {}
    for name in dict.fromkeys(_NOT_OPENED.findall(exc.log)):
        for pattern, lib, package, marker in _TOOLKIT_NAMES:
            if pattern.fullmatch(name):
                where = _locate_headers(lib)
                if where is None or (marker and not os.path.isdir(os.path.join(where, marker))):
                    missing[name] = package
                break
    if not missing:
        return exc
    major, minor = nvrtc_version()
    packages = sorted(set(missing.values()))
    err = MissingHeadersError(
        exc.name,
        f"{', '.join(f'<{n}>' for n in missing)}: CUDA toolkit header{'s' if len(missing) > 1 else ''} that no "
        f"installed package provides ({' and '.join(packages)}); install the headers of this NVRTC ({major}.{minor}) "
        f'with: pip install "cuda-toolkit[cudart,crt,cccl]=={major}.{minor}.*" (rawgraph\'s own dependencies '
        f"include them), or point $CUDA_PATH at a CUDA toolkit",
        exc.log,
        exc.source_name,
    )
    err.headers = list(missing)
    err.packages = packages
    return err


def compile_source(
    source: str,
    source_name: str,
    arch: str,
    names: Sequence[str] = (),
    options: Sequence[str] = DEFAULT_OPTIONS,
    fmt: str = "cubin",
    cache: KernelCache | None | bool = True,
) -> CompiledImage:
    """Compile CUDA C++ with NVRTC, through the cache.

    A source that names a header (``#include``, ``__has_include``, ``-include``) can include the
    CUDA toolkit's (``<cuda_fp16.h>``, ``<cooperative_groups.h>``, ``<cuda/std/...>``,
    ``<mma.h>``): the include directories :func:`toolkit_include_dirs` finds are passed after the
    caller's ``options``, so a directory the caller gives is searched first. A source that names
    none compiles with ``options`` as given.

    The cache key covers every header the compile can read: the path and content of each file
    named by an ``#include`` of the source (quoted ones looked up beside the source, beside each
    header found and in each include directory; angled ones in each include directory, the only
    place NVRTC looks for them; then through those headers' own includes) or by ``-include`` /
    ``--pre-include``, so editing a header recompiles, in any process. A compile
    whose headers cannot be named that way (an ``#include`` of a macro, precompiled-header
    options) is never cached: it compiles every time. A header edited while NVRTC runs leaves no
    entry (which version was read is unknown). rawgraph's own kernels splice their headers into
    the source (:func:`~rawgraph.runtime.module.kernel_source`) and name none.

    Parameters
    ----------
    source : str
        CUDA C++ source.
    source_name : str
        File name shown in diagnostics; NVRTC also looks for quoted includes in its directory
        (relative to the working directory).
    arch : str
        Real architecture, e.g. ``"sm_90"``. For ``fmt="cubin"`` this is the machine code made;
        for ``fmt="ptx"`` the matching virtual architecture (``compute_90``) is used. A source
        that defines ``RG_ARCH_SPECIFIC_SM`` as this architecture's compute capability is compiled
        for its ``a`` form (:func:`arch_for_source`; ``CompiledImage.arch`` says which).
    names : sequence of str
        Name expressions (template instantiations, ``nvrtcAddNameExpression``) to instantiate and
        look up; their mangled names come back in ``lowered``.
    options : sequence of str
        Extra NVRTC options (the architecture option is added here).
    fmt : {"cubin", "ptx"}
    cache : KernelCache, True (default directory) or False/None (no cache)
        A cache directory others could write is not used (:class:`CacheWarning`); see the module
        docstring.

    Raises
    ------
    MissingHeadersError
        The source includes a CUDA toolkit header that no installed package provides (an
        :class:`NvrtcError`; the message names the package to install).
    NvrtcError
        Compilation failed; ``.log`` holds NVRTC's complete log.

    See Also
    --------
    nvrtcAddNameExpression : https://docs.nvidia.com/cuda/nvrtc/index.html
    """
    if fmt not in ("cubin", "ptx"):
        raise ValueError(f"fmt must be 'cubin' or 'ptx', got {fmt!r}")
    arch = arch_for_source(source, arch)
    _check_arch(arch, fmt)
    if cache is True:
        cache = KernelCache()
    all_options = (
        list(options)
        + _toolkit_options(source, options)
        + [f"--gpu-architecture={arch if fmt == 'cubin' else arch.replace('sm_', 'compute_')}"]
    )
    key = None
    headers = _headers(source, source_name, all_options) if cache else None
    if cache and headers is not None:
        key = cache.key(source, arch, fmt, names, all_options, headers)
        hit = cache.load(key)
        if hit is not None:
            return hit
    try:
        entry = _compile(source, source_name, arch, names, all_options, fmt)
    except NvrtcError as exc:
        named = _missing_headers(exc)
        if named is exc:
            raise
        raise named from None  # the same error and log, with the package to install
    if cache and key is not None and _headers(source, source_name, all_options) == headers:
        cache.store(key, entry)
    return entry


def _compile(
    source: str, source_name: str, arch: str, names: Sequence[str], options: list[str], fmt: str
) -> CompiledImage:
    prog = nvrtc_check(
        nvrtc.nvrtcCreateProgram(source.encode(), source_name.encode(), 0, [], []), "nvrtcCreateProgram", source_name
    )
    try:
        for expr in names:
            nvrtc_check(nvrtc.nvrtcAddNameExpression(prog, expr.encode()), "nvrtcAddNameExpression", source_name)
        opts = [o.encode() for o in options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        log = _program_log(prog)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise NvrtcError(nvrtc.nvrtcResult(int(err)).name, "compilation failed", log, source_name)
        if fmt == "cubin":
            size = nvrtc_check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize", source_name)
            image = _out_buffer(size)
            nvrtc_check(nvrtc.nvrtcGetCUBIN(prog, image), "nvrtcGetCUBIN", source_name)
        else:
            size = nvrtc_check(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize", source_name)
            image = _out_buffer(size)
            nvrtc_check(nvrtc.nvrtcGetPTX(prog, image), "nvrtcGetPTX", source_name)
        lowered = {}
        for expr in names:
            sym = nvrtc_check(nvrtc.nvrtcGetLoweredName(prog, expr.encode()), "nvrtcGetLoweredName", source_name)
            lowered[expr] = sym.decode() if isinstance(sym, bytes) else str(sym)
        return CompiledImage(bytes(image), fmt, arch, lowered, log, False)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
