"""Build small plugin wheels and a fresh venv that sees this checkout's installed packages.

``build_plugin_wheel`` writes a real wheel (``*.dist-info`` with METADATA, WHEEL,
entry_points.txt and a hashed RECORD) holding one module, so ``pip install`` installs it
as it would any published plugin. ``fresh_venv`` creates a venv without pip whose
site-packages adds the running interpreter's site-packages after its own: pip installs
into the fresh venv in seconds instead of reinstalling torch and the engine.
"""

from __future__ import annotations

import base64
import hashlib
import os
import site
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

__all__ = ["build_plugin_wheel", "build_wheels", "fresh_venv", "pip_install", "run_python"]


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_plugin_wheel(
    folder: Path,
    name: str,
    source: str,
    *,
    requires: tuple[str, ...] = ("engine-sdk>=0.1,<0.2",),
    version: str = "0.1.0",
) -> Path:
    """Wheel of distribution ``engine-<name>``: module ``engine_<name>_plugin`` holding
    ``source``, registered as entry point ``<name>`` in group ``engine.plugins``."""
    dist = f"engine-{name.replace('_', '-')}"
    stem = dist.replace("-", "_")
    module = f"engine_{name}_plugin"
    info = f"{stem}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {requirement}\n" for requirement in requires
    )
    files = {
        f"{module}.py": textwrap.dedent(source).encode(),
        f"{info}/METADATA": metadata.encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
        f"{info}/entry_points.txt": f"[engine.plugins]\n{name} = {module}\n".encode(),
    }
    record = [_record_line(path, data) for path, data in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{stem}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


_BUILD = """
import os, sys
import setuptools.build_meta as backend
out = sys.argv[1]
for folder in sys.argv[2:]:
    os.chdir(folder)
    backend.build_wheel(out)
"""


def build_wheels(folders: list[Path], out: Path) -> list[Path]:
    """Build each project folder's wheel with its PEP 517 backend (setuptools), in one
    process: what ``pip wheel`` does, without its per-project start-up cost."""
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", _BUILD, str(out.resolve()), *(str(f.resolve()) for f in folders)],
        capture_output=True,
        text=True,
        env=_clean_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return sorted(out.glob("*.whl"))


def _clean_env() -> dict[str, str]:
    drop = ("ENGINE_", "VIRTUAL_ENV", "PYTHONPATH")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def fresh_venv(path: Path) -> Path:
    """A new venv at ``path`` (no pip) that also sees this interpreter's site-packages;
    returns its python."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, env=_clean_env()
    )
    python = path / "bin" / "python"
    out = subprocess.run(
        [str(python), "-c", "import site; print(site.getsitepackages()[0])"],
        capture_output=True,
        text=True,
        check=True,
    )
    parents = [p for p in site.getsitepackages() if Path(p).is_dir()]
    lines = [f"import site; site.addsitedir({parent!r})" for parent in parents]
    (Path(out.stdout.strip()) / "zz_parent_site.pth").write_text("\n".join(lines) + "\n")
    return python


def pip_install(python: Path, *wheels: Path) -> None:
    """``pip install --no-deps`` the wheels into the venv of ``python`` (this pip)."""
    cmd = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps"]
    out = subprocess.run(
        [*cmd, *map(str, wheels)], capture_output=True, text=True, env=_clean_env(), check=False
    )
    assert out.returncode == 0, out.stderr


def run_python(
    python: Path, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGS`` with a clean environment (no ENGINE_* variables)."""
    full_env = _clean_env() | (env or {})
    return subprocess.run(
        [str(python), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=full_env,
        timeout=300,
        check=False,
    )
