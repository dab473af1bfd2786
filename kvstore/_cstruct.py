"""Python dicts from the C structs that report counters and facts, read from the cdef
(ffi.typeof(...).fields) so that a field added in C needs no Python edit. Char arrays
become str; cffi's opaque "..." part of a struct is not in .fields and so never read."""
from kvstore._native import ffi


def as_dict(obj, skip=()):
    """{field: value} of a struct cdata (or a pointer to one), in declaration order.

    skip: field names left out. Nested structs become dicts, char arrays str
    (decoded, undecodable bytes replaced), other arrays lists."""
    ctype = ffi.typeof(obj)
    if ctype.kind == "pointer":
        ctype, obj = ctype.item, obj[0]
    return {name: _value(getattr(obj, name), field.type)
            for name, field in ctype.fields if name not in skip and not name.startswith("_")}


def _value(v, ctype):
    if ctype.kind == "struct":
        return as_dict(v)
    if ctype.kind == "array":
        if ctype.item.cname == "char":
            return ffi.string(v).decode(errors="replace")
        return [_value(x, ctype.item) for x in v]
    return v


def split_prefix(d, prefix):
    """Remove the keys of d starting with prefix; return them, prefix dropped, as a dict."""
    return {k[len(prefix):]: d.pop(k) for k in list(d) if k.startswith(prefix)}
