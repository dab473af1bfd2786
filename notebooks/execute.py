"""Execute notebooks in place and save their outputs (`make notebooks-run`): each one top to
bottom in a fresh kernel, at KVSTORE_NOTEBOOK_SCALE (small by default), the result files in a
temporary directory removed afterwards. A notebook is written back only if every cell ran;
a failed one is left as it was and named, with its failing cell, and the exit code is 1.

    python notebooks/execute.py                        # every notebooks/*.ipynb
    python notebooks/execute.py notebooks/003_ldu.ipynb --timeout 1800

A cell that passes --timeout is interrupted (KeyboardInterrupt in the cell, so the experiment's
finally blocks stop its servers and remove its namespaces) and the kernel is shut down only
after the cell has ended; a cell still running --kill-after seconds after its interrupt (it
ignores SIGINT, or its cleanup hangs) has its kernel killed; see run() below."""
import argparse
import hashlib
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
KILL_AFTER = 120  # seconds a cell may take to unwind after its interrupt


def _client_class():
    """nbclient's NotebookClient, bounded in wall-clock time: after interrupting a cell that
    passed its timeout, plain nbclient waits for the reply another timeout, then interrupts
    again, and so on, forever if the cell ignores SIGINT. This one kills the kernel when the
    cell has not answered kill_after seconds after the first interrupt (execute() then
    raises DeadKernelError)."""
    import asyncio

    import nbclient

    class Bounded(nbclient.NotebookClient):
        kill_after = KILL_AFTER
        killed = None  # the cell whose kernel was killed

        async def _async_handle_timeout(self, timeout, cell=None):
            reply = await super()._async_handle_timeout(timeout, cell)
            if getattr(self, "_watchdog", None) is None:
                self._watchdog = asyncio.ensure_future(self._kill_later(cell))
            return reply

        async def _kill_later(self, cell):
            await asyncio.sleep(self.kill_after)
            self.killed = cell
            await nbclient.util.ensure_async(self.km.shutdown_kernel(now=True))
            if self.task_poll_for_reply is not None:
                self.task_poll_for_reply.cancel()  # execute_cell raises DeadKernelError

        async def async_execute_cell(self, *a, **kw):
            try:
                return await super().async_execute_cell(*a, **kw)
            finally:
                if getattr(self, "_watchdog", None) is not None and self.killed is None:
                    self._watchdog.cancel()  # the cell answered its interrupt in time
                    self._watchdog = None

    return Bounded


RUN_CELL = re.compile(r"notebook_run\((?:(\w+)|\"(\w+)\")\)")
EXPERIMENTS = HERE.parent / "experiments"


def experiments_of(cell):
    """The experiment names a code cell runs (its notebook_run(...) calls)."""
    return [a or b for a, b in RUN_CELL.findall(cell.source)] if cell.cell_type == "code" else []


def source_hash(name):
    """sha256 of experiments/<name>.py, or None when there is no such module (yet)."""
    f = EXPERIMENTS / f"{name}.py"
    return hashlib.sha256(f.read_bytes()).hexdigest() if f.exists() else None


def source_hashes(nb):
    """{name: source_hash(name)} of every experiment nb runs."""
    return {n: source_hash(n) for c in nb.cells for n in experiments_of(c)}


def stamp(nb, hashes):
    """Record in each experiment cell's metadata the hash of the experiment code that made
    its outputs (metadata.kvstore.source_sha256: {name: hash}, hashes taken before the run):
    the tests tell a notebook whose outputs an older version of the code made."""
    for c in nb.cells:
        names = experiments_of(c)
        if names:
            c.metadata.setdefault("kvstore", {})["source_sha256"] = {n: hashes[n] for n in names}
    return nb


def run(path, timeout, results, kernel_name="python3", kill_after=KILL_AFTER):
    """Execute the notebook at path (a cell may take timeout seconds) with its result files
    under results; returns the executed notebook (the file is not written). Raises
    nbclient's CellExecutionError, whose text names the cell and ends with its traceback
    and whose .notebook holds what ran, when a cell fails or times out.

    interrupt_on_timeout: without it nbclient answers a timeout by shutting the kernel down
    while the cell is still running. The shutdown closes the kernel's sockets; the cell,
    interrupted by the same shutdown, unwinds (servers stopped, namespaces removed) and its
    reply then goes to a closed socket: the kernel logs `ZMQError: Socket operation on
    non-socket` (pyzmq's error for a socket it has closed) and what the cell printed while
    unwinding is lost. With it, the cell is interrupted first, its reply (a KeyboardInterrupt
    traceback) arrives, and only then is the kernel shut down. A cell that has not answered
    kill_after seconds after its interrupt has its kernel killed (CellExecutionError too)."""
    import nbclient
    import nbformat
    nb = nbformat.read(path, as_version=4)
    old = os.environ.get("KVSTORE_RESULTS")
    os.environ["KVSTORE_RESULTS"] = str(results)  # the kernel inherits it: never over results/
    hashes = source_hashes(nb)  # the code the outputs come from
    client = _client_class()(nb, timeout=timeout, interrupt_on_timeout=True, kernel_name=kernel_name,
                             resources={"metadata": {"path": str(Path(path).parent)}})
    client.kill_after = kill_after
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as e:
        e.notebook = nb  # what ran, with the failed cell's outputs
        raise
    except nbclient.exceptions.DeadKernelError:
        if client.killed is None:
            raise
        e = nbclient.exceptions.CellExecutionError(
            f"a cell passed its timeout ({timeout:g} s), was interrupted and had not ended {kill_after:g} s "
            f"later: its kernel was killed\n--- the cell:\n{client.killed.source}", "CellKilled",
            f"killed {kill_after:g} s after its interrupt")
        e.notebook = nb
        raise e from None
    else:
        stamp(nb, hashes)
    finally:
        if old is None:
            del os.environ["KVSTORE_RESULTS"]
        else:
            os.environ["KVSTORE_RESULTS"] = old
    return nb


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="*", type=Path, help="default: every notebooks/*.ipynb")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds a cell may take (default: 900 at the small scale, 7200 at full)")
    ap.add_argument("--kill-after", type=float, default=KILL_AFTER,
                    help="seconds a cell interrupted at its timeout may take to end before its kernel is killed")
    args = ap.parse_args(argv)
    import nbclient
    import nbformat
    scale = os.environ.setdefault("KVSTORE_NOTEBOOK_SCALE", "small")
    timeout = args.timeout or (900 if scale == "small" else 7200)
    # progress bars off: a committed notebook shows each point's line and the report, not a
    # widget that GitHub cannot draw (interactive JupyterLab keeps its bars)
    os.environ.setdefault("TQDM_DISABLE", "1")
    # and tqdm.auto's warning that ipywidgets (the notebook extra) is missing, which it is here
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"),
                                                          "ignore:IProgress not found"]))
    failed = []
    for path in args.notebooks or sorted(HERE.glob("*.ipynb")):
        t0 = time.monotonic()
        print(f"{path}: executing at the {scale} scale (a cell may take {timeout:g} s)", flush=True)
        results = tempfile.mkdtemp(prefix="kvstore-notebook-")
        try:
            nb = run(path, timeout, results, kill_after=args.kill_after)
        except nbclient.exceptions.CellExecutionError as e:
            failed.append(path)
            print(f"{path}: FAILED, left unchanged:\n{str(e)[-3000:]}", file=sys.stderr, flush=True)
            continue
        finally:
            shutil.rmtree(results, ignore_errors=True)
        nbformat.write(nb, path)
        print(f"{path}: saved with its outputs ({time.monotonic() - t0:.0f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
