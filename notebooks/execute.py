"""Execute notebooks in place and save their outputs (`make notebooks-run`): each one top to
bottom in a fresh kernel, at KVSTORE_NOTEBOOK_SCALE (small by default), the result files in a
temporary directory removed afterwards. A notebook is written back only if every cell ran;
a failed one is left as it was and named, with its failing cell, and the exit code is 1.

    python notebooks/execute.py                        # every notebooks/*.ipynb
    python notebooks/execute.py notebooks/003_ldu.ipynb --timeout 1800

A cell that passes --timeout is interrupted (KeyboardInterrupt in the cell, so the experiment's
finally blocks stop its servers and remove its namespaces) and the kernel is shut down only
after the cell has ended; see run() below."""
import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(path, timeout, results, kernel_name="python3"):
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
    traceback) arrives, and only then is the kernel shut down."""
    import nbclient
    import nbformat
    nb = nbformat.read(path, as_version=4)
    old = os.environ.get("KVSTORE_RESULTS")
    os.environ["KVSTORE_RESULTS"] = str(results)  # the kernel inherits it: never over results/
    try:
        nbclient.NotebookClient(nb, timeout=timeout, interrupt_on_timeout=True, kernel_name=kernel_name,
                                resources={"metadata": {"path": str(Path(path).parent)}}).execute()
    except nbclient.exceptions.CellExecutionError as e:
        e.notebook = nb  # what ran, with the failed cell's outputs
        raise
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
            nb = run(path, timeout, results)
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
