"""Executes the tutorials two at a time into MyST-NB's cache, before Sphinx reads them.

Why: Sphinx reads (and so MyST-NB executes) the notebooks one after another, and they spend
most of their time waiting on the local market's processes; two at once take about half the
wall time on 2 cores, which keeps `scripts/docs.sh` from a cold cache within its budget. It does
exactly what MyST-NB's cache mode does for one notebook (`myst_nb.core.execute.cache`): run it
in a temporary folder with nbclient, then store it in the jupyter-cache under the hash of its
code, where MyST-NB then finds it. A notebook already cached for its current code is not run.
A notebook that fails stops the build here, with its traceback.

    python docs/_ext/execute_tutorials.py CACHE_DIR NOTEBOOK... [--jobs 2] [--timeout 600]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

__all__ = ["main"]


def _execute(path: str, timeout: int) -> tuple[str, Any, float, str | None]:
    """Run one notebook in a fresh temporary folder: (path, executed notebook, seconds, error)."""
    import nbformat
    from jupyter_cache.executors.utils import single_nb_execution

    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as cwd:
        result = single_nb_execution(nb, cwd=cwd, allow_errors=False, timeout=timeout, meta_override=True)
    return path, nb, result.time, (result.exc_string if result.err is not None else None)


def main(argv: list[str] | None = None) -> int:
    """Execute the notebooks the cache lacks; returns the exit status (1 when one failed)."""
    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cache")
    parser.add_argument("notebooks", nargs="+")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=600)
    args = parser.parse_args(argv)

    cache = get_cache(args.cache)
    todo = []
    for path in args.notebooks:
        try:
            cache.match_cache_notebook(nbformat.read(path, as_version=4))
        except KeyError:
            todo.append(os.path.abspath(path))
    if not todo:
        print(f"docs: all {len(args.notebooks)} tutorials are cached for their code")
        return 0
    started, failed = time.monotonic(), []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(_execute, path, args.timeout) for path in todo]
        for future in as_completed(futures):
            path, nb, seconds, error = future.result()
            name = os.path.basename(path)
            if error is not None:
                failed.append(name)
                print(f"docs: {name} failed after {seconds:.0f} s:\n{error}", file=sys.stderr)
                continue
            record = cache.add_nb_to_project(path)
            cache.cache_notebook_bundle(
                CacheBundleIn(nb, record.uri, data={"execution_seconds": seconds}),
                check_validity=False,
                overwrite=True,
            )
            print(f"docs: executed {name} in {seconds:.0f} s")
    took = time.monotonic() - started
    print(f"docs: {len(todo)} tutorials executed in {took:.0f} s, {args.jobs} at a time")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
