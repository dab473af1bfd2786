"""RESP for the tests: requests encoded, replies framed and decoded (RESP2 and RESP3),
INFO text split into fields. An independent reading of the protocol, kept apart from
ext/proto/resp.c so that a bug in one is not copied into the check of it."""


def resp_cmd(*args):
    """Encode a command as a RESP multibulk request."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        elif isinstance(a, int):
            a = str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Incomplete(Exception):
    pass


def resp_reply_end(buf, pos=0):
    """End offset of the complete RESP2/RESP3 reply starting at buf[pos]; raises Incomplete."""
    nl = buf.find(b"\r\n", pos)
    if nl < 0:
        raise Incomplete
    t = buf[pos:pos + 1]
    line = buf[pos + 1:nl]
    if t in (b"+", b"-", b":", b"_", b"#", b",", b"("):
        return nl + 2
    if t in (b"$", b"=", b"!"):
        n = int(line)
        if n < 0:
            return nl + 2
        end = nl + 2 + n + 2
        if len(buf) < end:
            raise Incomplete
        return end
    if t in (b"*", b"~", b">", b"%", b"|"):
        n = int(line) * (2 if t in (b"%", b"|") else 1)
        p = nl + 2
        for _ in range(max(n, 0)):
            p = resp_reply_end(buf, p)
        if t == b"|":  # an attribute precedes the actual reply
            p = resp_reply_end(buf, p)
        return p
    raise ValueError(f"not a RESP reply at {pos}: {buf[pos:pos + 60]!r}")


def resp_parse(buf, pos=0):
    """Decode one complete RESP2/RESP3 reply: (value, end). Errors decode to ('ERR', text),
    maps to dicts, RESP3 null to None."""
    nl = buf.index(b"\r\n", pos)
    t, line = buf[pos:pos + 1], buf[pos + 1:nl]
    if t == b"+":
        return line, nl + 2
    if t == b"-":
        return ("ERR", line), nl + 2
    if t in (b":", b"("):
        return int(line), nl + 2
    if t == b"_":
        return None, nl + 2
    if t == b"#":
        return line == b"t", nl + 2
    if t == b",":
        return float(line), nl + 2
    if t in (b"$", b"=", b"!"):
        n = int(line)
        if n < 0:
            return None, nl + 2
        v = buf[nl + 2:nl + 2 + n]
        if t == b"!":
            v = ("ERR", v)
        return v, nl + 2 + n + 2
    if t in (b"*", b"~", b">"):
        n = int(line)
        if n < 0:
            return None, nl + 2
        p, items = nl + 2, []
        for _ in range(n):
            v, p = resp_parse(buf, p)
            items.append(v)
        return items, p
    if t == b"%":
        p, d = nl + 2, {}
        for _ in range(int(line)):
            k, p = resp_parse(buf, p)
            v, p = resp_parse(buf, p)
            d[k if not isinstance(k, list) else tuple(k)] = v
        return d, p
    raise ValueError(f"not a RESP reply: {buf[pos:pos + 60]!r}")


def info_dict(raw_info):
    """INFO text -> {field: str}, plus '__sections__' list in order."""
    if isinstance(raw_info, bytes):
        raw_info = raw_info.decode()
    out, sections = {}, []
    for line in raw_info.split("\r\n"):
        if line.startswith("# "):
            sections.append(line[2:].strip().lower())
        elif line and ":" in line:
            k, v = line.split(":", 1)
            out[k] = v
    out["__sections__"] = sections
    return out
