"""The cffi declarations of kvstore's C extensions, taken from ext/'s headers.

A hand-kept copy of the headers drifts (a field added in C and not here is a
silent layout error). Instead each module names what Python uses — structs,
functions, typedefs, macros — and this module copies each declaration out of the
header that owns it: comments, attributes and _Atomic qualifiers dropped, and
every struct declared with `...;` (members cffi cannot take, such as atomic
pointers, left out) so that cffi takes its layout from the C
compiler (API mode) rather than from us. A name that is not found fails the build.
"""
import os
import re

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_PREPROC = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.M)
_ATTRIBUTE = re.compile(r"__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)")


_CPLUSPLUS = re.compile(r"#\s*ifdef\s+__cplusplus.*?#\s*endif", re.S)


def _clean(text):
    return _CPLUSPLUS.sub("", _ATTRIBUTE.sub("", _COMMENT.sub(" ", text)))


def _statements(text):
    """Top-level statements of a cleaned header (preprocessor lines removed), each
    ending at a ';' outside braces; a braced body without ';' (an inline function)
    ends at its closing brace."""
    text = _PREPROC.sub("", text)
    out, start, depth = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            # a function body ends its statement; a type definition goes on to its ';'
            if depth == 0 and not re.match(r"\s*(typedef|struct|union|enum)\b", text[start:i]):
                out.append(text[start:i + 1].strip())
                start = i + 1
        elif ch == ";" and depth == 0:
            out.append(text[start:i + 1].strip())
            start = i + 1
    return [re.sub(r" ;$", ";", " ".join(s.split())) for s in out if s.strip()]


def _unatomic(decl):
    decl = re.sub(r"_Atomic\s*\(([^()]*)\)", r"\1", decl)
    return re.sub(r"\b_Atomic\s+", "", decl)


def _struct(stmts, name):
    for s in stmts:
        m = re.match(r"(?:typedef\s+)?struct\s+%s\s*\{(.*)\}\s*[^{}]*;$" % re.escape(name), s)
        if m:
            members, depth, cur = [], 0, ""
            for ch in m.group(1):
                depth += ch == "{"
                depth -= ch == "}"
                cur += ch
                if ch == ";" and depth == 0:
                    members.append(cur.strip())
                    cur = ""
            # nested definitions and atomic pointers (cffi's layout check would take a
            # plain pointer to them) are left to the C compiler, behind "...;"
            kept = [_unatomic(x) for x in members if "{" not in x and "_Atomic(" not in x.replace(" ", "")]
            # an array sized by a macro: cffi takes its length from the compiler too
            kept = [re.sub(r"\[\s*[A-Za-z_]\w*\s*\]", "[...]", x) for x in kept]
            return "struct %s {\n    %s\n    ...;\n};" % (name, "\n    ".join(kept))
    raise LookupError(f"struct {name}")


def _function(stmts, name):
    for s in stmts:
        if s.startswith(("static", "typedef", "struct " + name)) or "{" in s:
            continue
        if re.search(r"\b%s\s*\(" % re.escape(name), s) and not re.search(r"\(\s*\*\s*%s\b" % re.escape(name), s):
            return s
    raise LookupError(f"function {name}")


def _typedef(stmts, name):
    for s in stmts:
        if s.startswith("typedef") and re.search(r"\b%s\b" % re.escape(name), s):
            return s
    raise LookupError(f"typedef {name}")


def cdef(ext_dir, spec):
    """cffi declarations for spec: [(header relative to ext_dir, [item, ...])] where an
    item is "struct NAME", "struct NAME;" (opaque), "typedef NAME", "#define NAME" or a
    function name. Raises LookupError naming the header and item not found."""
    out = []
    for header, items in spec:
        with open(os.path.join(ext_dir, header), encoding="utf-8") as f:
            raw = f.read()
        stmts = _statements(_clean(raw))
        for item in items:
            try:
                if item.startswith("#define "):
                    macro = item.split()[1]
                    if not re.search(r"^\s*#\s*define\s+%s\b" % re.escape(macro), raw, re.M):
                        raise LookupError(item)
                    out.append(f"#define {macro} ...")
                elif item.startswith("struct ") and item.endswith(";"):
                    out.append(item)
                elif item.startswith("struct "):
                    out.append(_struct(stmts, item.split()[1]))
                elif item.startswith("typedef "):
                    out.append(_typedef(stmts, item.split()[1]))
                else:
                    out.append(_function(stmts, item))
            except LookupError as e:
                raise LookupError(f"ext/{header}: no declaration of {e.args[0]}") from None
    return "\n".join(out) + "\n"
