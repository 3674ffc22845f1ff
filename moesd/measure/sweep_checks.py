"""What a sweep must satisfy before any model is built or loaded: its size (:func:`check_size`: the positions a
sequence reaches against either model's, the rows it writes) and its pretrained models (:func:`checkpoint_config`
of a local folder, :func:`check_pretrained` of a hub id). Pure Python, like :class:`moesd.measure.sweeps.SweepConfig`,
which calls them; a config is passed in, never built here.
"""

from __future__ import annotations

from pathlib import Path

from moesd._checks import UsageError, hub_model
from moesd.architecture import max_positions
from moesd.zoo import get_model

_FORWARD = ("forward", "dense_forward")  # moesd.measure.sweeps.FORWARD_STUDIES, which imports this module

MAX_SWEEP_ROWS = 20_000
"""The most rows one sweep writes (ten times the largest shipped study): every point rewrites its result file."""


def positions(config) -> int:
    """The most token positions one sequence reaches: its prompt and every token a study adds to it."""
    if config.study in _FORWARD:
        return config.context + max(config.gammas) + 1
    return config.context + (config.warmup_rounds + config.rounds + 1) * (max(config.gammas) + 1)


def sweep_rows(config) -> int:
    """The rows a sweep writes: one per K, repeat, batch size and pass (forward) or gamma and workload (e2e)."""
    per_batch = (2 * len({1, *config.gammas, *(g + 1 for g in config.gammas)}) if config.study in _FORWARD
                 else len(config.gammas) * len(config.workloads or (None,)))
    return len(config.top_k_values) * config.repeats * len(config.batch_sizes) * per_batch


def check_size(config) -> None:
    """Refuse, before any work, a sequence longer than either model's positions (its config's, or its architecture's
    default: :func:`moesd.architecture.max_positions`) or more rows than :data:`MAX_SWEEP_ROWS`, each with its count.

    Raises
    ------
    UsageError
        Naming the settings that set the count (their names are the config's fields).
    """
    for name, path in ((config.target, config.target_path), (config.draft, config.draft_path)):
        spec = get_model(name)
        limit = max_positions(spec.model_type, checkpoint_config(name, path) if path else spec.config_dict())
        if limit is not None and positions(config) > limit:
            raise UsageError(f"context, rounds and gammas make a sequence reach {positions(config)} positions, "
                             f"more than the {limit} of {spec.name}; lower context or rounds")
    rows = sweep_rows(config)
    if rows > MAX_SWEEP_ROWS:
        sizes = (f"repeats {config.repeats} x {len(config.top_k_values)} K x {len(config.batch_sizes)} batch sizes x "
                 + (f"{len(config.gammas)} gammas x 2 models" if config.study in _FORWARD else
                    f"{len(config.gammas)} gammas x {len(config.workloads or (None,))} workload(s)"))
        raise UsageError(f"{sizes} make {rows} rows, more than the {MAX_SWEEP_ROWS} a result file holds (each "
                         "point rewrites it whole): lower repeats or the grid")


def check_pretrained(config) -> None:
    """Refuse a pretrained sweep whose models cannot be loaded, before any is: a hub id the offline hub cannot
    give (:func:`~moesd._checks.hub_model`); local folders are checked when the config is made."""
    if config.weights != "pretrained":
        return
    for role, model, folder in (("target", config.target, config.target_path),
                                ("draft", config.draft, config.draft_path)):
        if folder is None:
            hub_model(role, get_model(model).hub_id, f"{role}_path (--{role}-path), a local folder of its weights")


def checkpoint_folder(option: str, name: str, folder) -> None:
    """Refuse a local checkpoint ``folder`` (given as ``option``) of the model ``name`` that is no folder, holds no
    ``config.json`` or one :func:`checkpoint_config` refuses, naming ``option``."""
    if not (Path(folder) / "config.json").is_file():
        found = "is not a model folder (no config.json in it)" if Path(folder).is_dir() else "does not exist"
        raise UsageError(f"{option} {str(folder)!r} {found}; give the local folder of a pretrained checkpoint, or "
                         "leave it out to load the model from the hub")
    try:
        checkpoint_config(name, folder)
    except UsageError as error:
        raise UsageError(f"{option}: {error}") from None


def checkpoint_config(name: str, folder) -> dict:
    """The ``config.json`` of a local checkpoint ``folder`` given for the model ``name``, checked before any load.

    Raises
    ------
    UsageError
        Naming the file, if it is missing, not a regular file, not a JSON object, or a checkpoint of another
        ``model_type`` than ``name``'s.
    """
    from moesd._files import read_json

    spec = get_model(name)
    path = Path(folder) / "config.json"
    try:
        config = read_json("config", path)
    except ValueError as error:
        raise UsageError(f"{error}: a checkpoint folder holds its model's config.json") from None
    if not isinstance(config, dict):
        raise UsageError(f"{path} holds a JSON {type(config).__name__}, not the object of a model's config")
    if config.get("model_type") != spec.model_type:
        raise UsageError(f"{path} is the config of a {config.get('model_type')!r} model, not of {spec.name} "
                         f"({spec.model_type!r})")
    return config
