"""``engine collect-env``: what to paste into a bug report.

Python, platform, torch and CUDA, GPUs, installed engine distributions and plugins, and
the environment variables that change the engine's behaviour, with secrets masked.
torch is imported here (lazily, inside the command) because its version is the point.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Mapping
from importlib import metadata
from typing import Annotated, Any

import typer

ENV_PREFIXES = (
    "ENGINE_",
    "CUDA_",
    "NCCL_",
    "HF_",
    "TRANSFORMERS_",
    "TORCH_",
    "PYTORCH_",
    "TRITON_",
    "OMP_",
    "MKL_",
)
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "AUTH", "CREDENTIAL")


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    """The relevant variables; values of names that look secret become ``***``."""
    out = {}
    for name in sorted(env):
        if not name.startswith(ENV_PREFIXES):
            continue
        secret = any(marker in name.upper() for marker in SECRET_MARKERS)
        out[name] = "***" if secret else env[name]
    return out


def _torch_info() -> dict[str, Any]:
    try:
        import torch
    except ImportError as exc:
        return {"torch": None, "error": f"torch is not importable: {exc}"}
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "gpus": [],
    }
    if info["cuda_available"]:
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            info["gpus"].append(
                {
                    "index": index,
                    "name": props.name,
                    "memory_gib": round(props.total_memory / 2**30, 1),
                    "capability": f"{props.major}.{props.minor}",
                }
            )
    return info


def _distributions() -> dict[str, str]:
    names = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"] or ""
        if name == "engine" or name.startswith(("engine-", "engine_")):
            names[name] = dist.version
    return dict(sorted(names.items()))


def _plugins(env: Mapping[str, str]) -> list[dict[str, Any]] | str:
    from engine.plugins import PluginError, PluginManager

    try:
        pm = PluginManager.load(env=env)
    except PluginError as exc:
        return f"plugin loading failed: {exc}"
    return [
        {
            "name": p.name,
            "distribution": p.dist,
            "version": p.version,
            "status": p.status,
            "error": p.error,
        }
        for p in pm.plugins
    ]


def collect_env(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Everything ``engine collect-env`` prints, as a dict."""
    env = os.environ if env is None else env
    return {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        **_torch_info(),
        "distributions": _distributions(),
        "plugins": _plugins(env),
        "environment": mask_env(env),
    }


def _print_text(data: dict[str, Any]) -> None:
    for key in ("python", "executable", "platform", "torch", "cuda_build", "cuda_available"):
        if key in data:
            typer.echo(f"{key}: {data[key]}")
    if data.get("error"):
        typer.echo(f"torch: {data['error']}")
    for gpu in data.get("gpus", []):
        typer.echo(
            f"gpu {gpu['index']}: {gpu['name']}, {gpu['memory_gib']} GiB, "
            f"capability {gpu['capability']}"
        )
    typer.echo("distributions:")
    for name, version in data["distributions"].items():
        typer.echo(f"  {name}=={version}")
    typer.echo("plugins:")
    if isinstance(data["plugins"], str):
        typer.echo(f"  {data['plugins']}")
    else:
        for p in data["plugins"]:
            error = f" ({p['error']})" if p["error"] else ""
            typer.echo(f"  {p['name']} [{p['distribution']} {p['version']}]: {p['status']}{error}")
    if not data["environment"]:
        prefixes = ", ".join(f"{prefix}*" for prefix in ENV_PREFIXES)
        typer.echo(f"environment: none of {prefixes} is set")
        return
    typer.echo("environment:")
    for name, value in data["environment"].items():
        typer.echo(f"  {name}={value}")


def collect_env_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Print the environment (Python, torch, CUDA, GPUs, engine packages, plugins)."""
    data = collect_env()
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    else:
        _print_text(data)
