"""Command-line flags of ``engine serve``, generated from ``EngineArgs`` and ``ServerArgs``.

Every dataclass field becomes a flag (``max_num_seqs`` -> ``--max-num-seqs``; bools get a
``--no-`` form; dicts are JSON strings; ``plugins`` is the repeatable ``--plugin``).
``--config file.yaml`` supplies the same keys; the command line wins over the file, the file
over the defaults. ``--help=listgroup``, ``--help=GROUP`` and ``--help=FLAG`` narrow help.
"""

from __future__ import annotations

import argparse
import difflib
import json
import typing
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from engine.config import EngineArgs
from engine.server_config import ServerArgs, parse_token_count


class UsageError(ValueError):
    """A flag or config-file value is wrong; the message names it."""


@dataclass(frozen=True)
class FlagSpec:
    dest: str  # dataclass field name
    flag: str  # --max-num-seqs
    owner: str  # "engine" or "server"
    group: str
    help: str
    kind: str  # bool, int, float, str, json, list, tokens
    default: Any

    def convert(self, value: Any) -> Any:
        """Turn a command-line string or a YAML value into the field's type."""
        try:
            return _convert(self.kind, value)
        except (ValueError, TypeError) as exc:
            raise UsageError(f"{self.flag}: {exc}") from None


def _convert(kind: str, value: Any) -> Any:
    if value is None:
        return None
    if kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "1", "yes", "on"):
            return True
        if text in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"expected true or false, got {value!r}")
    if kind == "int":
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(f"expected an integer, got {value!r}")
        return int(value)
    if kind == "tokens":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return parse_token_count(str(value))
    if kind == "float":
        if isinstance(value, bool):
            raise ValueError(f"expected a number, got {value!r}")
        return float(value)
    if kind == "json":
        if isinstance(value, dict):
            return value
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"expected a JSON object, got {value!r} ({exc})") from None
        if not isinstance(parsed, dict):
            raise ValueError(f"expected a JSON object like '{{\"key\": 1}}', got {value!r}")
        return parsed
    if kind == "list":
        if isinstance(value, (list, tuple)):
            return [str(v) for v in value]
        text = str(value).strip()
        if text.startswith("["):
            parsed = json.loads(text)
            return [str(v) for v in parsed]
        return [part.strip() for part in text.split(",") if part.strip()]
    return str(value)


def _kind(dest: str, annotation: Any) -> str:
    if dest == "max_model_len":
        return "tokens"
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin in (list, tuple):
        return "list"
    if origin is dict:
        return "json"
    if args and len(args) == 1:  # Optional[X]
        return _kind(dest, args[0])
    for kind, typ in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if annotation is typ:
            return kind
    return "str"


# Fields whose flag is not the field name with dashes (dotted names group related settings,
# and the YAML file may nest them: ``structured_outputs_config: {backend: outlines}``).
_FLAG_NAMES = {
    "plugins": "--plugin",
    "structured_outputs_backend": "--structured-outputs-config.backend",
    "structured_outputs_max_repeat": "--structured-outputs-config.max-repeat",
    "structured_outputs_max_schema_depth": "--structured-outputs-config.max-schema-depth",
    "structured_outputs_compile_timeout_s": "--structured-outputs-config.compile-timeout-s",
    "structured_outputs_compile_memory_bytes": ("--structured-outputs-config.compile-memory-bytes"),
}


def flag_specs() -> list[FlagSpec]:
    """All flags, engine fields first, in dataclass order."""
    specs: list[FlagSpec] = []
    for owner, cls in (("engine", EngineArgs), ("server", ServerArgs)):
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            if f.default is not MISSING:
                default = f.default
            elif f.default_factory is not MISSING:
                default = f.default_factory()
            else:
                default = None
            flag = _FLAG_NAMES.get(f.name, "--" + f.name.replace("_", "-"))
            specs.append(
                FlagSpec(
                    dest=f.name,
                    flag=flag,
                    owner=owner,
                    group=f.metadata.get("group", owner),
                    help=f.metadata.get("help", ""),
                    kind=_kind(f.name, hints[f.name]),
                    default=default,
                )
            )
    specs.append(
        FlagSpec("config", "--config", "server", "server", "YAML file of flags.", "str", None)
    )
    return specs


def _spec_by_key(specs: list[FlagSpec]) -> dict[str, FlagSpec]:
    """Lookup by dest, flag name without dashes, and ``plugin``."""
    out: dict[str, FlagSpec] = {}
    for spec in specs:
        out[spec.dest] = spec
        out[spec.flag.lstrip("-").replace("-", "_")] = spec
    return out


def build_parser(specs: list[FlagSpec]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="engine serve",
        usage="engine serve [MODEL] [--flag VALUE ...]  (details: engine serve --help)",
        add_help=False,
        allow_abbrev=False,
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("model_positional", nargs="?", metavar="MODEL")
    parser.add_argument("--help", "-h", nargs="?", const="", dest="help")
    for spec in specs:
        kwargs: dict[str, Any] = {"dest": spec.dest, "help": spec.help}
        if spec.kind == "bool":
            kwargs["action"] = argparse.BooleanOptionalAction
        elif spec.dest == "plugins":
            kwargs["action"] = "append"
            kwargs["metavar"] = "NAME"
        elif spec.dest in ("served_model_name", "lora_modules"):
            kwargs["nargs"] = "+"
            kwargs["metavar"] = "NAME"
        else:
            kwargs["metavar"] = spec.dest.upper()

            def typed(value: str, spec: FlagSpec = spec) -> Any:
                try:
                    return spec.convert(value)
                except UsageError as exc:
                    raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[1]) from None

            typed.__name__ = spec.kind
            kwargs["type"] = typed
        names = [spec.flag]
        if spec.dest == "plugins":
            names.append("--plugins")
        parser.add_argument(*names, **kwargs)
    return parser


def load_config_file(path: str, specs: list[FlagSpec]) -> dict[str, Any]:
    """Read ``--config``: flag names without dashes (dashes or underscores) -> values."""
    import yaml

    file = Path(path)
    if not file.is_file():
        raise UsageError(f"--config: file {path!r} does not exist")
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UsageError(f"--config: {path!r} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"--config: {path!r} must hold a mapping of flag names to values")
    lookup = _spec_by_key(specs)
    data = _flatten_dotted(data, lookup)
    unknown = [k for k in data if str(k).replace("-", "_") not in lookup]
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(str(key).replace("-", "_"), lookup, n=2)
            hints.append(repr(key) + (f" (did you mean {', '.join(close)}?)" if close else ""))
        raise UsageError(f"--config {path}: unknown key(s): {', '.join(hints)}")
    out: dict[str, Any] = {}
    for key, value in data.items():
        spec = lookup[str(key).replace("-", "_")]
        if spec.dest == "config":
            raise UsageError(f"--config {path}: a config file cannot name another config file")
        if spec.kind == "list" and isinstance(value, str) and spec.dest == "plugins":
            value = [value]
        out[spec.dest] = spec.convert(value)
    return out


def _flatten_dotted(data: dict[Any, Any], lookup: dict[str, FlagSpec]) -> dict[Any, Any]:
    """``{"structured_outputs_config": {"backend": x}}`` -> ``{"structured_outputs_config.backend":
    x}`` where the dotted name is a flag; other keys stay as they are."""
    out: dict[Any, Any] = {}
    for key, value in data.items():
        prefix = str(key).replace("-", "_")
        if isinstance(value, dict) and prefix not in lookup:
            for sub, sub_value in value.items():
                dotted = f"{prefix}.{str(sub).replace('-', '_')}"
                out[dotted if dotted in lookup else f"{key}.{sub}"] = sub_value
            continue
        out[key] = value
    return out


@dataclass
class ParsedServeArgs:
    engine_args: EngineArgs
    server_args: ServerArgs
    from_command_line: set[str]  # field names given explicitly as flags


def parse_serve_args(argv: list[str]) -> ParsedServeArgs | str:
    """Parse argv; returns the help text instead when ``--help`` was asked for."""
    specs = flag_specs()
    parser = build_parser(specs)
    known, unknown = parser.parse_known_args(argv)
    if unknown:
        raise UsageError(_unknown_flags_message(unknown, specs))
    ns = vars(known)
    if "help" in ns:
        return render_help(specs, ns["help"] or "")
    cli: dict[str, Any] = {k: v for k, v in ns.items() if k != "model_positional"}
    positional = ns.get("model_positional")
    if positional is not None:
        if cli.get("model") not in (None, positional):
            raise UsageError(
                f"model given twice: {positional!r} (positional) and {cli['model']!r} (--model)"
            )
        cli["model"] = positional
    merged: dict[str, Any] = {}
    config_path = cli.pop("config", None)
    if config_path:
        merged.update(load_config_file(config_path, specs))
    merged.update(cli)
    engine_kwargs = {k: v for k, v in merged.items() if k in EngineArgs.field_names()}
    server_kwargs = {k: v for k, v in merged.items() if k not in engine_kwargs}
    try:
        server_args = ServerArgs(**server_kwargs)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return ParsedServeArgs(
        engine_args=EngineArgs(**engine_kwargs),
        server_args=server_args,
        from_command_line=set(cli),
    )


def _unknown_flags_message(unknown: list[str], specs: list[FlagSpec]) -> str:
    flags = [s.flag for s in specs] + [f"--no-{s.flag[2:]}" for s in specs if s.kind == "bool"]
    hints = []
    for arg in unknown:
        name = arg.split("=", 1)[0]
        close = difflib.get_close_matches(name, flags, n=2) if name.startswith("--") else []
        hints.append(repr(arg) + (f" (did you mean {' or '.join(close)}?)" if close else ""))
    return f"unknown argument(s): {', '.join(hints)}; see engine serve --help"


def _flag_line(spec: FlagSpec) -> str:
    if spec.kind == "bool":
        name = f"{spec.flag}/--no-{spec.flag[2:]}"
    elif spec.dest == "plugins":
        name = "--plugin NAME (repeatable)"
    elif spec.dest == "served_model_name":
        name = f"{spec.flag} NAME [NAME ...]"
    elif spec.dest == "lora_modules":
        name = f"{spec.flag} NAME=PATH|JSON [...]"
    else:
        name = f"{spec.flag} {spec.dest.upper()}"
    default = "" if spec.default in (None, [], {}) else f" [default: {spec.default}]"
    return f"  {name}\n      {spec.help}{default}"


def render_help(specs: list[FlagSpec], topic: str) -> str:
    groups: dict[str, list[FlagSpec]] = {}
    for spec in specs:
        groups.setdefault(spec.group, []).append(spec)
    usage = "usage: engine serve [MODEL] [--flag VALUE ...]"
    if topic == "":
        parts = [usage, "", "Serve MODEL over an OpenAI-compatible HTTP API.", ""]
        parts.append("Narrow help with --help=listgroup, --help=GROUP or --help=FLAG.")
        for name, members in groups.items():
            parts += ["", f"{name}:"] + [_flag_line(s) for s in members]
        return "\n".join(parts)
    if topic == "listgroup":
        lines = ["Flag groups (show one with --help=GROUP):"]
        lines += [f"  {name} ({len(members)} flags)" for name, members in groups.items()]
        return "\n".join(lines)
    if topic in groups:
        return "\n".join([f"{topic}:"] + [_flag_line(s) for s in groups[topic]])
    key = topic.lstrip("-").replace("-", "_")
    lookup = _spec_by_key(specs)
    if key.startswith("no_") and key[3:] in lookup and lookup[key[3:]].kind == "bool":
        key = key[3:]
    if key in lookup:
        spec = lookup[key]
        return f"{_flag_line(spec)}\n      group: {spec.group}"
    close = difflib.get_close_matches(key, list(lookup) + list(groups), n=3)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise UsageError(
        f"--help={topic}: no such group or flag.{hint} Groups: {', '.join(groups)} "
        "(or --help=listgroup)."
    )
