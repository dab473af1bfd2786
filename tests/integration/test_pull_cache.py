"""The pull cache's first level (issue 16, --pull-cache-slots): an XDP program on the
server's interface answers pulls of sealed batches before the network stack. Each test
runs the node in a test host (a network namespace + veth, native XDP) and pulls from
this side. Checked: the kernel's answer is byte for byte the engine's for the same batch;
after a change (XDEL, XTRIM, DEL, FLUSHALL) a pull never gets the batch as it was; torn
reads and racing writers never give a malformed answer; the program goes with the server
(kill -9 included). Needs root, iproute2 and a build with the program (clang, libbpf)."""
import random
import subprocess
import threading
import time

import pytest

from helpers.conn import UdpConn
from helpers.streamwire import F_PULL, F_REPLY, F_XADD, NO_BATCH, SEALED, decode_pull, pull_frame, xadd_frame
from kvstore import Node, netns

pytestmark = [pytest.mark.timeout(180)]


def _skip_reason():
    ok, why = netns.available()
    if not ok:
        return why
    from kvstore._ext import lib
    if not lib.pc_available():
        return "this build has no pull cache (clang and libbpf-dev were not found when it was built)"
    return None


if (_why := _skip_reason()):
    pytestmark.append(pytest.mark.skip(reason=_why))


@pytest.fixture
def host():
    with netns.TestHost("kvpull", index=61) as h, netns.XdpProgram(h.host_if, "pass"):
        yield h  # the pass program: a veth delivers XDP_TX frames to a receive side that runs XDP


def cache_node(tmp_path, host, slots, **settings):
    return Node(port=0, bind=host.addr, netns=host.name, data_dir=tmp_path / "node", arch="udp", udp_port=0,
                durability="none", pull_cache_slots=slots, **settings)


def counters(node):
    with node.client() as c:
        s = c.info("stats")
    return {k[len("pull_cache_"):]: v for k, v in s.items() if k.startswith("pull_cache_")}


def pull(u, key, no, pad=1464):
    """A pull padded to a whole datagram (room for the kernel's answer), or not (pad=0: the engine's)."""
    flags, body = u.reply(u.send(pull_frame(key, no, pad), F_PULL))
    assert flags == F_REPLY | F_PULL, (flags, body[:80])
    return body


def fill(u, key, n, tag=b""):
    """n datagrams of 20 messages of 85 bytes: each message names itself (tag, number)."""
    for i in range(n):
        flags, reply = u.reply(u.send(xadd_frame(key, b"v", [tag + b"%05d" % (i * 20 + j) + b"." * 70
                                                              for j in range(20)]), F_XADD))
        assert flags == F_REPLY | F_XADD and reply.startswith(b"*2\r\n"), reply


def idt(i):
    return tuple(map(int, i.split("-")))


def sealed_count(u, key):
    no = 0
    while decode_pull(pull(u, key, no))["status"] == SEALED:
        no += 1
    return no


def test_kernel_answers_are_the_engines_byte_for_byte(tmp_path, host):
    """One slot: every batch's first pull misses (the slot holds another) and the engine
    answers and fills it; the second pull hits. The two answers are the same bytes."""
    with cache_node(tmp_path, host, 1) as node, UdpConn(node.udp_port, host=node.bind) as u:
        c = counters(node)
        assert c["slots"] == 1 and c["iface"] == host.ns_if and c["mode"] == "native", c
        fill(u, b"feed", 12)
        n = sealed_count(u, b"feed")
        assert n > 8
        for no in range(n):
            before = counters(node)
            engine = pull(u, b"feed", no)
            kernel = pull(u, b"feed", no)
            after = counters(node)
            assert kernel == engine
            assert after["hits"] == before["hits"] + 1, (no, before, after)
        assert counters(node)["torn"] == 0


def test_keys_of_every_length_hit_and_only_their_own(tmp_path, host):
    """The program hashes and compares keys 8 bytes at a time, the last word masked: keys of
    1 to 64 bytes (the longest it caches) hit once their batches are sealed, and keys that
    differ only in their last byte, or that are a prefix of another, never get each other's
    batches. A 65-byte key is the engine's to answer (not cached)."""
    base = bytes(random.Random(7).choice(b"abcdefghijklmnopqrstuvwxyz0123456789:") for _ in range(65))
    keys = [base[:n] for n in (1, 7, 8, 9, 15, 16, 17, 63, 64)]
    keys += [base[:15] + b"#", base[:8] + b"!"]  # same words but the last byte
    with cache_node(tmp_path, host, 4096) as node, UdpConn(node.udp_port, host=node.bind) as u:
        for i, key in enumerate(keys + [base]):
            # the 9-byte key's batch numbers pass 256: the word after its first 8 bytes then
            # holds a nonzero byte of the number, which the program must mask off
            fill(u, key, 260 if len(key) == 9 else 3, tag=b"k%02d:" % i)
        for i, key in enumerate(keys):
            n = sealed_count(u, key)  # these pulls are the kernel's already (filled when sealed)
            assert n >= 2, key
            for no in range(n):
                before = counters(node)["hits"]
                batch = decode_pull(pull(u, key, no))
                assert counters(node)["hits"] == before + 1, (key, no)
                assert all(m[2][1].startswith(b"k%02d:" % i) for m in batch["entries"]), (key, no)
        before = counters(node)["hits"]
        assert decode_pull(pull(u, base, 0))["status"] == SEALED
        assert counters(node)["hits"] == before


def test_a_pull_after_a_change_never_gets_the_old_batch(tmp_path, host):
    slots = 4096
    with cache_node(tmp_path, host, slots) as node, UdpConn(node.udp_port, host=node.bind) as u, \
            node.client() as c:
        rng = random.Random(16)
        for gen in range(3):
            tag = b"g%d:" % gen
            fill(u, b"feed", 10, tag)
            n = sealed_count(u, b"feed")
            hits = counters(node)["hits"]
            seen = {no: decode_pull(pull(u, b"feed", no)) for no in range(n)}
            assert counters(node)["hits"] >= hits + n  # filled when sealed: all served by the kernel
            assert all(e[2][1].startswith(tag) for a in seen.values() for e in a["entries"])
            for _ in range(5):  # XDEL in a sealed batch: the next pull shows it deleted
                no = rng.randrange(n)
                live = [e for e in seen[no]["entries"] if not e[1]]
                victim = rng.choice(live)[0]
                assert c.xdel("feed", victim) == 1
                now = decode_pull(pull(u, b"feed", no))
                assert now["version"] == seen[no]["version"] + 1
                assert [e[0] for e in now["entries"] if e[1]] == sorted(
                    [e[0] for e in seen[no]["entries"] if e[1]] + [victim], key=idt)
                seen[no] = now
            c.xtrim("feed", maxlen=c.xlen("feed") - 60, approximate=True)  # whole batches from the front
            first = c.xrange("feed", count=1)[0][0].decode()
            for no in range(n):
                a = decode_pull(pull(u, b"feed", no))
                if a["status"] == NO_BATCH:
                    assert a["oldest"] > no
                else:
                    assert idt(a["entries"][-1][0]) >= idt(first)
            gone = decode_pull(pull(u, b"feed", 0))
            assert gone["status"] == NO_BATCH and gone["oldest"] > 0
            if gen == 0:
                c.delete("feed")
            else:
                c.flushall()
            for no in range(n):  # none of the old batches answers: the new stream starts at 0 again
                assert decode_pull(pull(u, b"feed", no))["status"] != SEALED
        assert counters(node)["invalidations"] > 0 and counters(node)["torn"] == 0


def test_racing_writers_never_give_a_malformed_or_stale_answer(tmp_path, host):
    """Pullers hammer a few slots while a writer keeps sealing, deleting in and trimming
    the streams they map to: every answer decodes, and every batch that comes back holds
    entries of the stream's current generation (a FLUSHALL starts the next one)."""
    with cache_node(tmp_path, host, 8) as node, node.client() as c:
        stop, gen, problems, lost = threading.Event(), [0], [], [0]

        def writer():
            with UdpConn(node.udp_port, host=node.bind) as u, node.client() as wc:
                while not stop.is_set():
                    for _ in range(20):
                        fill(u, b"hot", 1, b"g%d:" % gen[0])
                        ids = wc.xrange("hot", count=40)
                        if len(ids) > 30:
                            wc.xdel("hot", ids[random.randrange(len(ids))][0])
                        wc.xtrim("hot", maxlen=400, approximate=True)
                    wc.flushall()
                    gen[0] += 1  # the FLUSHALL answered: no pull sent from now on may see an older generation

        def puller():
            with UdpConn(node.udp_port, host=node.bind, timeout=0.3) as u:
                while not stop.is_set():
                    g = gen[0]
                    try:
                        a = decode_pull(pull(u, b"hot", random.randrange(40)))
                    except TimeoutError:  # an answer torn by a write is dropped: the client asks again
                        lost[0] += 1
                        continue
                    if a["status"] == SEALED:
                        tags = {e[2][1].split(b":")[0] for e in a["entries"]}
                        if any(int(t[1:]) < g for t in tags):
                            problems.append((g, tags, a["no"]))

        threads = [threading.Thread(target=writer)] + [threading.Thread(target=puller) for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(8)
        stop.set()
        for t in threads:
            t.join(30)
        assert not problems, problems[:3]
        st = counters(node)
        assert st["hits"] > 100 and gen[0] >= 1, st
        assert lost[0] <= st["torn"] + 5, (lost, st)  # only torn answers go missing (and a rare loss)


def test_the_program_goes_with_the_server(tmp_path, host):
    def attached():
        return "xdp" in subprocess.run(["ip", "netns", "exec", host.name, "ip", "link", "show", host.ns_if],
                                       capture_output=True, text=True).stdout
    node = cache_node(tmp_path, host, 64).start()
    assert attached()
    assert node.stop() == 0 and not attached()
    node = cache_node(tmp_path, host, 64).start()
    assert attached()
    node.kill()
    deadline = time.monotonic() + 10
    while attached() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not attached()  # a BPF link: no stale cache answers for a dead server


def test_refusals_say_what_is_needed(tmp_path):
    from kvstore.config import ServerConfig
    from kvstore.errors import ConfigError
    with pytest.raises(ConfigError, match="needs --arch udp"):
        ServerConfig(pull_cache_slots=8).validate()
    with pytest.raises(ConfigError, match="not 0.0.0.0"):
        ServerConfig(arch="udp", bind="0.0.0.0", pull_cache_slots=8).validate()
    with pytest.raises(ConfigError, match="from 0 .off. to 1048576"):
        ServerConfig(arch="udp", pull_cache_slots=1 << 21).validate()
