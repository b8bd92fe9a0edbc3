"""A cloud image's Python for the fake-cloud tests: torch and what torch needs, and nothing of
spotnb, as on the Deep Learning AMI (whose torch lives in the venv /opt/pytorch).

Made in a second: a venv without pip or system site-packages whose site-packages holds links to
this interpreter's torch and the packages torch requires (each with its dist-info, so pip sees
them installed, as on the image). A VM's boot script then installs spotnb from the job's
shipped wheel and the rest of its dependencies from the package index, as a real VM does."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

__all__ = ["torch_only_python"]


def _closure(name: str) -> list[metadata.Distribution]:
    """The distribution `name` and every one it requires (no extras), installed here."""
    seen: dict[str, metadata.Distribution] = {}
    todo = [name]
    while todo:
        key = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if key in seen:
            continue
        try:
            dist = metadata.distribution(key)
        except metadata.PackageNotFoundError:
            continue  # a requirement for another platform
        seen[key] = dist
        for req in dist.requires or []:
            if "extra ==" in req:
                continue
            todo.append(re.split(r"[ ;<>=!~\[(]", req, maxsplit=1)[0])
    return list(seen.values())


def torch_only_python(where: Path) -> Path:
    """The `python` of a venv at `where` that imports torch (and its requirements) only."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=60)
    python = where / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout.strip()
    )  # fmt: skip
    for dist in _closure("torch"):
        base = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            src, dst = base / top, site / top
            if src.exists() and not dst.exists() and top not in ("__pycache__", "bin"):
                dst.symlink_to(src)
    return python
