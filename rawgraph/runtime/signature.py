"""Reading the C parameter types of a ``__global__`` function from CUDA source text.

``parse_signature(source, "saxpy")`` returns one :class:`Param` per argument, so a launch can pack
and check Python values without the user spelling the types twice. A tokenizer plus a declarator
reader, not a C++ parser: what it cannot read raises :class:`SignatureError` (the caller can then
give the argument types by hand).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import SignatureError


@dataclass(frozen=True)
class Param:
    """One kernel parameter: its name, normalised C type, packing kind and pointer role."""

    name: str
    ctype: str
    kind: str | None
    role: str | None


# Normalised scalar type -> kind. ``long`` is 64-bit: NVRTC follows the host ABI, LP64 on Linux.
# ``__half`` is really a 2-byte struct, but it is passed like an f16 scalar.
KINDS: dict[str, str] = {
    "bool": "bool",
    "char": "i8",
    "signed char": "i8",
    "unsigned char": "u8",
    "short": "i16",
    "unsigned short": "u16",
    "int": "i32",
    "unsigned int": "u32",
    "long": "i64",
    "unsigned long": "u64",
    "long long": "i64",
    "unsigned long long": "u64",
    "int8_t": "i8",
    "uint8_t": "u8",
    "int16_t": "i16",
    "uint16_t": "u16",
    "int32_t": "i32",
    "uint32_t": "u32",
    "int64_t": "i64",
    "uint64_t": "u64",
    "size_t": "u64",
    "ptrdiff_t": "i64",
    "intptr_t": "i64",
    "uintptr_t": "u64",
    "float": "f32",
    "double": "f64",
    "__half": "f16",
    "half": "f16",
    # CUDA typedefs of unsigned long long: 8-byte integers, not structs the caller must build.
    "cudaGraphConditionalHandle": "u64",
    "cudaTextureObject_t": "u64",
    "cudaSurfaceObject_t": "u64",
    "CUdeviceptr": "u64",
}

# Comments, literals and preprocessor lines are whole tokens, so nothing inside them can look
# like a declaration. Raw strings come before identifiers (``R"(...)"`` starts like one), and
# numbers take digit separators (``1'000``) so a ``'`` there does not open a character literal.
_TOKEN = re.compile(
    r"""(?P<skip>//[^\n]*|/\*.*?\*/|\\\n|[ \t\r\f\v]+)
    |(?P<nl>\n)
    |(?P<str>(?<!\w)(?:u8|u|U|L)?R"(?P<d>[^()\\\s]{0,16})\(.*?\)(?P=d)"
        |(?:u8|u|U|L)?"(?:\\.|[^"\\\n])*"|(?:u8|u|U|L)?'(?:\\.|[^'\\\n])*')
    |(?P<num>\.?\d(?:[eEpP][+-]|'?[\w.])*)
    |(?P<id>[A-Za-z_$]\w*)
    |(?P<op>::|\.\.\.|&&|->|.)""",
    re.DOTALL | re.VERBOSE,
)
_IDENT = re.compile(r"[A-Za-z_]\w*")
# Builtin type words; any mix of them is one scalar type (``long unsigned int``).
_BUILTIN = {"signed", "unsigned", "short", "long", "int", "char", "bool", "float", "double", "void"}
_QUALIFIERS = {"const", "volatile"}
_DROPPED = {
    "__restrict__",
    "__restrict",
    "restrict",
    "__grid_constant__",
    "struct",
    "class",
    "union",
    "enum",
    "typename",
    "register",
}
# Attribute-like words that take a parenthesised argument list between ``__global__`` and the
# name: skipped whole, so ``__launch_bounds__(256, 2)`` is never taken for the kernel.
_ATTRIBUTES = {
    "__launch_bounds__",
    "__cluster_dims__",
    "__maxnreg__",
    "__attribute__",
    "__declspec",
    "alignas",
    "__align__",
    "decltype",
}
_FWD = {"(": ")", "[": "]", "{": "}"}
_BACK = {")": "(", "]": "[", ">": "<"}


# A token's place among conditional groups: one (group, branch) pair per enclosing ``#if``,
# outermost first. Groups are numbered in source order, branches from 0 (``#elif``/``#else``
# start the next one), so two tokens the preprocessor can never both keep share a group number
# with different branches.
Branches = tuple[tuple[int, int], ...]
_OPEN = {"if", "ifdef", "ifndef"}
_NEXT = {"elif", "else", "elifdef", "elifndef"}


def _tokens(source: str) -> tuple[list[str], list[Branches]]:
    """Significant tokens (comments dropped, literals as ``""``, preprocessor lines removed) and
    the conditional branches each one sits in. Directives are not evaluated."""
    out: list[str] = []
    where: list[Branches] = []
    stack: list[tuple[int, int]] = []
    groups = 0
    line_start, directive, named = True, False, False
    for m in _TOKEN.finditer(source):
        kind = m.lastgroup  # the outer group: "str" for a raw string too, never "d"
        if kind == "nl":  # an unescaped newline ends a directive (``\\\n`` is a skip token)
            line_start, directive = True, False
        elif kind == "skip" or (directive and named):
            continue
        elif directive:  # the directive's name, the first token after ``#``
            named, word = True, m.group()
            if word in _OPEN:
                stack.append((groups, 0))
                groups += 1
            elif word in _NEXT and stack:
                stack[-1] = (stack[-1][0], stack[-1][1] + 1)
            elif word == "endif" and stack:
                stack.pop()
        elif line_start and m.group() == "#":
            directive, named = True, False
        else:
            line_start = False
            out.append('""' if kind == "str" else m.group())
            where.append(tuple(stack))
    return out, where


def _exclusive(where: list[Branches]) -> bool:
    """Whether these tokens include two from different branches of one ``#if`` group."""
    seen: dict[int, int] = {}
    return any(seen.setdefault(group, branch) != branch for path in where for group, branch in path)


def _match(toks: list[str], i: int, pairs: dict[str, str], step: int) -> int:
    """Index of the bracket matching ``toks[i]``, scanning by ``step`` (+1 forward, -1 back)."""
    stack: list[str] = []
    for j in range(i, len(toks) if step > 0 else -1, step):
        if toks[j] in pairs:
            stack.append(pairs[toks[j]])
        elif stack and toks[j] == stack[-1]:
            stack.pop()
            if not stack:
                return j
    raise SignatureError("unbalanced brackets")


def _depths(toks: list[str]) -> list[int]:
    """Bracket depth of each token (a bracket has its outer depth). In a type ``<>`` is a
    template's, so ``Foo<int, 2> s`` stays one parameter; inside ``()`` it is a comparison."""
    out: list[int] = []
    stack: list[str] = []
    for t in toks:
        angle = not stack or stack[-1] == ">"
        closing = t in (")", "]", "}") or (t == ">" and angle)
        if closing and (not stack or stack.pop() != t):
            raise SignatureError(f"unbalanced {t!r}")
        out.append(len(stack))
        if t in _FWD or (t == "<" and angle):
            stack.append(_FWD.get(t, ">"))
    if stack:
        raise SignatureError("unbalanced brackets")
    return out


def _split(toks: list[str]) -> list[list[str]]:
    """Split on top-level commas."""
    parts: list[list[str]] = [[]]
    for t, d in zip(toks, _depths(toks)):
        if t == "," and d == 0:
            parts.append([])
        else:
            parts[-1].append(t)
    return parts


def _template_types(toks: list[str], g: int) -> set[str]:
    """Names of the template *type* parameters of the declaration whose ``__global__`` is at
    ``g``; non-type ones (``int N``) never appear in a parameter type, so they are left out."""
    j = g - 1
    while j >= 0 and (_IDENT.fullmatch(toks[j]) or toks[j] in ('""', ")", "]")):
        j = _match(toks, j, _BACK, -1) - 1 if toks[j] in ")]" else j - 1  # extern "C", static, attrs
    if j < 1 or toks[j] != ">":
        return set()
    k = _match(toks, j, _BACK, -1)
    if k < 1 or toks[k - 1] != "template":
        return set()
    names: set[str] = set()
    for part in _split(toks[k + 1 : j]):
        part = part[: part.index("=")] if "=" in part else part
        if len(part) >= 2 and part[0] in ("typename", "class", "template") and _IDENT.fullmatch(part[-1]):
            names.add(part[-1])
    return names


def _render(toks: list[str]) -> str:
    """Join type tokens with C spacing: ``Foo<int, 2>``, ``ns::T``, ``unsigned int``."""
    out = ""
    for t in toks:
        if out and (out[-1] == "," or (re.match(r"\w", t) and re.match(r"\w", out[-1]))):
            out += " "
        out += t
    return out


def _builtin(words: list[str]) -> str:
    """Canonical spelling of a builtin type (``long long int`` -> ``long long``), or raise."""
    n = {w: words.count(w) for w in _BUILTIN}
    sign = n["signed"] + n["unsigned"]
    if len(words) == 1 and words[0] in ("bool", "float", "double", "void"):
        return words[0]
    if n["char"] == 1 and sign <= 1 and len(words) == 1 + sign:
        return ("signed " if n["signed"] else "unsigned " if sign else "") + "char"
    if (
        sign <= 1
        and n["int"] <= 1
        and (n["short"], n["long"]) in ((0, 0), (1, 0), (0, 1), (0, 2))
        and len(words) == sign + n["int"] + n["short"] + n["long"]
    ):
        size = "short" if n["short"] else " ".join(["long"] * n["long"]) or "int"
        return ("unsigned " if n["unsigned"] else "") + size
    raise SignatureError(f"unknown builtin type {' '.join(words)!r}")


def _param(toks: list[str], tparams: set[str]) -> Param:
    """Read one parameter declaration (the tokens between two commas)."""
    # One declaration, kept whole (about 60 lines): read in one pass (what is
    # refused, an array suffix, the name, the pointer levels, the base type), each step on the
    # tokens and nesting depths the one before it left.
    text = _render(toks)
    toks = [t for t in toks if t not in _DROPPED]
    # Only the outer level counts: ``Foo<const int&>`` is one struct type, not a reference.
    top = [t for t, d in zip(toks, _depths(toks)) if d == 0]
    for bad, why in (
        ("&", "references"),
        ("&&", "references"),
        ("=", "default arguments"),
        ("...", "variadic parameters"),
        ("(", "function pointers (or attributes)"),
    ):
        if bad in top:
            raise SignatureError(f"{why} are not supported in kernel parameters ({text!r})")
    arrays = 0
    if toks and toks[-1] == "]":  # ``float x[]`` is ``float* x`` in a parameter list
        toks, arrays = toks[: _match(toks, len(toks) - 1, _BACK, -1)], 1
        if "[" in toks:
            raise SignatureError(f"multi-dimensional array parameters are not supported ({text!r})")
    core = [t for t in toks if t not in _QUALIFIERS]
    name = ""
    # The last identifier is the name unless it is the whole type (``MyStruct``) or part of it
    # (``ns::Foo``, ``unsigned long``).
    if len(core) >= 2 and _IDENT.fullmatch(core[-1]) and core[-1] not in _BUILTIN and core[-2] != "::":
        name = core[-1]
        toks = toks[: len(toks) - 1 - toks[::-1].index(name)]
    depths = _depths(toks)
    # Base type before the first outer ``*``; each ``*`` after it starts one pointer level.
    star = next((i for i, t in enumerate(toks) if t == "*" and depths[i] == 0), len(toks))
    base, base_d = toks[:star], depths[:star]
    levels: list[bool] = []  # const-ness of each pointer level, outermost last
    for t in toks[star:]:
        if t == "*":
            levels.append(False)
        elif t == "const":
            levels[-1] = True
        elif t != "volatile":
            raise SignatureError(f"cannot read parameter {text!r}")
    levels += [False] * arrays
    quals = {t for t, d in zip(base, base_d) if d == 0 and t in _QUALIFIERS}
    words = [t for t, d in zip(base, base_d) if d > 0 or t not in _QUALIFIERS]
    if not words:
        raise SignatureError(f"parameter {text!r} has no type")
    outer = [t for t, d in zip(words, _depths(words)) if d == 0]
    if all(w in _BUILTIN for w in words):
        ctype = _builtin(words)
    elif any(w in _BUILTIN for w in outer) or not (_IDENT.fullmatch(words[-1]) or words[-1] == ">"):
        raise SignatureError(f"cannot read the type of parameter {text!r}")
    else:
        ctype = _render(words)
        short = re.sub(r"^(::)?(std::)?", "", ctype)  # std::size_t is size_t
        ctype = short if short in KINDS else ctype
    if not levels:
        # By value: const is the callee's business, the caller passes the same bytes.
        if ctype == "void":
            raise SignatureError(f"parameter {text!r} has type void")
        generic = any(w in tparams for w in words)
        return Param(name, ctype, None if generic else KINDS.get(ctype, "struct"), None)
    # A pointer is a pointer whatever it points at (T* included). The top level's own const is
    # dropped (a copy for the callee); the pointee's const says the kernel only reads through it.
    pointee_const = levels[-2] if len(levels) > 1 else "const" in quals
    full = "".join(q + " " for q in ("const", "volatile") if q in quals) + ctype
    full += "".join("*" + (" const" if c else "") for c in levels[:-1]) + "*"
    return Param(name, full, "ptr", "read" if pointee_const else "write")


def _declarations(toks: list[str], where: list[Branches], base: str) -> list[tuple[list[Param], bool]]:
    """Every ``__global__`` declaration named ``base``: (params, is a definition).

    Raises :class:`SignatureError` for a declarator of ``base`` whose text, from its name to the
    ``{`` or ``;`` after its parameters, runs through two branches of one ``#if`` (two
    declarators sharing a body, a parameter list cut by ``#else``): which text the compiler sees
    is the preprocessor's choice, so no reading of it can be trusted."""
    found: list[tuple[list[Param], bool]] = []
    for g, tok in enumerate(toks):
        if tok != "__global__":
            continue
        i, first = g + 1, None
        while i < len(toks) - 1 and toks[i] not in ("{", ";", "}"):
            if not (_IDENT.fullmatch(toks[i]) and toks[i + 1] == "("):  # skip ``[[...]]`` whole
                i = _match(toks, i, _FWD, 1) + 1 if toks[i] in ("[", "(") else i + 1
                continue
            end = _match(toks, i + 1, _FWD, 1)
            after = toks[end + 1] if end + 1 < len(toks) else ";"
            if toks[i] == base:
                # Also a declarator followed by something else (another declarator, a trailing
                # attribute): its types must agree with the rest, never be skipped as a macro.
                first = i if first is None else first
                if _exclusive(where[first : end + 2]):
                    raise SignatureError(
                        f"the declaration of {base!r} is split between #if/#else branches "
                        "(the preprocessor is not run here): pass types="
                    )
                inner, tparams = toks[i + 2 : end], _template_types(toks, g)
                params = [] if inner in ([], ["void"]) else [_param(p, tparams) for p in _split(inner)]
                found.append((params, after == "{"))
            if toks[i] in _ATTRIBUTES or after not in ("{", ";", "noexcept"):
                i = end + 1  # __launch_bounds__(...), or a macro like RG_BOUNDS(256)
                continue
            break
    return found


def parse_signature(source: str, name: str) -> list[Param]:
    """Read the parameters of the ``__global__`` function ``name`` in CUDA ``source``.

    Parameters
    ----------
    source : str
        CUDA C++ source text (headers spliced in if their kernels matter). Comments, string
        literals and preprocessor lines are ignored; ``#if`` branches are *not* evaluated, so a
        declaration split between two branches of one ``#if`` is refused.
    name : str
        The kernel's name, or a name expression such as ``"gemm<64, 4>"`` or ``"ns::k<float>"``:
        the last identifier before ``<`` is looked up, as a whole identifier.

    Returns
    -------
    list of Param
        One per parameter, in order (``[]`` for ``k()`` and ``k(void)``). Pointers: kind ``"ptr"``,
        role ``"read"`` (pointee const) or ``"write"``. By value: the kind from :data:`KINDS`,
        ``"struct"`` for other named types, ``None`` when the type mentions a template type.

    Raises
    ------
    SignatureError
        No ``__global__`` function of that name; overloads (or declarators in different ``#if``
        branches) with different parameter lists; a declaration split between ``#if`` branches; a
        parameter that cannot be read (reference, default argument, variadic, function pointer,
        unbalanced brackets, unknown builtin combination such as ``long double``).
    """
    base = name.split("<", 1)[0].split("::")[-1].strip()
    if not _IDENT.fullmatch(base):
        raise SignatureError(f"kernel {name!r}: {base!r} is not an identifier")
    try:
        found = _declarations(*_tokens(source), base)
    except SignatureError as exc:
        raise SignatureError(f"kernel {name!r}: {exc}") from None
    if not found:
        raise SignatureError(f"kernel {name!r}: no __global__ function named {base!r} in the source")
    # A declaration and its definition may both appear (names may differ); only the types count.
    shapes = {tuple((p.ctype, p.kind, p.role) for p in params) for params, _ in found}
    if len(shapes) > 1:
        lists = "; ".join(sorted("(" + ", ".join(c for c, _, _ in s) + ")" for s in shapes))
        raise SignatureError(
            f"kernel {name!r}: {len(shapes)} overloads of {base!r} ({lists}); pass the argument types by hand (types=)"
        )
    return next((params for params, definition in found if definition), found[0][0])
