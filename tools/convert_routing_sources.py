"""Convert the public trained-routing data the book ships into ``data/traces/<source>/`` (run once, offline).

Reads two public repositories from local git clones (bare or not; ``git`` reads the named commits):

* ``allenai/OLMoE`` (Apache-2.0): ``scripts/routing_output/<model>/expert_counts/<domain>.pkl``, the
  per-layer expert counts of ``scripts/run_routing_analysis.py``, read with the package's restricted
  unpickler (:func:`moesd.routing.pickles.loads_counts`: plain containers and numbers only, nothing called);
* ``cyanmishra92/specMoE`` (MIT, ``docs/LICENSE``): ``routing_data/expert_statistics_3d.json`` (per-layer top-1
  counts of google/switch-base-128) and the real per-token sequences of ``routing_data/sample_trace_paths.json``
  at two commits (the two earlier versions of that file hold synthetic draws and are left out).

Every file is checked to be content (not a Git LFS pointer); the upstream licence text is copied beside the
converted arrays, and ``source.json`` records the repository, commit, path and blob of every file read and the
shape :mod:`moesd.routing.sources` checks on load. The README of each folder is written by hand.

    python tools/convert_routing_sources.py --olmoe /path/to/OLMoE.git --specmoe /path/to/specMoE.git
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from moesd.routing.pickles import loads_counts  # noqa: E402

OLMOE_COMMIT = "357454f4f647385839c0ff6b99a688dc7cd9c13f"
OLMOE_MODELS = {  # our name: (upstream folder, checkpoint, E, K, decoder layers, domains)
    "olmoe": ("olmoe", "allenai/OLMoE-1B-7B-0924", 64, 8, 16, ("arxiv", "book", "c4", "github", "tulu", "wikipedia")),
    "olmoe-sft": ("olmoe-sft", "allenai/OLMoE-1B-7B-0924-SFT", 64, 8, 16, ("tulu",)),
    "olmoe-dpo": ("olmoe-dpo", "allenai/OLMoE-1B-7B-0924-Instruct", 64, 8, 16, ("tulu",)),
    "mixtral": ("mistral", "mistralai/Mixtral-8x7B-v0.1", 8, 2, 32, ("arxiv", "book", "c4", "github", "wikipedia")),
}
OLMOE_LAYERS = (0, 7, 15)  # run_routing_analysis.py dumps [layer_counters[0], layer_counters[7], layer_counters[15]]

SPECMOE_STATS = ("79521e56ce293bad2a151ed196dd4ed42a713a9f", "routing_data/expert_statistics_3d.json")
SPECMOE_CHECK = ("7055275d08be315a4aea881b8aea2d7ebbcbbce7", "routing_data/robust_traces.json")
SPECMOE_SEQUENCES = ("d921338e9b865707ff73f050eb2a90e381cdc9ff", "910473c182b0febb8fd9b89ddab317ed2280273b")
SPECMOE_LICENSE = ("4af4125e8482f2af054628db6f8fda09b658de8f", "docs/LICENSE")


def git_bytes(repo: Path, commit: str, path: str) -> tuple[bytes, str]:
    """The content and blob id of ``path`` at ``commit``; refuses a Git LFS pointer."""
    blob = subprocess.run(["git", "--git-dir", str(repo), "rev-parse", f"{commit}:{path}"], check=True,
                          capture_output=True, text=True).stdout.strip()
    data = subprocess.run(["git", "--git-dir", str(repo), "cat-file", "blob", blob], check=True,
                          capture_output=True).stdout
    if data.startswith(b"version https://git-lfs"):
        raise SystemExit(f"{path} at {commit} is a Git LFS pointer, not content")
    return data, blob


def git_dir(path: Path) -> Path:
    """The git directory of a clone given as its work tree or as a bare repository."""
    return path / ".git" if (path / ".git").is_dir() else path


def write_csv(path: Path, header: list, rows: list) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)


def convert_olmoe(repo: Path, out: Path) -> None:
    """``allenai-olmoe/``: expert_counts.csv, LICENSE, source.json."""
    out.mkdir(parents=True, exist_ok=True)
    rows, files, models, tokens = [], [], {}, {}
    for name, (folder, checkpoint, experts, top_k, depth, domains) in OLMOE_MODELS.items():
        models[name] = {"upstream_folder": folder, "checkpoint": checkpoint, "experts": experts, "top_k": top_k,
                        "num_layers": depth, "layers": list(OLMOE_LAYERS), "domains": list(domains)}
        for domain in domains:
            path = f"scripts/routing_output/{folder}/expert_counts/{domain}.pkl"
            data, blob = git_bytes(repo, OLMOE_COMMIT, path)
            layers = loads_counts(data)
            if not (isinstance(layers, list) and len(layers) == len(OLMOE_LAYERS)):
                raise SystemExit(f"{path}: expected a list of {len(OLMOE_LAYERS)} counters")
            sums = set()
            for layer, counts in zip(OLMOE_LAYERS, layers):
                if set(counts) - set(range(experts)):
                    raise SystemExit(f"{path}: expert ids outside [0, {experts})")
                rows += [[name, domain, layer, e, int(counts.get(e, 0))] for e in range(experts)]
                sums.add(sum(counts.values()))
            if len(sums) != 1 or next(iter(sums)) % top_k:
                raise SystemExit(f"{path}: the layers count different tokens ({sums})")
            tokens[f"{name}/{domain}"] = next(iter(sums)) // top_k
            files.append({"path": path, "blob": blob, "bytes": len(data)})
    write_csv(out / "expert_counts.csv", ["model", "domain", "layer", "expert", "count"], rows)
    licence, licence_blob = git_bytes(repo, OLMOE_COMMIT, "LICENSE")
    (out / "LICENSE").write_bytes(licence)
    source = {"repository": "https://github.com/allenai/OLMoE", "commit": OLMOE_COMMIT, "licence": "Apache-2.0",
              "licence_file": {"path": "LICENSE", "blob": licence_blob},
              "script": "scripts/run_routing_analysis.py", "models": models, "tokens": tokens,
              "files": {"expert_counts.csv": {"columns": ["model", "domain", "layer", "expert", "count"],
                                              "rows": len(rows)}},
              "upstream_files": files}
    (out / "source.json").write_text(json.dumps(source, indent=1) + "\n")


def convert_specmoe(repo: Path, out: Path) -> None:
    """``specmoe-switch/``: expert_counts.csv, token_routing.csv, LICENSE, source.json."""
    out.mkdir(parents=True, exist_ok=True)
    data, blob = git_bytes(repo, *SPECMOE_STATS)
    stats = json.loads(data)
    check_data, check_blob = git_bytes(repo, *SPECMOE_CHECK)
    collection = json.loads(check_data)
    experts, layers = int(stats["num_experts"]), [int(layer) for layer in stats["layers"]]
    usage = stats["expert_usage_by_layer"]
    rows = [["switch-base-128", "mixed", layer, e, int(usage[str(layer)][str(e)])] for layer in layers
            for e in range(experts)]
    totals = {str(e): sum(int(usage[str(layer)][str(e)]) for layer in layers) for e in range(experts)}
    if totals != {k: int(v) for k, v in collection["expert_distribution"].items()}:
        raise SystemExit("expert_statistics_3d.json does not add up to robust_traces.json's expert_distribution")
    if set(collection["dataset_distribution"]) & {"synthetic_diverse", "small_experimental"}:
        raise SystemExit("the collection behind expert_statistics_3d.json holds synthetic traces")
    per_layer = {sum(int(c) for c in usage[str(layer)].values()) for layer in layers}
    if len(per_layer) != 1:
        raise SystemExit(f"the layers count different tokens: {per_layer}")
    write_csv(out / "expert_counts.csv", ["model", "domain", "layer", "expert", "count"], rows)
    files = [{"path": SPECMOE_STATS[1], "commit": SPECMOE_STATS[0], "blob": blob, "bytes": len(data)},
             {"path": SPECMOE_CHECK[1], "commit": SPECMOE_CHECK[0], "blob": check_blob, "bytes": len(check_data),
              "use": "provenance check only: its expert_distribution equals the per-expert sum over layers"}]
    tokens_rows, sequences = [], 0
    for commit in SPECMOE_SEQUENCES:
        path = "routing_data/sample_trace_paths.json"
        data, blob = git_bytes(repo, commit, path)
        for layer, samples in sorted(json.loads(data).items(), key=lambda item: int(item[0])):
            for sample in samples:
                if sample["dataset_name"] in ("small_experimental", "synthetic_diverse"):
                    raise SystemExit(f"{commit}: {sample['sample_id']} is synthetic")
                ids = [int(e) for e in sample["expert_sequence"]]
                if len(ids) != sample["sequence_length"] or not all(0 <= e < experts for e in ids):
                    raise SystemExit(f"{commit}: {sample['sample_id']} has a bad sequence")
                tokens_rows += [[sequences, commit[:7], sample["sample_id"], sample["dataset_name"], int(layer),
                                 position, e] for position, e in enumerate(ids)]
                sequences += 1
        files.append({"path": path, "commit": commit, "blob": blob, "bytes": len(data)})
    token_columns = ["sequence", "commit", "sample_id", "dataset", "layer", "position", "expert"]
    write_csv(out / "token_routing.csv", token_columns, tokens_rows)
    licence, licence_blob = git_bytes(repo, *SPECMOE_LICENSE)
    (out / "LICENSE").write_bytes(licence)
    source = {"repository": "https://github.com/cyanmishra92/specMoE", "commit": SPECMOE_LICENSE[0], "licence": "MIT",
              "licence_file": {"path": SPECMOE_LICENSE[1], "blob": licence_blob},
              "script": "scripts/collection/collect_robust_traces.py, scripts/analysis/analyze_trace_structure.py, "
                        "scripts/collection/collect_maximum_real_traces.py, "
                        "scripts/analysis/comprehensive_expert_analysis.py",
              "models": {"switch-base-128": {"checkpoint": "google/switch-base-128", "experts": experts, "top_k": 1,
                                             "num_layers": 12, "layers": layers, "domains": ["mixed"]}},
              "tokens": {"switch-base-128/mixed": per_layer.pop()},
              "files": {"expert_counts.csv": {"columns": ["model", "domain", "layer", "expert", "count"],
                                              "rows": len(rows)},
                        "token_routing.csv": {"columns": token_columns, "rows": len(tokens_rows),
                                              "sequences": sequences}},
              "upstream_files": files}
    (out / "source.json").write_text(json.dumps(source, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--olmoe", type=Path, required=True, help="clone of github.com/allenai/OLMoE")
    parser.add_argument("--specmoe", type=Path, required=True, help="clone of github.com/cyanmishra92/specMoE")
    parser.add_argument("--out", type=Path, default=ROOT / "data" / "traces", help="default: data/traces")
    args = parser.parse_args()
    convert_olmoe(git_dir(args.olmoe), args.out / "allenai-olmoe")
    convert_specmoe(git_dir(args.specmoe), args.out / "specmoe-switch")


if __name__ == "__main__":
    main()
