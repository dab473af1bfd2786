"""README.md's commands, run as a new user would run them, so that the README cannot go stale.

Every ```sh and ```python block is run in order, in a scratch directory (the repository's
.venv/bin first on PATH, as after `. .venv/bin/activate`; kvstore.example.toml beside it):
- `make run` is started in the background in the repository with PORT and DATA_DIR pointing
  into the scratch directory; `make test` is this suite's own command and is not run again;
- a line ending in `&` is started in the background and must come up listening;
- any other line runs with bash and must exit 0; a trailing `# → TEXT` comment says TEXT must
  appear in its output;
- a python block runs as a script with this interpreter;
- the blocks under "### Backups" run with the `make run` server stopped (Ctrl-C), as the README
  says a backup is taken; then it is started again and every key the tour wrote must be there.
The README's ports (6380-6389 clients, 7380-7389 replication, 9121 metrics, 10809 the block
device's NBD) are mapped to free ports, so the test neither needs nor disturbs a server a user
may be running.
"""
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from helpers.pair import wait_for
from helpers.servers import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
PORTS = re.compile(r"\b(638\d|738\d|9121|10809)\b")
EXPECT = re.compile(r"\s+#\s*→\s*(.*)$")

pytestmark = pytest.mark.slow


def blocks(text):
    """[(heading, language, code)] of the README's fenced blocks, with the ### or ## heading above."""
    out, heading = [], ""
    for m in re.finditer(r"^(#{2,3} [^\n]*)$|^```(\w*)\n(.*?)^```", text, re.M | re.S):
        if m.group(1):
            heading = m.group(1)
        else:
            out.append((heading, m.group(2), m.group(3)))
    return out


def listening(port):
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Tour:
    """The scratch directory, the port map and the processes started in the background."""

    def __init__(self, tmp):
        self.cwd = str(tmp)
        self.ports = {}
        self.background = []
        self.make_run = None
        os.symlink(os.path.join(ROOT, "kvstore.example.toml"), os.path.join(self.cwd, "kvstore.example.toml"))
        self.env = dict(os.environ, PATH=os.path.join(ROOT, ".venv", "bin") + os.pathsep + os.environ["PATH"])
        self.env.pop("PYTHONPATH", None)

    def map_ports(self, code):
        def sub(m):
            if m.group(1) not in self.ports:
                self.ports[m.group(1)] = str(free_port())
            return self.ports[m.group(1)]
        return PORTS.sub(sub, code)

    def start_make_run(self):
        env = dict(self.env, PORT=self.map_ports("6380"), DATA_DIR=os.path.join(self.cwd, "data"))
        self.make_run = subprocess.Popen(["make", "-s", "-C", ROOT, "run"], env=env, cwd=ROOT,
                                         stdout=open(os.path.join(self.cwd, "make-run.log"), "ab"),
                                         stderr=subprocess.STDOUT, start_new_session=True)
        port = int(self.ports["6380"])
        wait_for(f"`make run` listening on {port} (see make-run.log)",
                 lambda: listening(port) or (self.make_run.poll() is not None and self._died()), timeout=600)

    def _died(self):
        raise AssertionError("`make run` exited:\n" + open(os.path.join(self.cwd, "make-run.log")).read()[-3000:])

    def stop_make_run(self):
        """Ctrl-C, as a user stops it: the whole process group gets SIGINT."""
        os.killpg(self.make_run.pid, signal.SIGINT)
        self.make_run.wait(60)  # make itself dies of the SIGINT; the server stops cleanly
        self.make_run = None
        log = open(os.path.join(self.cwd, "make-run.log")).read()
        assert log.rstrip().endswith("kvstore stopped"), log[-3000:]

    def run_line(self, line):
        m = EXPECT.search(line)
        expect = m.group(1).strip() if m else None
        cmd = self.map_ports(EXPECT.sub("", line).split("  #")[0].strip())
        if cmd.endswith("&"):
            p = subprocess.Popen(["bash", "-c", cmd[:-1]], cwd=self.cwd, env=self.env, start_new_session=True,
                                 stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.cwd, "bg.log"), "ab"))
            self.background.append(p)
            port = int(re.search(r"--port (\d+)", cmd).group(1))
            wait_for(f"{cmd} listening", lambda: listening(port), timeout=60)
            return
        r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=self.cwd, env=self.env, timeout=300,
                           capture_output=True, text=True)
        ok = r.returncode == 0 or (r.returncode == 141 and "| head" in cmd)  # head closed the pipe: SIGPIPE
        assert ok, f"README command failed ({r.returncode}): {line}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
        if expect:
            assert expect in r.stdout + r.stderr, f"README says `{line}` prints {expect!r}; it printed:\n{r.stdout}{r.stderr}"

    def run_sh(self, code):
        for line in code.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("make run"):
                self.start_make_run()
            elif line.startswith("make test"):
                continue  # this suite's own command
            else:
                self.run_line(line)

    def run_python(self, code):
        path = os.path.join(self.cwd, "readme_block.py")
        with open(path, "w") as f:
            f.write(self.map_ports(code))
        r = subprocess.run([sys.executable, path], cwd=self.cwd, env=self.env, timeout=300, capture_output=True, text=True)
        assert r.returncode == 0, f"README python block failed:\n{code}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"

    def close(self):
        for p in self.background + ([self.make_run] if self.make_run else []):
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(p.pid, sig)
                    p.wait(30)
                    break
                except ProcessLookupError:
                    break
                except subprocess.TimeoutExpired:
                    continue


def test_readme_blocks_run(tmp_path):
    text = open(README).read()
    found = blocks(text)
    assert any(lang == "sh" and "make run" in code for _, lang, code in found), "README lost its two commands"
    tour = Tour(tmp_path)
    try:
        for heading, lang, code in found:
            backup = "Backups" in heading
            if backup and tour.make_run:
                tour.stop_make_run()
            if lang == "sh":
                tour.run_sh(code)
            elif lang == "python":
                tour.run_python(code)
            if backup and not tour.make_run:
                tour.start_make_run()  # the same data directory: what was acknowledged is there
                out = subprocess.run(["redis-cli", "-p", tour.ports["6380"], "get", "sensor:42"], capture_output=True,
                                     text=True, timeout=30).stdout
                assert "21.5" in out, f"sensor:42 after a restart of `make run`: {out!r}"
    finally:
        tour.close()
