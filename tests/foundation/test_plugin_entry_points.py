"""Discovery through real entry points: fake installed distributions in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conftest import FakeDist, RunEngine

GOOD = """
from engine_sdk import ReasoningParserSpec, hookimpl

@hookimpl
def register_reasoning_parsers():
    return [ReasoningParserSpec("fake_think", "fake_target_module:Parser")]
"""

RAISES_ON_IMPORT = """
raise ImportError("this plugin is broken on purpose")
"""


def _plugins(stdout: str) -> dict[str, dict[str, object]]:
    return {p["name"]: p for p in json.loads(stdout)["plugins"]}


def test_failed_import_is_listed_not_fatal(fake_dist: FakeDist, run_engine: RunEngine) -> None:
    fake_dist("goodfake", GOOD)
    site = fake_dist("brokenfake", RAISES_ON_IMPORT)
    out = run_engine("plugins", "list", "--json", pythonpath=site)
    assert out.returncode == 0, out.stderr
    plugins = _plugins(out.stdout)
    broken = plugins["brokenfake"]
    assert broken["status"] == "failed"
    assert broken["distribution"] == "engine-brokenfake"
    assert "broken on purpose" in str(broken["error"])
    good = plugins["goodfake"]
    assert good["status"] == "loaded"
    assert good["provides"] == {"reasoning_parser": ["fake_think"]}
    assert good["version"] == "0.3.0"
    assert good["sdk_compatible"] is True and good["known_to_registry"] is False

    table = run_engine("plugins", "list", pythonpath=site)
    assert table.returncode == 0
    line = next(row for row in table.stdout.splitlines() if row.startswith("brokenfake"))
    assert "failed" in line
    assert "brokenfake failed: import of" in table.stdout


def test_requested_broken_plugin_is_fatal(fake_dist: FakeDist, run_engine: RunEngine) -> None:
    site = fake_dist("brokenfake", RAISES_ON_IMPORT)
    out = run_engine("plugins", "list", "--plugin", "brokenfake", pythonpath=site)
    assert out.returncode == 1
    assert "'brokenfake'" in out.stderr and "broken on purpose" in out.stderr


def test_block_and_autoload(fake_dist: FakeDist, run_engine: RunEngine) -> None:
    site = fake_dist("goodfake", GOOD)
    out = run_engine("plugins", "list", "--json", "--plugin", "no:goodfake", pythonpath=site)
    assert _plugins(out.stdout)["goodfake"]["status"] == "blocked"
    out = run_engine(
        "plugins", "list", "--json", pythonpath=site, env={"ENGINE_PLUGINS": "no:engine-goodfake"}
    )
    assert _plugins(out.stdout)["goodfake"]["status"] == "blocked"
    env = {"ENGINE_PLUGINS_AUTOLOAD": "0"}
    out = run_engine("plugins", "list", "--json", pythonpath=site, env=env)
    plugins = _plugins(out.stdout)
    assert {p["status"] for p in plugins.values()} == {"not_loaded"}
    out = run_engine("plugins", "list", "--json", "--plugin", "goodfake", pythonpath=site, env=env)
    plugins = _plugins(out.stdout)
    assert plugins["goodfake"]["status"] == "loaded" and plugins["goodfake"]["requested"]
    assert {p["status"] for n, p in plugins.items() if n != "goodfake"} <= {"not_loaded"}


def test_duplicate_spec_across_dists(fake_dist: FakeDist, run_engine: RunEngine) -> None:
    fake_dist("one", GOOD)
    site = fake_dist("two", GOOD)
    out = run_engine("plugins", "list", pythonpath=site)
    assert out.returncode == 1
    assert "'fake_think' is provided twice" in out.stderr
    assert "engine-one" in out.stderr and "engine-two" in out.stderr


def test_incompatible_sdk_is_flagged(fake_dist: FakeDist, run_engine: RunEngine) -> None:
    site = fake_dist("oldfake", GOOD, requires="engine-sdk>=0.0.1,<0.1")
    out = run_engine("plugins", "list", "--json", pythonpath=site)
    fake = _plugins(out.stdout)["oldfake"]
    assert fake["sdk_compatible"] is False
    assert fake["sdk"].startswith("NO: needs engine-sdk")


def test_trace_logs_hook_calls(fake_dist: FakeDist, run_engine: RunEngine) -> None:
    site = fake_dist("goodfake", GOOD)
    out = run_engine("plugins", "list", pythonpath=site, env={"ENGINE_TRACE_PLUGINS": "1"})
    assert out.returncode == 0, out.stderr
    assert "[engine.plugins]" in out.stderr and "register_reasoning_parsers" in out.stderr


QUANT = """
from engine_sdk import QuantizationMethodSpec, hookimpl

class NotAConfig:
    pass

@hookimpl
def register_quantization_methods():
    return [QuantizationMethodSpec("fakeq", __name__ + ":NotAConfig")]
"""


def test_quant_method_pulls_in_its_plugin(fake_dist: FakeDist) -> None:
    site = fake_dist("quantfake", QUANT)
    code = (
        "from engine.plugins import PluginError, PluginManager\n"
        "pm = PluginManager.load()\n"
        "assert pm.get_plugin('quantfake').status == 'not_loaded'\n"
        "try:\n"
        "    pm.require_quant_method('fakeq')\n"
        "except PluginError as exc:\n"
        "    print('ERR', exc)\n"
        "print('STATUS', pm.get_plugin('quantfake').status)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINE_")}
    env.update({"PYTHONPATH": str(site), "ENGINE_PLUGINS_AUTOLOAD": "0"})
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "STATUS loaded" in out.stdout
    assert "does not subclass engine_sdk.interfaces.quantization:QuantizationConfig" in out.stdout
