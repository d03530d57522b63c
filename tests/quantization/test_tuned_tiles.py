"""Measured GEMV tiles (engine_sdk.layers.split_k.tuned_config): a plugin's
``tuned/<device>.json`` row is what a layer runs for that GPU and shape, token counts round
up to the swept ones, and anything the table lacks (another GPU, shape or a CPU) takes the
kernel's default rule. The shipped tables must load and hold tiles the kernels accept."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
import torch
from engine_sdk.layers import split_k

pytest.importorskip("triton")

CUDA = torch.device("cuda")  # a descriptor only: nothing here runs on a GPU


@pytest.fixture
def fake_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A package ``tunedpkg`` with a table for the device ``Fake GPU 9000``."""
    package = tmp_path / "tunedpkg"
    (package / "tuned").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    table = {
        "device": "Fake GPU 9000",
        "configs": {
            "awq_c128,6144,4096,1": {"variant": "fma", "block_n": 256, "num_warps": 8,
                                     "num_stages": 2, "split": 16, "ms": 0.011},
            "awq_c128,6144,4096,4": {"variant": "dot", "block_n": 64, "num_warps": 4,
                                     "num_stages": 4, "split": 8},
        },
    }  # fmt: skip
    (package / "tuned" / "Fake_GPU_9000.json").write_text(json.dumps(table))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU 9000")
    split_k._tuned_table.cache_clear()
    yield "tunedpkg"
    split_k._tuned_table.cache_clear()


def test_file_name_from_device_name() -> None:
    assert split_k.tuned_file_name("NVIDIA H200") == "NVIDIA_H200.json"
    assert split_k.tuned_file_name("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3.json"


def test_lookup_rounds_tokens_up_to_the_swept_counts(fake_plugin: str) -> None:
    one = split_k.tuned_config(fake_plugin, "awq_c128", CUDA, 6144, 4096, 1)
    assert one is not None and one["block_n"] == 256 and one["split"] == 16
    for tokens in (2, 3, 4):  # 2-4 take the 4-token row
        found = split_k.tuned_config(fake_plugin, "awq_c128", CUDA, 6144, 4096, tokens)
        assert found is not None and found["variant"] == "dot"
    assert split_k.tuned_config(fake_plugin, "awq_c128", CUDA, 6144, 4096, 5) is None  # no 16 row
    assert split_k.tuned_config(fake_plugin, "awq_c128", CUDA, 6144, 4096, 17) is None
    assert split_k.tuned_config(fake_plugin, "awq_c64", CUDA, 6144, 4096, 1) is None  # kernel
    assert split_k.tuned_config(fake_plugin, "awq_c128", CUDA, 4096, 4096, 1) is None  # shape
    cpu = torch.device("cpu")
    assert split_k.tuned_config(fake_plugin, "awq_c128", cpu, 6144, 4096, 1) is None


def test_no_table_for_the_device(fake_plugin: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Other GPU")
    assert split_k.tuned_config(fake_plugin, "awq_c128", CUDA, 6144, 4096, 1) is None


def test_layers_take_the_table_row_else_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine_awq import gemv as awq_gemv
    from engine_fp8 import gemv as fp8_gemv

    row = {"variant": "fma", "block_n": 256, "num_warps": 8, "num_stages": 2, "split": 16,
           "ms": 0.011, "default_ms": 0.013}  # fmt: skip
    monkeypatch.setattr(awq_gemv, "tuned_config", lambda *a: row)
    assert awq_gemv.gemv_config(CUDA, 1, 6144, 4096, 128) == awq_gemv.GemvConfig(
        "fma", 256, 8, 2, 16
    )
    monkeypatch.setattr(awq_gemv, "tuned_config", lambda *a: None)
    assert awq_gemv.gemv_config(CUDA, 1, 6144, 4096, 128) == awq_gemv.default_gemv_config(
        1, 6144, 128
    )
    fp8_row = {"variant": "fma", "block_n": 64, "block_k": 256, "num_warps": 8,
               "num_stages": 2, "split": 11}  # fmt: skip
    monkeypatch.setattr(fp8_gemv, "tuned_config", lambda *a: fp8_row)
    assert fp8_gemv.gemv_config(CUDA, 1, 4096, 4096).block_k == 256
    # A block-scaled weight whose 128-column blocks BLOCK_K 256 does not divide: the default.
    blocked = fp8_gemv.gemv_config(CUDA, 1, 4096, 4096, (128, 128))
    assert blocked == fp8_gemv.default_gemv_config(1, 4096, (128, 128))


@pytest.mark.parametrize("package", ["engine_awq", "engine_fp8"])
def test_shipped_tables_hold_valid_tiles(package: str) -> None:
    """Every shipped table parses and each row builds the plugin's GemvConfig with tile
    sizes the kernel asserts on (powers of two, at least 16 columns unless unsplit); the AWQ
    row GEMV's rows (``awq_rows_<launch>_c<chunk>``) build a ``RowsTile`` of the launches
    ``rows_tile`` serves, with power-of-two sizes and whole chunks a K step, and so do the
    wide GEMV's (``awq_wide_...``, a ``WideTile``)."""
    module = __import__(f"{package}.gemv", fromlist=["GemvConfig"])
    folder = resources.files(package).joinpath("tuned")
    tables = [f for f in folder.iterdir() if f.name.endswith(".json")] if folder.is_dir() else []
    for table in tables:
        configs = json.loads(table.read_text())["configs"]
        assert configs, f"{table.name} is empty"
        for key, row in configs.items():
            kernel, n, k, tokens = key.split(",")
            assert int(n) > 0 and int(k) > 0 and int(tokens) in split_k.TUNED_TOKENS
            if kernel.startswith(("awq_rows_", "awq_wide_")):
                from engine_awq.rows import RowsTile
                from engine_awq.wide import WideTile

                kind = RowsTile if kernel.startswith("awq_rows_") else WideTile
                launch, chunk = kernel.split("_", 2)[2].split("_c")
                assert launch in ("plain", "norm", "gated") and int(chunk) >= 1
                tile = kind(**{f: v for f, v in row.items() if f in kind._fields})
                tile = RowsTile(tile.block_n, tile.block_k, *tile[2:])
                for size in (tile.block_n, tile.block_k):
                    assert size >= 1 and size & (size - 1) == 0, (key, tile)
                assert tile.block_k % int(chunk) == 0, (key, tile)
                assert tile.num_warps in (None, 1, 2, 4, 8, 16), (key, tile)
                assert tile.num_stages is None or tile.num_stages >= 1, (key, tile)
                continue
            config = module.GemvConfig(
                **{f: v for f, v in row.items() if f in module.GemvConfig._fields}
            )
            assert config.variant in ("fma", "dot")
            assert config.block_n & (config.block_n - 1) == 0
            # narrower tiles (the few-rows FMA tiles) only unsplit: the layers' split-K
            # counters are one per 16 columns
            assert config.block_n >= 16 or (config.variant == "fma" and config.split == 1)
            assert config.split is None or config.split >= 1
