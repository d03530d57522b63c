"""The quantization plugins' split-K decode GEMVs take decode batches by default (they beat
the older GEMMs on the H200, 2026-12-04); ENGINE_QUANT_GEMV=0
(``engine_sdk.runtime.quant_gemv_enabled``) turns them off in every plugin that has one
(checked in a fresh interpreter per value: the limit is read at import)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

GEMV_MAX_TOKENS = 16  # the split-K GEMVs' limit when on


@pytest.mark.parametrize("module", ["engine_awq.method", "engine_fp8.method"])
@pytest.mark.parametrize("env,limit", [(None, GEMV_MAX_TOKENS), ("1", GEMV_MAX_TOKENS), ("0", 0)])
def test_split_k_gemv_is_the_default_and_env_zero_turns_it_off(module, env, limit) -> None:
    environ = {k: v for k, v in os.environ.items() if k != "ENGINE_QUANT_GEMV"}
    if env is not None:
        environ["ENGINE_QUANT_GEMV"] = env
    code = f"import {module} as m; print(m.GEMV_MAX_TOKENS)"
    out = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == limit


@pytest.mark.parametrize(
    "env,limit",
    [({}, 1), ({"ENGINE_AWQ_ROW_GEMV": "0"}, 0), ({"ENGINE_AWQ_ROW_GEMV": "4"}, 4),
     ({"ENGINE_AWQ_ROW_GEMV": "9"}, 4), ({"ENGINE_QUANT_GEMV": "0"}, 0)],
)  # fmt: skip
def test_awq_row_gemv_takes_one_token_by_default(env: dict, limit: int) -> None:
    """The AWQ row GEMV (``engine_awq.rows``) takes one-token calls by default;
    ``ENGINE_AWQ_ROW_GEMV`` sets its tokens (0: the split-K GEMV), and it is off with the
    quantized GEMVs (``ENGINE_QUANT_GEMV=0``)."""
    names = ("ENGINE_QUANT_GEMV", "ENGINE_AWQ_ROW_GEMV")
    environ = {k: v for k, v in os.environ.items() if k not in names} | env
    code = "import engine_awq.method as m; print(m.ROW_GEMV_MAX_TOKENS)"
    out = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == limit


@pytest.mark.parametrize(
    "env,sweep",
    [({}, False), ({"ENGINE_AWQ_ROWS_BLOCK_N": "8"}, True),
     ({"ENGINE_AWQ_ROWS_BLOCK_K": "1024"}, True)],
)  # fmt: skip
def test_awq_row_tile_switches_bypass_the_tuned_table(env: dict, sweep: bool) -> None:
    """Either row-tile switch, set at import, makes every launch take the environment's
    tile instead of the GPU's measured one (``engine_awq.rows.SWEEP_TILE``)."""
    names = ("ENGINE_AWQ_ROWS_BLOCK_N", "ENGINE_AWQ_ROWS_BLOCK_K")
    environ = {k: v for k, v in os.environ.items() if k not in names} | env
    code = "import engine_awq.rows as r; t = r.RowsTile(); print(r.SWEEP_TILE, *t[:2])"
    out = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    flag, block_n, block_k = out.stdout.split()
    assert flag == str(sweep)
    assert int(block_n) == int(env.get("ENGINE_AWQ_ROWS_BLOCK_N", 4))
    assert int(block_k) == int(env.get("ENGINE_AWQ_ROWS_BLOCK_K", 2048))
