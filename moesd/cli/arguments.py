"""Checks and conversions of command-line arguments that several sub-commands share."""

import argparse
import re
from pathlib import Path

import numpy as np

from moesd._checks import LARGEST_WHOLE, UsageError, usage_errors


MAX_VALUES = 10**5
"""The most values one list option (``--batch 1-256``, ``--alpha 0.7,0.9``) may hold."""
_WHOLE_OR_RANGE = re.compile(r"([+-]?[0-9]+)(?:-([+-]?[0-9]+))?")


def _parts(text: str, name: str, example: str) -> list[str]:
    """The comma-separated parts of ``text``, stripped; UsageError naming ``name`` for an empty one or too many."""
    parts = [part.strip() for part in text.split(",")]
    if "" in parts:
        raise UsageError(f"{name} has an empty part in {text!r}: give {example}")
    if len(parts) > MAX_VALUES:
        raise UsageError(f"{name} has {len(parts)} parts; at most {MAX_VALUES} values are allowed")
    return parts


def integers(text: str, name: str) -> np.ndarray:
    """``"1-5"``, ``"1,2,4"`` or ``"1-4,8,16"`` as sorted unique int64 integers.

    Raises
    ------
    UsageError
        Naming ``name``, for an empty part, a part that is not a whole number or a range ``low-high`` with
        ``low <= high``, a number of magnitude 2^53 or more (a float would round it), or more than
        :data:`MAX_VALUES` values in all (counted before any is built). Negative numbers are parsed (``-3``,
        ``-5--1``) for the caller's range check to name.
    """
    example = "whole numbers such as 1-5, 1,2,4 or 1-4,8"
    ranges = []
    for part in _parts(text, name, example):
        match = _WHOLE_OR_RANGE.fullmatch(part)
        if match is None:
            raise UsageError(f"{name} must be {example}, got {text!r}")
        low, high = int(match[1]), int(match[2] or match[1])
        if high < low:
            raise UsageError(f"{name}: the range {part!r} runs backwards; write it low-high")
        if max(-low, high) >= LARGEST_WHOLE:
            raise UsageError(f"{name} must be whole numbers below 2^53 = {LARGEST_WHOLE:.0f} in magnitude, "
                             f"got {low if -low >= LARGEST_WHOLE else high}")
        ranges.append((low, high))
    count = sum(high - low + 1 for low, high in ranges)
    if count > MAX_VALUES:
        raise UsageError(f"{name} {text!r} holds {count} values; at most {MAX_VALUES} are allowed")
    return np.unique(np.concatenate([np.arange(low, high + 1, dtype=np.int64) for low, high in ranges]))


def numbers(text: str, name: str) -> np.ndarray:
    """``"0.8"`` or ``"0.7,0.9"`` as sorted unique floats.

    Raises
    ------
    UsageError
        Naming ``name``, for an empty part, a part that is not a number, a non-finite one (``nan``, ``inf``,
        ``1e999``), or more than :data:`MAX_VALUES` parts. The caller checks the range.
    """
    example = "numbers such as 0.8 or 0.7,0.9"
    parts = _parts(text, name, example)
    try:
        values = np.array(sorted({float(part) for part in parts}))
    except ValueError:
        raise UsageError(f"{name} must be {example}, got {text!r}") from None
    if not np.isfinite(values).all():
        raise UsageError(f"{name} must be finite {example}, got {text!r}")
    return values


def random_model_spec(args: argparse.Namespace):
    """Refuse a --model, --layers or --width that ``moesd trace --random-weights`` cannot build; return its spec."""
    from moesd.zoo import get_model

    with usage_errors():
        spec = get_model(args.model)
    if spec.head_of:
        raise UsageError(f"--model {spec.name} is a draft head of {spec.head_of}, which runs on its target's hidden "
                         f"states: trace {spec.head_of} instead")
    if not spec.is_moe:
        raise UsageError(f"--model {spec.name} is dense: there is no expert routing to trace")
    from moesd.routing.capture import SUPPORTED_MODEL_TYPES

    if spec.model_type not in SUPPORTED_MODEL_TYPES:
        raise UsageError(f"--model {spec.name}: routing capture supports the model types "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}, not {spec.model_type!r}")
    if args.layers is not None and not 1 <= args.layers <= spec.num_layers:
        raise UsageError(f"--layers must be in [1, {spec.num_layers}] ({spec.name}), got {args.layers}")
    with usage_errors():
        spec.check_routed_layers(args.layers, "--layers")
    if not 0 < args.width <= 1:
        raise UsageError(f"--width must be in (0, 1], got {args.width}")
    return spec


def local_model(model: str) -> dict | None:
    """Refuse a --model that cannot be loaded, before it is: a local path (absolute, or starting with . or ~) that is
    no folder, a folder whose ``config.json`` is missing or not a JSON object (the message names the file), a hub
    id that the offline hub cannot give (:func:`moesd._checks.hub_model`).

    Returns
    -------
    dict or None
        The ``config.json`` of a local folder; None for a hub id.
    """
    from moesd._checks import hub_model
    from moesd._files import read_json

    path = Path(model).expanduser()
    if model.startswith((".", "~", "/")) and not path.is_dir():
        raise UsageError(f"--model {model!r} is {'a file' if path.exists() else 'not there'}: give a folder "
                         "holding a saved model, or a hub id such as deepseek-ai/DeepSeek-V2-Lite-Chat")
    if not path.is_dir():
        hub_model("--model", model, "the local folder of a saved model")
        return None
    if not (path / "config.json").exists():
        raise UsageError(f"--model {model!r} holds no config.json: not the folder of a saved model")
    with usage_errors():
        config = read_json("--model", path / "config.json")
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise UsageError(f"--model {str(path / 'config.json')!r} is not a model's config (a JSON object with a "
                         "model_type)")
    return config


def positions_left(flag: str, model_type: str, config: dict, prompt_tokens: int, new_tokens: int) -> None:
    """Refuse ``new_tokens`` after ``prompt_tokens`` that pass a model's positions
    (:func:`moesd.architecture.max_positions`), naming ``flag`` and the model's limit."""
    from moesd.architecture import max_positions

    limit = max_positions(model_type, config)  # None: a model type this project does not know
    if limit is not None and prompt_tokens + new_tokens > limit:
        raise UsageError(f"{flag} {new_tokens} after prompts of up to {prompt_tokens} tokens reaches "
                         f"{prompt_tokens + new_tokens} positions, more than the model's {limit}: lower {flag}")


def sigma_per_gamma(words: list[str], gammas) -> dict | str:
    """``--sigma``: ``real``, or one number per gamma as ``{gamma: sigma}``."""
    if words == ["real"]:
        return "real"
    try:
        values = [float(value) for value in words]
    except ValueError:
        raise UsageError(f"--sigma takes numbers or 'real', got {' '.join(words)}") from None
    if len(values) != len(gammas):
        raise UsageError(f"--sigma has {len(values)} value(s) for {len(gammas)} gamma(s) "
                         f"{list(gammas)}: give one sigma per gamma")
    return dict(zip(gammas, values))


SWEEP_OPTIONS = {"target", "draft", "weights", "layers", "draft_layers", "width", "batch_sizes", "gammas", "top_ks",
                  "sigma", "context", "rounds", "warmup_rounds", "repeats", "dtype", "device",
                  "cuda_graphs", "target_path", "draft_path", "out_dir", "routing_source"}


def as_option(message: str) -> str:
    """A SweepConfig message with its leading field written as the option (top_ks -> --top-ks)."""
    field, _, rest = message.partition(" ")
    name = field.rstrip(":")  # "target_path: ..." as well as "context must ..."
    return f"--{name.replace('_', '-')}{field[len(name):]} {rest}" if name in SWEEP_OPTIONS else message


PATH_OPTIONS = ("measurements", "model", "prompt_source", "out", "out_dir", "routing_trace", "target_path",
                "draft_path", "csv", "plot", "json")
"""The arguments of every sub-command that name a file or a folder (``measurements`` is ``moesd fit``'s positional)."""


OUTPUT_OPTIONS = ("out", "out_dir", "csv", "plot", "json")
"""The arguments that name a file or a folder a sub-command writes."""


def check_paths(args: argparse.Namespace) -> None:
    """Refuse, before a sub-command starts, a path argument given as an empty (or blank) string (``--plot ""``
    wrote nothing and succeeded) and an output path :func:`moesd._checks.output_path` refuses (a device, a name
    too long, a loop of symbolic links), naming the flag."""
    from moesd._checks import output_path

    for dest in PATH_OPTIONS:
        value = getattr(args, dest, None)
        flag = dest if dest == "measurements" else f"--{dest.replace('_', '-')}"
        if isinstance(value, str) and not value.strip():
            raise UsageError(f"{flag} is {value!r}: give a path")
        if dest in OUTPUT_OPTIONS and value is not None:
            output_path(flag, value)
