"""The click commands that need no Ray: budget and validate (driven through CliRunner)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from raypeft.cli.main import main

REPO = Path(__file__).resolve().parents[2]


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def budget_rows(output: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines()[2:]]


def test_budget_reproduces_dept_table_for_t5_base():
    args = ["-l", "100", "-s", "256", "-d", "768", "-M", "dept"]
    result = invoke("budget", *args, "-m", "20", "-m", "40", "-m", "60", "-m", "80")
    assert result.exit_code == 0, result.output
    assert budget_rows(result.output) == [
        ["dept", "prompt_length=20", "rank=60", "76,800", "0"],
        ["dept", "prompt_length=40", "rank=45", "76,800", "0"],
        ["dept", "prompt_length=60", "rank=30", "76,800", "0"],
        ["dept", "prompt_length=80", "rank=15", "76,800", "0"],
    ]
    assert "76,800 trainable parameters" in result.output


def test_budget_lists_every_method_at_t5_base():
    result = invoke("budget", "-l", "100")  # T5-base shapes by default: d=768, N=12, s=256
    assert result.exit_code == 0, result.output
    rows = budget_rows(result.output)
    from raypeft.methods import METHODS

    assert {row[0] for row in rows} == set(METHODS)
    assert ["pt", "prompt_length=100", "76,800", "0"] in rows
    # deep prompts, hidden style: t = floor(76,800 / (12·768)) = 8 -> 73,728; no kv on T5
    assert ["prefix", "style=hidden", "prompt_length=8", "73,728", "3,072"] in rows
    assert not any(row[:2] == ["prefix", "style=kv"] for row in rows)


def test_budget_as_a_count_on_a_decoder_with_grouped_query_attention():
    result = invoke("budget", "--model", "tiny-llama", "-s", "64", "-p", "3000", "-M", "prefix")
    assert result.exit_code == 0, result.output
    # d=32, N=2; keys are 2 heads × 8 = 16 wide: kv costs 2·2·16 = 64 per position, as hidden
    assert budget_rows(result.output) == [
        ["prefix", "style=hidden", "prompt_length=46", "2,944", "56"],
        ["prefix", "style=kv", "prompt_length=46", "2,944", "56"],
    ]


def test_budget_reads_hidden_size_from_model_and_reports_slack():
    result = invoke("budget", "--model", "minilm", "-s", "64", "-m", "20", "-M", "dept")
    assert result.exit_code == 0, result.output
    # d=384 read from the packaged MiniLM config: r = floor(80*384/448) = 68, 38,400-38,144
    assert budget_rows(result.output) == [["dept", "prompt_length=20", "rank=68", "38,144", "256"]]


def test_budget_rejects_unknown_method_and_two_budgets():
    result = invoke("budget", "-M", "lora")
    assert result.exit_code == 2 and "unknown method 'lora'" in result.output
    result = invoke("budget", "-l", "10", "-p", "100")
    assert result.exit_code == 2 and "not both" in result.output


def test_budget_rejects_m_not_below_l():
    result = invoke("budget", "-l", "10", "-m", "10")
    assert result.exit_code == 2
    assert "every DePT m must leave room for a rank" in result.output


def test_validate_shipped_dept_file():
    result = invoke("validate", str(REPO / "search_spaces" / "dept.yaml"))
    assert result.exit_code == 0, result.output
    assert "joint grid of 12 points" in result.output


def test_validate_names_file_and_key_on_error(tmp_path):
    data = yaml.safe_load((REPO / "search_spaces" / "dept.yaml").read_text())
    data["train"]["max_stepz"] = 10
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(data))
    result = invoke("validate", str(path))
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: {path}: train.max_stepz: unknown key; did you mean train.max_steps?"
    ]


def test_validate_rejects_budget_leaving_no_rank(tmp_path):
    data = yaml.safe_load((REPO / "search_spaces" / "dept.yaml").read_text())
    # m=99 of l=100 with d=384, s=64: r = floor(1*384/448) = 0
    data["space"]["method.prompt_length"] = {"choice": [20, 99]}
    path = tmp_path / "nobudget.yaml"
    path.write_text(yaml.safe_dump(data))
    result = invoke("validate", str(path))
    assert result.exit_code == 2
    line = result.output.strip()
    assert "method.prompt_length=99" in line and "`r >= 1` must hold" in line and str(path) in line


def test_validate_missing_file():
    result = invoke("validate", "no/such/file.yaml")
    assert result.exit_code == 2
    assert "no/such/file.yaml: file not found" in result.output


def test_set_override_is_validated(tmp_path):
    result = invoke(
        "validate", str(REPO / "search_spaces" / "dept.yaml"), "--set", "search.num_samples=zero"
    )
    assert result.exit_code == 2
    assert "search.num_samples" in result.output


def test_validate_takes_several_files_and_reports_each(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\ntrain: {max_stepz: 1}\n")
    dept, pt = (str(REPO / "search_spaces" / f) for f in ("dept.yaml", "pt.yaml"))
    result = invoke("validate", dept, str(broken), pt)
    assert result.exit_code == 2
    lines = [
        ln
        for ln in result.output.strip().splitlines()
        if not ln.startswith(("  note: ", "  resources: "))
    ]
    assert len(lines) == 3 and f"{dept}: ok" in result.output and f"{pt}: ok" in result.output
    assert f"error: {broken}: method: required key is missing" in result.output
    assert invoke("validate", dept, pt).exit_code == 0


def notes(result) -> list[str]:
    return [ln for ln in result.output.splitlines() if ln.startswith("  note: ")]


def export_notes(result) -> list[str]:
    return [note for note in notes(result) if "search.sampler:" not in note]


def sampler_notes(result) -> list[str]:
    return [note for note in notes(result) if "search.sampler:" in note]


def test_validate_says_when_the_searchs_models_will_not_export(tmp_path):
    """The shipped pt.yaml on minilm: its head mean-pools (auto), which peft cannot load; a
    note says so at validate time, and head_pooling: first makes it exportable (no note).
    dept.yaml (README's search) has no peft form at all; prefix.yaml's hidden style has none
    and its kv style mean-pools: a note for each reason, before anything runs."""
    pt = str(REPO / "search_spaces" / "pt.yaml")
    result = invoke("validate", pt)
    assert result.exit_code == 0, result.output
    (note,) = export_notes(result)
    assert "model.head_pooling: auto resolves to mean on minilm" in note
    assert "raypeft export --format peft` will refuse this search's models" in note
    first = invoke("validate", pt, "--set", "model.head_pooling=first")
    assert first.exit_code == 0 and export_notes(first) == []
    dept = invoke("validate", str(REPO / "search_spaces" / "dept.yaml"))
    assert dept.exit_code == 0, dept.output
    (note,) = notes(dept)
    assert note.endswith(
        "will refuse this search's models, which predict and serve: method 'dept' has no peft "
        "equivalent (its low-rank update of the input embeddings); peft export supports pt "
        "(PROMPT_TUNING) and prefix with style: kv (PREFIX_TUNING)"
    )
    prefix = str(REPO / "search_spaces" / "prefix.yaml")
    hidden, kv = export_notes(invoke("validate", prefix))
    assert "refuse some of this search's models" in hidden and "style: hidden has no" in hidden
    assert "auto resolves to mean on minilm" in kv and "some of this search's models" in kv
    (hidden,) = export_notes(invoke("validate", prefix, "--set", "model.head_pooling=first"))
    assert "style: hidden has no peft equivalent" in hidden


def test_validate_says_when_tpe_will_draw_every_trial_at_random():
    """TPE draws its first 10 trials at random (Optuna's n_startup_trials): pt.yaml's 8
    samples never reach its model (on purpose: the peer benchmark trains the same 8
    configurations on both sides), and a note says so; fewer start-up trials, or more
    samples, and TPE models the results (no note). The other shipped files reach it."""
    pt = str(REPO / "search_spaces" / "pt.yaml")
    (note,) = sampler_notes(invoke("validate", pt))
    assert note == (
        "  note: search.sampler: tpe draws its first 10 trials at random "
        "(search.startup_trials), so with num_samples 8 it draws method.lr, "
        "method.prompt_length, method.init at random in every trial; raise num_samples past "
        "10 or lower startup_trials for it to model the results"
    )
    assert sampler_notes(invoke("validate", pt, "--set", "search.startup_trials=4")) == []
    assert sampler_notes(invoke("validate", pt, "--set", "search.num_samples=11")) == []
    gp = invoke("validate", pt, "--set", "search.sampler=gp", "--set", "search.startup_trials=8")
    assert "search.sampler: gp draws its first 8 trials at random" in sampler_notes(gp)[0]
    assert sampler_notes(invoke("validate", pt, "--set", "search.sampler=random")) == []
    for shipped in ("dept", "prefix", "compare", "idpg", "ipt", "dept_pareto"):
        path = REPO / "search_spaces" / f"{shipped}.yaml"
        assert sampler_notes(invoke("validate", str(path))) == [], shipped


def test_tune_says_it_before_the_search_starts(tmp_path):
    """The same note opens `raypeft tune` (here one that stops at once: nothing to resume)."""
    store = f"sqlite:///{tmp_path / 'none.db'}"
    dept = str(REPO / "search_spaces" / "dept.yaml")
    result = invoke("tune", dept, "--resume", "--tracking-uri", store)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert any(line.startswith("resources: use_gpu auto") for line in lines)
    note, error = (line for line in lines if not line.startswith("resources: "))
    assert note.startswith("note: `raypeft export --format peft` will refuse this search's")
    assert "method 'dept' has no peft equivalent" in note and "no MLflow store" in error
    assert not (tmp_path / "none.db").exists()


def test_the_experiment_file_is_an_argument_of_tune_as_of_validate(tmp_path):
    dept = str(REPO / "search_spaces" / "dept.yaml")
    both = invoke("tune", dept, "--space", dept)
    assert both.exit_code == 2
    assert both.output.strip() == (
        "error: give the experiment file as the argument or as --space FILE, not both"
    )
    none = invoke("tune")
    assert none.exit_code == 2 and "name the experiment file" in none.output
    # the file as an argument goes through the same checks as --space FILE
    missing = invoke("tune", "no/such/file.yaml")
    assert missing.exit_code == 2 and "no/such/file.yaml: file not found" in missing.output
    assert invoke("validate", "--space", dept).exit_code == 0


def test_the_console_script_skips_the_last_garbage_collection(monkeypatch):
    """``raypeft`` runs :func:`raypeft.cli.main.run`: :func:`gc.freeze` registered at exit
    (the interpreter's last collection took ~2 s of CPU), then the command."""
    import atexit
    import gc
    from importlib.metadata import entry_points

    import raypeft.cli.main as cli_main

    (script,) = entry_points(group="console_scripts", name="raypeft")
    assert script.value == "raypeft.cli.main:run"
    registered, ran = [], []
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.setattr(cli_main, "main", lambda: ran.append("main"))
    cli_main.run()
    assert registered == [gc.freeze] and ran == ["main"]


@pytest.mark.slow
def test_an_address_where_nothing_listens_is_one_line_and_creates_nothing(tmp_path):
    """`tune --address` of a port nobody listens on (a typo, a head not started): exit 2 at
    once, one line naming the address, no store, study or results left (a process of its own:
    Ray is not joined inside pytest's)."""
    from tests.helpers import run_cli, tiny_experiment
    from tests.servers import free_port

    path = tiny_experiment(tmp_path, resources={"use_gpu": False})
    before = set(tmp_path.iterdir())
    address = f"127.0.0.1:{free_port('127.0.0.1')}"
    proc = run_cli(["tune", str(path), "--address", address, "--quiet"], tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (error,) = [line for line in proc.stderr.splitlines() if not line.startswith("note: ")]
    assert error.startswith(f"error: --address {address}: nothing accepts connections there")
    assert "Traceback" not in proc.stderr + proc.stdout
    assert set(tmp_path.iterdir()) == before
