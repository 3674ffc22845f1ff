"""Shipped trained-routing sources: licence and provenance, shapes as the READMEs state, the restricted unpickler."""

import json
import os
import pickle
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from moesd.routing import sources
from moesd.routing.pickles import UnsafePickleError, loads_counts, read_counts_pickle
from moesd.routing.sources import SourceShapeError, read_source

TRACES = sources.REPOSITORY_TRACES
FOLDERS = ("allenai-olmoe", "specmoe-switch")


# --- the restricted unpickler -------------------------------------------------------------------

class _RunsCode:
    def __reduce__(self):
        return (os.system, ("echo pickle ran code",))


class _RunsEval:
    def __reduce__(self):
        return (eval, ("1 + 1",))


@pytest.mark.parametrize("payload", [_RunsCode(), _RunsEval(), [Counter({1: 2}), _RunsCode()], Path("x")])
def test_a_pickle_that_would_run_code_is_refused(tmp_path, payload):
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps(payload))
    with pytest.raises(UnsafePickleError, match="refusing"):
        read_counts_pickle(path)


def test_counts_pickles_as_upstream_writes_them_read_as_plain_values():
    """numpy int64 keys in Counters, a defaultdict of Counters (as run_routing_analysis.py pickles them)."""
    first = Counter({np.int64(3): 7, np.int64(0): 2})
    nested = defaultdict(Counter, {np.int64(5): Counter({np.int64(101): 4})})
    value = loads_counts(pickle.dumps([first, nested, {"f": np.float64(0.25), "u": np.uint8(200)}], protocol=4))
    assert value == [{3: 7, 0: 2}, {5: {101: 4}}, {"f": 0.25, "u": 200}]
    assert all(type(key) is int for key in value[0])  # plain ints, not numpy scalars
    assert type(value[0]) is dict and type(value[1][5]) is dict


def test_not_a_pickle_and_lfs_pointers_are_refused(tmp_path):
    with pytest.raises(ValueError, match="LFS"):
        loads_counts(b"version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 3\n")
    with pytest.raises(ValueError, match="not a readable"):
        loads_counts(b"\x80\x04\x95")
    with pytest.raises(UnsafePickleError):  # a numpy array names numpy's reconstructor: not a counts file
        loads_counts(pickle.dumps(np.arange(3)))


# --- licence, provenance and shape ----------------------------------------------------------------

@pytest.mark.parametrize("folder", FOLDERS)
def test_every_source_ships_its_licence_and_a_readme_stating_repository_commit_and_shapes(folder):
    path = TRACES / folder
    source = json.loads((path / "source.json").read_text())
    licence = (path / "LICENSE").read_text()
    assert {"Apache-2.0": "Apache License", "MIT": "MIT License"}[source["licence"]] in licence
    readme = (path / "README.md").read_text()
    assert source["repository"] in readme and source["commit"] in readme and source["licence"] in readme
    for name, shape in source["files"].items():  # the README states each file's columns and rows
        assert name in readme and f"**{shape['rows']} rows**" in readme
        assert ", ".join(shape["columns"]) in readme
    for model, spec in source["models"].items():
        assert spec["checkpoint"] in readme and model in readme
    for upstream in source["upstream_files"]:  # every file read: its folder and name in the README, its blob recorded
        folder, _, stem = upstream["path"].rpartition("/")
        assert folder in readme and stem.split(".")[0] in readme and len(upstream["blob"]) == 40


def test_shipped_sources_are_small():
    size = sum(f.stat().st_size for folder in FOLDERS for f in (TRACES / folder).iterdir())
    assert size < 300_000


def test_names_and_info():
    names = sources.names()
    assert {"olmoe/c4", "olmoe-sft/tulu", "olmoe-dpo/tulu", "mixtral/github", "switch-base-128/mixed"} <= set(names)
    assert len(names) == 14
    olmoe = sources.info("olmoe/c4")
    assert (olmoe.num_experts, olmoe.top_k, olmoe.layers, olmoe.licence) == (64, 8, (0, 7, 15), "Apache-2.0")
    assert sources.info("mixtral/book").checkpoint == "mistralai/Mixtral-8x7B-v0.1"
    assert sources.info("switch-base-128/mixed").tokens == 206866
    with pytest.raises(ValueError, match="olmoe/c4"):
        sources.info("olmoe/nowhere")


@pytest.mark.parametrize("name", ["olmoe/c4", "olmoe-dpo/tulu", "mixtral/arxiv", "switch-base-128/mixed"])
def test_popularity_rows_sum_to_k_and_follow_the_counts(name):
    info = sources.info(name)
    p = sources.popularity(name)
    assert p.shape == (len(info.layers), info.num_experts)
    np.testing.assert_allclose(p.sum(axis=1), info.top_k)
    assert ((p >= 0) & (p <= 1)).all()
    counts = sources.expert_counts(name)
    first = counts[counts["layer"] == info.layers[0]]["count"].to_numpy()
    np.testing.assert_allclose(p[0], first / info.tokens)  # p_e = count_e / tokens


def test_popularity_maps_model_layers_onto_recorded_ones():
    p = sources.popularity("olmoe/c4")
    mapped = sources.popularity("olmoe/c4", num_layers=5)
    assert list(sources.layer_map("olmoe/c4", 5)) == [0, 7, 15, 0, 7]
    np.testing.assert_array_equal(mapped, p[[0, 1, 2, 0, 1]])
    assert list(sources.layer_map("olmoe/c4", 1)) == [0]
    with pytest.raises(ValueError, match="num_layers"):
        sources.layer_map("olmoe/c4", 0)


def _copy(folder, tmp_path) -> Path:
    target = tmp_path / folder
    shutil.copytree(TRACES / folder, target)
    return target


@pytest.mark.parametrize("change, match", [
    (lambda f: f.drop(index=5), "rows"),
    (lambda f: f.assign(count=np.where(f.index == 3, f["count"] + 1, f["count"])), "tokens x K"),
    (lambda f: f.assign(expert=np.where(f.index == 3, 64, f["expert"])), "experts 0..63"),
    (lambda f: f.assign(layer=np.where(f.index < 64, 1, f["layer"])), "groups differ"),
    (lambda f: f.rename(columns={"count": "n"}), "columns"),
])
def test_a_file_whose_shape_is_not_what_the_readme_says_is_refused(tmp_path, change, match):
    folder = _copy("allenai-olmoe", tmp_path)
    frame = change(pd.read_csv(folder / "expert_counts.csv"))
    frame.to_csv(folder / "expert_counts.csv", index=False)
    with pytest.raises(SourceShapeError, match=match):
        read_source(folder)


def test_token_routing_of_another_shape_is_refused(tmp_path):
    folder = _copy("specmoe-switch", tmp_path)
    frame = pd.read_csv(folder / "token_routing.csv")
    frame.loc[3, "position"] = 40  # a gap in a sequence
    frame.to_csv(folder / "token_routing.csv", index=False)
    with pytest.raises(SourceShapeError, match="12 sequences"):
        read_source(folder)


def test_a_folder_without_licence_is_refused(tmp_path):
    folder = _copy("specmoe-switch", tmp_path)
    (folder / "LICENSE").unlink()
    with pytest.raises(SourceShapeError, match="LICENSE"):
        read_source(folder)


def test_token_traces_hold_the_twelve_sequences_one_layer_each():
    traces = sources.token_traces("specmoe-switch")
    assert sorted(traces) == [1, 3, 5, 7, 9, 11]
    assert sum(len(t.meta["samples"]) for t in traces.values()) == 12
    assert sum(t.num_tokens for t in traces.values()) == 1033
    layer1 = traces[1]
    assert (layer1.num_experts, layer1.top_k, list(layer1.layers)) == (128, 1, [1])
    assert {s["sample_id"] for s in layer1.meta["samples"]} == {"wikitext_83", "yelp_review_full_83"}
    assert set(layer1.phase) == {"prefill"}


def test_the_converter_reproduces_the_shipped_files_from_the_upstream_repositories(tmp_path):
    """Only where the upstream snapshots are at hand (they are not shipped)."""
    mirrors = {name: Path(os.environ.get(f"MOESD_{name.upper()}_GIT", f"/work/.mirror/{path}/repo"))
               for name, path in (("olmoe", "allenai+OLMoE"), ("specmoe", "cyanmishra92+specMoE"))}
    if not all(path.exists() for path in mirrors.values()):
        pytest.skip("the upstream repositories are not at hand (MOESD_OLMOE_GIT, MOESD_SPECMOE_GIT)")
    tool = Path(__file__).resolve().parents[1] / "tools" / "convert_routing_sources.py"
    subprocess.run([sys.executable, str(tool), "--olmoe", str(mirrors["olmoe"]), "--specmoe", str(mirrors["specmoe"]),
                    "--out", str(tmp_path)], check=True)
    for folder in FOLDERS:
        for name in ("LICENSE", "source.json", "expert_counts.csv"):
            assert (tmp_path / folder / name).read_bytes() == (TRACES / folder / name).read_bytes()
