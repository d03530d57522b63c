"""Broken plugins installed as real wheels into a fresh venv stay contained.

Five fake plugins, each broken in one way: its module does not import, a hook raises, its
engine-sdk range excludes the installed SDK, a declared dependency is not installed, and
a model format whose code does not import (found only when the core uses it). Autoloaded,
each is listed as failed with its reason and the first-party plugins keep working; an HF
folder still loads. Required with ``--plugin NAME``, each fails the start naming the
plugin, the cause and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import engine_sdk
import pytest
from wheels import build_plugin_wheel, fresh_venv, pip_install, run_python

BROKEN: dict[str, tuple[str, tuple[str, ...]]] = {
    "broken_import": ("import engine_no_such_module_xyz\n", ("engine-sdk>=0.1,<0.2",)),
    "broken_hook": (
        """
        from engine_sdk import hookimpl

        @hookimpl
        def register_tool_parsers():
            raise RuntimeError("hook exploded")
        """,
        ("engine-sdk>=0.1,<0.2",),
    ),
    "future_sdk": (
        """
        from engine_sdk import ToolParserSpec, hookimpl

        @hookimpl
        def register_tool_parsers():
            return [ToolParserSpec("future", "engine_future_sdk_plugin:Parser")]
        """,
        ("engine-sdk>=9.0",),
    ),
    "missing_dep": (
        """
        from engine_sdk import ModelFormatSpec, hookimpl

        @hookimpl
        def register_model_formats():
            return [ModelFormatSpec("mdp", "engine_missing_dep_plugin:Fmt", suffixes=(".mdp",))]
        """,
        ("engine-sdk>=0.1,<0.2", "engine-no-such-dependency-xyz>=1"),
    ),
    # No suffixes: the core must ask it about every path, and its code does not import.
    "broken_format": (
        """
        from engine_sdk import ModelFormatSpec, hookimpl

        @hookimpl
        def register_model_formats():
            return [ModelFormatSpec("brokenfmt", "engine_no_such_format_xyz:Fmt")]
        """,
        ("engine-sdk>=0.1,<0.2",),
    ),
}


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the five broken plugins pip-installed from their wheels."""
    root = tmp_path_factory.mktemp("broken")
    wheels = [
        build_plugin_wheel(root / "wheels", name, source, requires=requires)
        for name, (source, requires) in BROKEN.items()
    ]
    python = fresh_venv(root / "venv")
    pip_install(python, *wheels)
    return python


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hf")
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_list_shows_broken_plugins_failed_and_the_rest_loaded(venv: Path) -> None:
    out = run_python(venv, "-m", "engine.cli.main", "plugins", "list", "--json")
    assert out.returncode == 0, out.stderr
    plugins = {p["name"]: p for p in json.loads(out.stdout)["plugins"]}
    sdk = engine_sdk.__version__
    expected_errors = {
        "broken_import": "ModuleNotFoundError: No module named 'engine_no_such_module_xyz'",
        "broken_hook": "a hook failed: RuntimeError: hook exploded",
        "future_sdk": f"requires engine-sdk>=9.0 but engine-sdk {sdk} is installed",
        "missing_dep": "missing dependencies: engine-no-such-dependency-xyz>=1",
    }
    for name, error in expected_errors.items():
        assert plugins[name]["status"] == "failed", plugins[name]
        assert error in plugins[name]["error"], plugins[name]["error"]
        assert plugins[name]["provides"] == {}
    assert plugins["future_sdk"]["sdk_compatible"] is False
    # Its entry point imports; the target is only imported when the core uses the format.
    assert plugins["broken_format"]["status"] == "loaded"
    for name in ("reference", "llama", "toolparsers"):
        assert plugins[name]["status"] == "loaded", plugins[name]
    text = run_python(venv, "-m", "engine.cli.main", "plugins", "list")
    assert text.returncode == 0, text.stderr
    assert "broken_hook failed: a hook failed: RuntimeError: hook exploded" in text.stdout


def test_hf_folder_loads_next_to_broken_plugins(venv: Path, hf_folder: Path) -> None:
    code = (
        "import sys\n"
        "from engine.config import EngineArgs\n"
        "from engine.model_executor.source import open_model_source\n"
        "from engine.plugins import PluginManager\n"
        "pm = PluginManager.load(report_failures=True)\n"
        "print('loaded', file=sys.stderr)\n"
        f"source = open_model_source(EngineArgs(model={str(hf_folder)!r}), pm)\n"
        "print(type(source).__name__, pm.get_plugin('broken_format').status)\n"
        "print(pm.registry.names('model_format'))\n"
    )
    out = run_python(venv, "-c", code)
    assert out.returncode == 0, out.stderr
    kind, status = out.stdout.splitlines()[0].split()
    assert (kind, status) == ("HFFolderSource", "failed")
    assert "brokenfmt" not in out.stdout.splitlines()[1] and "gguf" in out.stdout
    at_load, at_use = out.stderr.split("loaded\n")
    for name in ("broken-import", "broken-hook", "future-sdk", "missing-dep"):
        assert at_load.count(f"plugin engine-{name} (plugin") == 1, out.stderr
    assert "engine_no_such_format_xyz" in at_use and "broken-format" in at_use


@pytest.mark.parametrize(
    ("name", "cause", "fix"),
    [
        ("broken_import", "No module named 'engine_no_such_module_xyz'", "reinstall it"),
        ("broken_hook", "RuntimeError: hook exploded", "report it to the authors"),
        ("future_sdk", "requires engine-sdk>=9.0", "install a release of engine-future-sdk"),
        ("missing_dep", "missing dependencies", "pip install 'engine-no-such-dependency-xyz>=1'"),
    ],
)
def test_required_broken_plugin_fails_the_start(
    venv: Path, name: str, cause: str, fix: str
) -> None:
    out = run_python(venv, "-m", "engine.cli.main", "plugins", "list", "--plugin", name)
    assert out.returncode == 1
    message = out.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert f"plugin {name!r}" in message and cause in message and fix in message, message
    assert f"drop --plugin {name}" in message


def test_required_broken_format_fails_when_used(venv: Path, hf_folder: Path) -> None:
    code = f"from engine import LLM\nLLM(model={str(hf_folder)!r}, plugins=['broken_format'])\n"
    out = run_python(venv, "-c", code)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert "plugin 'broken_format'" in last and "engine_no_such_format_xyz" in last, last


def test_workers_receive_the_resolved_set(venv: Path) -> None:
    code = (
        "from engine.config import EngineArgs\n"
        "from engine.executor.multiproc import worker_engine_args\n"
        "from engine.plugins import PluginManager\n"
        "pm = PluginManager.load()\n"
        "args = worker_engine_args(EngineArgs(model='m'), pm)\n"
        "print(' '.join(args.plugins))\n"
        "worker = PluginManager.load(requested=args.plugins)\n"
        "print(' '.join(sorted(p.name for p in worker.plugins if p.status == 'loaded')))\n"
        "print(' '.join(sorted(p.name for p in pm.plugins if p.status == 'loaded')))\n"
    )
    out = run_python(venv, "-c", code)
    assert out.returncode == 0, out.stderr
    plugins, in_worker, in_engine = out.stdout.splitlines()
    for name in ("broken_import", "broken_hook", "future_sdk", "missing_dep"):
        assert f"no:{name}" in plugins.split()
    assert "reference" in plugins.split() and "no:reference" not in plugins.split()
    assert in_worker == in_engine and "broken_format" in in_engine
