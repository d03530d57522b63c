"""The ``engine`` CLI root: --version, plugins list (never imports torch), collect-env."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import engine
import engine_sdk
import pytest
import tomllib

if TYPE_CHECKING:
    from conftest import RunEngine

REPO_ROOT = Path(__file__).resolve().parents[2]


def _first_party_entry_points() -> dict[str, str]:
    """``{entry-point name: distribution}`` of plugins/* folders that are installed."""
    found = {}
    for pyproject in sorted(REPO_ROOT.glob("plugins/*/pyproject.toml")):
        data = tomllib.loads(pyproject.read_text())
        dist = data["project"]["name"]
        try:
            metadata.distribution(dist)
        except metadata.PackageNotFoundError:
            continue
        for name in data["project"]["entry-points"]["engine.plugins"]:
            found[name] = dist
    return found


def test_version(run_engine: RunEngine) -> None:
    out = run_engine("--version")
    assert out.returncode == 0
    assert (
        out.stdout.strip() == f"engine {engine.__version__} (engine-sdk {engine_sdk.__version__})"
    )


def test_list_json_has_first_party_plugins(run_engine: RunEngine) -> None:
    out = run_engine("plugins", "list", "--json")
    assert out.returncode == 0, out.stderr
    payload = json.loads(out.stdout)
    assert payload["engine_sdk_version"] == engine_sdk.__version__
    assert payload["registry"] == str(REPO_ROOT / "registry.toml")
    listed = {p["name"]: p for p in payload["plugins"]}
    expected = _first_party_entry_points()
    for name, dist in expected.items():
        assert listed[name]["distribution"] == dist
        assert listed[name]["status"] == "loaded", listed[name]["error"]
        assert listed[name]["known_to_registry"] is True
        assert listed[name]["sdk_compatible"] is True
        assert listed[name]["provides"], f"{name} provides nothing"


def test_list_table_and_kind_filter(run_engine: RunEngine) -> None:
    out = run_engine("plugins", "list")
    assert out.returncode == 0, out.stderr
    header = out.stdout.splitlines()[0].split()
    assert header == ["NAME", "DISTRIBUTION", "VERSION", "PROVIDES", "SDK", "STATUS", "REGISTRY"]
    out = run_engine("plugins", "list", "--json", "--kind", "attention_backend")
    plugins = json.loads(out.stdout)["plugins"]
    assert all(set(p["provides"]) == {"attention_backend"} for p in plugins)
    bad = run_engine("plugins", "list", "--kind", "nonsense")
    assert bad.returncode == 2 and "unknown kind 'nonsense'" in bad.stderr


def test_available_lists_uninstalled_catalogue_entries(run_engine: RunEngine) -> None:
    out = run_engine("plugins", "list", "--available", "--json")
    assert out.returncode == 0, out.stderr
    available = {e["name"]: e for e in json.loads(out.stdout)["available"]}
    catalogue = tomllib.loads((REPO_ROOT / "registry.toml").read_text())["plugins"]
    for name, entry in available.items():
        listed = catalogue[name]
        assert entry["distribution"] == listed["distribution"]
        assert entry["status"] == listed["status"]
        if "path" in listed:
            assert entry["install"] == f"pip install -e {REPO_ROOT / listed['path']}"
        else:
            assert entry["install"] == f"pip install {listed['distribution']}"
    installed = _first_party_entry_points()
    assert not set(installed) & set(available)
    out = run_engine("plugins", "list", "--available", "--json", "--kind", "quantization_method")
    kinds = [set(e["provides"]) for e in json.loads(out.stdout)["available"]]
    assert all(k == {"quantization_method"} or "quantization_method" in k for k in kinds)
    assert all("quantization_method" in k for k in kinds)


def test_missing_requested_plugin_fails_with_hint(run_engine: RunEngine, tmp_path: Path) -> None:
    out = run_engine("plugins", "list", "--plugin", "does-not-exist")
    assert out.returncode == 1
    assert "plugin 'does-not-exist' was requested" in out.stderr
    assert "pip install engine-does-not-exist" in out.stderr
    registry = tmp_path / "registry.toml"
    registry.write_text(
        '[plugins.zzq]\ndistribution = "engine-zzq"\nentry_point = "engine_zzq.plugin"\n'
        'status = "planned"\nprovides = { quantization_method = ["zzq"] }\n'
    )
    env = {"ENGINE_PLUGINS": "zzq", "ENGINE_REGISTRY": str(registry)}
    out = run_engine("plugins", "list", env=env)
    assert out.returncode == 1
    assert "'zzq' was requested" in out.stderr
    assert "install it with: pip install engine-zzq" in out.stderr


def test_plugins_list_never_imports_torch() -> None:
    code = (
        "import sys\n"
        "import engine_sdk.testing.pytest_plugin\n"
        "from engine.cli.main import app\n"
        "for args in (['plugins', 'list'], ['plugins', 'list', '--json'],"
        " ['plugins', 'list', '--available']):\n"
        "    try:\n"
        "        app(args, standalone_mode=False)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "mods = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]\n"
        "print('TORCH:', mods[:3])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "TORCH: []" in out.stdout


def test_collect_env_masks_secrets(run_engine: RunEngine) -> None:
    env = {"ENGINE_API_KEY": "sk-very-secret", "HF_TOKEN": "hf_secret", "ENGINE_LOG_LEVEL": "debug"}
    out = run_engine("collect-env", "--json", env=env)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["environment"]["ENGINE_API_KEY"] == "***"
    assert data["environment"]["HF_TOKEN"] == "***"
    assert data["environment"]["ENGINE_LOG_LEVEL"] == "debug"
    assert "sk-very-secret" not in out.stdout and "hf_secret" not in out.stdout
    import torch

    assert data["torch"] == torch.__version__
    assert data["python"] == sys.version.split()[0]
    assert data["distributions"]["engine"] == engine.__version__
    assert data["distributions"]["engine-sdk"] == engine_sdk.__version__
    text = run_engine("collect-env", env=env)
    assert "ENGINE_API_KEY=***" in text.stdout and "sk-very-secret" not in text.stdout


def test_mounts_cli_command_from_plugin(fake_dist, run_engine: RunEngine) -> None:  # type: ignore[no-untyped-def]
    site = fake_dist(
        "hello",
        """
        from engine_sdk import CLICommandSpec, hookimpl

        def hello(name: str = "world") -> None:
            print(f"hello {name}")

        @hookimpl
        def register_cli_commands():
            return [CLICommandSpec("hello", __name__ + ":hello", help="say hello")]
        """,
    )
    out = run_engine("hello", "--name", "plugin", pythonpath=site)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "hello plugin"
    helptext = run_engine("--help", pythonpath=site)
    assert "hello" in helptext.stdout and "plugins" in helptext.stdout


def test_available_says_whether_registry_toml_was_found(
    run_engine: RunEngine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    registry = tmp_path / "registry.toml"
    registry.write_text(
        '[plugins.reference]\ndistribution = "engine-reference"\n'
        'entry_point = "engine_reference.plugin"\nstatus = "stable"\n'
    )
    out = run_engine("plugins", "list", "--available", env={"ENGINE_REGISTRY": str(registry)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"every plugin in {registry} is installed"
    from engine.cli.plugins_cmd import _print_available
    from engine.plugins import Catalogue

    _print_available([], Catalogue([]))
    assert capsys.readouterr().out.startswith("no registry.toml found: set ENGINE_REGISTRY")


def test_collect_env_says_when_no_variable_is_set(capsys: pytest.CaptureFixture[str]) -> None:
    from engine.cli.collect_env import _print_text, collect_env

    data = collect_env(env={"PATH": "/usr/bin"})
    assert data["environment"] == {}
    _print_text(data)
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("environment: none of ENGINE_*, CUDA_*")
    assert "environment:" not in lines[:-1]


def test_explain_lists_every_reason(run_engine: RunEngine) -> None:
    out = run_engine(
        "plugins", "list", "--explain", "--device", "cuda", "--capability", "7.0",
        "--kv-cache-dtype", "fp8_e5m2", "--block-size", "8",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == (
        "for device=cuda (capability 7.0), dtype=bfloat16, block_size=8, kv_cache_dtype=fp8_e5m2:"
    )
    triton = lines.index("  triton: refused")
    assert lines[triton + 1 : triton + 3] == [
        "    - kv_cache_dtype 'fp8_e5m2' not in ['auto', 'fp8', 'fp8_e4m3']",
        "    - block size 8 not in [16, 32, 64]",
    ]
    assert "  reference: fits" in lines
    awq = lines.index("  awq: refused")
    assert "needs compute capability >= 7.5, this GPU is 7.0" in lines[awq + 1]
    report = json.loads(run_engine("plugins", "list", "--explain", "--json").stdout)
    assert report["attention_backend"]["reference"] == {"fits": True, "reasons": []}
