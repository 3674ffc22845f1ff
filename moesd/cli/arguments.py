"""Checks and conversions of command-line arguments that several sub-commands share."""

import argparse
from pathlib import Path

import numpy as np

from moesd._checks import UsageError, usage_errors


def integers(text: str, name: str) -> np.ndarray:
    """``"1-5"``, ``"1,2,4"`` or ``"1-4,8,16"`` as sorted unique integers; ValueError naming ``name``."""
    values = set()
    try:
        for part in text.split(","):
            low, _, high = part.partition("-")
            low, high = int(low), int(high or low)
            if high < low:
                raise ValueError
            values.update(range(low, high + 1))
    except ValueError:
        raise UsageError(f"{name} must be integers such as 1-5, 1,2,4 or 1-4,8, got {text!r}") from None
    return np.array(sorted(values))


def numbers(text: str, name: str) -> np.ndarray:
    try:
        return np.array(sorted({float(part) for part in text.split(",")}))
    except ValueError:
        raise UsageError(f"{name} must be numbers such as 0.8 or 0.7,0.9, got {text!r}") from None


def random_model_spec(args: argparse.Namespace) -> None:
    """Refuse a --model, --layers or --width that ``moesd trace --random-weights`` cannot build."""
    from moesd.zoo import get_model

    with usage_errors():
        spec = get_model(args.model)
    if not spec.is_moe:
        raise UsageError(f"--model {spec.name} is dense: there is no expert routing to trace")
    from moesd.routing.capture import SUPPORTED_MODEL_TYPES

    if spec.model_type not in SUPPORTED_MODEL_TYPES:
        raise UsageError(f"--model {spec.name}: routing capture supports the model types "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}, not {spec.model_type!r}")
    if args.layers is not None and not 1 <= args.layers <= spec.num_layers:
        raise UsageError(f"--layers must be in [1, {spec.num_layers}] ({spec.name}), got {args.layers}")
    if not 0 < args.width <= 1:
        raise UsageError(f"--width must be in (0, 1], got {args.width}")


def local_model(model: str) -> None:
    """Refuse a --model written as a local path (absolute, or starting with . or ~) that is no folder."""

    path = Path(model).expanduser()
    if model.startswith((".", "~", "/")) and not path.is_dir():
        raise UsageError(f"--model {model!r} is {'a file' if path.exists() else 'not there'}: give a folder "
                         "holding a saved model, or a hub id such as deepseek-ai/DeepSeek-V2-Lite-Chat")


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
                  "cuda_graphs"}


def as_option(message: str) -> str:
    """A SweepConfig message with its leading field written as the option (top_ks -> --top-ks)."""
    field, _, rest = message.partition(" ")
    return f"--{field.replace('_', '-')} {rest}" if field in SWEEP_OPTIONS else message
