"""The Ray cluster-launcher files (cluster/*.yaml) and the docs that use them.

Both files go through what `ray up` itself runs before any cloud call: the autoscaler's
`prepare_config` (merged with the provider's defaults.yaml; on-premise node types) and then
`validate_config` (jsonschema against the installed Ray's ray-schema.json, plus its own
head/worker checks). No AWS call, no network. Then the security properties of
cluster/aws.yaml are read from the file itself, and every `ray`, `raypeft` and `mlflow`
command in docs/cluster.md (and the guide's cluster section) is checked against the real
command-line interfaces: subcommands, options, referenced files, and raypeft's experiment
loader for `raypeft tune ... --set ...`.
"""

from __future__ import annotations

import copy
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import click
import jsonschema
import pytest
import ray
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from raypeft.config.loading import load_experiment
from raypeft.config.schema import RunConfig

REPO = Path(__file__).resolve().parents[2]
AWS = REPO / "cluster" / "aws.yaml"
LOCAL = REPO / "cluster" / "local.yaml"
NODE = REPO / "cluster" / "node.sh"
DOCS = REPO / "docs" / "cluster.md"
GUIDE = REPO / "docs" / "guide.md"
FILES = {"aws": AWS, "local": LOCAL}

COMMAND_LISTS = (
    "initialization_commands",
    "setup_commands",
    "head_setup_commands",
    "worker_setup_commands",
    "head_start_ray_commands",
    "worker_start_ray_commands",
)


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def as_ray_up_validates(config: dict) -> dict:
    """What `ray up` does to a file before contacting the cloud (ray 2.60: _bootstrap_config)."""
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def all_commands(config: dict) -> list[str]:
    return [cmd for key in COMMAND_LISTS for cmd in config.get(key) or []]


NODE_SCRIPT = "bash ~/raypeft/cluster/node.sh"


def node_script() -> str:
    return NODE.read_text()


def node_calls(config: dict, key: str) -> list[str]:
    """The arguments of each cluster/node.sh call in one command list (every command is one,
    perhaps after environment assignments)."""
    commands = [re.sub(r"^([A-Za-z_][A-Za-z0-9_]*=\S* )+", "", c) for c in config.get(key) or []]
    assert all(c.startswith(NODE_SCRIPT + " ") for c in commands), commands
    return [c[len(NODE_SCRIPT) + 1 :] for c in commands]


def script_function(name: str) -> str:
    """The body of one shell function of cluster/node.sh."""
    match = re.search(rf"^{name}\(\) {{\n(.*?)^}}", node_script(), re.M | re.S)
    assert match, name
    return match.group(1)


# ----------------------------------------------------------------- the autoscaler's validation


@pytest.mark.parametrize("name", sorted(FILES))
def test_files_pass_the_autoscalers_own_validation(name):
    prepared = as_ray_up_validates(load(FILES[name]))
    assert prepared["head_node_type"] in prepared["available_node_types"]


def _unknown_top_level_key(c):
    c["max_worker"] = 3  # typo of max_workers


def _wrong_type(c):
    c["idle_timeout_minutes"] = "ten"


def _fractional_gpu(c):
    c["available_node_types"]["ray.worker.gpu-1x"]["resources"]["GPU"] = 0.5


def _node_type_without_resources(c):
    del c["available_node_types"]["ray.worker.gpu-1x"]["resources"]


def _unknown_node_type_key(c):
    c["available_node_types"]["ray.worker.gpu-1x"]["min_worker"] = 0


def _unknown_security_group_key(c):
    c["provider"]["security_group"] = {"GroupName": "raypeft-cluster", "Ingress": []}


def _unknown_auth_key(c):
    c["auth"]["ssh_usr"] = "ubuntu"


def _head_type_not_declared(c):
    c["head_node_type"] = "ray.head.gpu"


def _commands_not_a_list(c):
    c["worker_start_ray_commands"] = "ray start --address=$RAY_HEAD_IP:6379"


BROKEN = [
    ("aws", _unknown_top_level_key, jsonschema.ValidationError),
    ("aws", _wrong_type, jsonschema.ValidationError),
    ("aws", _fractional_gpu, jsonschema.ValidationError),
    ("aws", _node_type_without_resources, jsonschema.ValidationError),
    ("aws", _unknown_node_type_key, jsonschema.ValidationError),
    ("aws", _unknown_security_group_key, jsonschema.ValidationError),
    ("aws", _head_type_not_declared, ValueError),
    ("aws", _commands_not_a_list, jsonschema.ValidationError),
    ("local", _unknown_top_level_key, jsonschema.ValidationError),
    ("local", _wrong_type, jsonschema.ValidationError),
    ("local", _unknown_auth_key, jsonschema.ValidationError),
]


@pytest.mark.parametrize(
    ("name", "breakage", "error"), BROKEN, ids=[f"{n}-{b.__name__[1:]}" for n, b, _ in BROKEN]
)
def test_the_same_validation_rejects_broken_files(name, breakage, error):
    config = load(FILES[name])
    breakage(config)
    with pytest.raises(error):
        as_ray_up_validates(config)


# ----------------------------------------------------------------------------- security


def test_every_node_type_names_the_one_group_by_id_and_the_file_no_rules():
    """The nodes' group is the one docs/cluster.md's step 5 creates with its rules, named by
    id in every node type, so that Ray's launcher uses it as it is; the rules of a
    `security_group` section would not be what runs. tests/unit/test_aws_security_group.py
    runs both through Ray's own bootstrap."""
    config = load(AWS)
    assert "security_group" not in config["provider"]
    for name, node_type in config["available_node_types"].items():
        node_config = node_type["node_config"]
        assert node_config["SecurityGroupIds"] == ["sg-REPLACE-WITH-YOUR-GROUP-ID"], name
        assert "NetworkInterfaces" not in node_config, name
        assert "LaunchTemplate" not in node_config, name
    assert "sg-REPLACE-WITH-YOUR-GROUP-ID" in DOCS.read_text()


@pytest.mark.parametrize("name", sorted(FILES))
def test_nothing_binds_or_opens_every_address(name):
    text = "\n".join(all_commands(load(FILES[name]))) + node_script()
    assert "0.0.0.0" not in text
    assert "::/0" not in text


def test_both_files_run_the_same_node_commands():
    """Only the provider, the torch build (and boto3 on the AWS head) and where MLflow's
    artefacts go differ: tests/integration/test_cluster_up.py runs local.yaml's commands, so
    it runs AWS's too."""
    aws, local = load(AWS), load(LOCAL)
    for key in ("file_mounts", "rsync_exclude", "rsync_filter", "worker_start_ray_commands"):
        assert aws[key] == local[key], key
    assert node_calls(local, "worker_start_ray_commands") == ["ray start"]
    builds = {"cpu": "https://download.pytorch.org/whl/cpu"}
    builds["cu128"] = "https://download.pytorch.org/whl/cu128"
    assert node_calls(local, "setup_commands") == [f"setup {builds['cu128']}"]
    assert not aws.get("setup_commands")
    assert node_calls(aws, "head_setup_commands") == [f"setup {builds['cpu']} boto3"]
    assert node_calls(aws, "worker_setup_commands") == [f"setup {builds['cu128']}"]
    head = "ray start --head --autoscaling-config=~/ray_bootstrap_config.yaml"
    for config in (aws, local):  # the stores come from ~/.raypeft/cluster.env
        assert node_calls(config, "head_start_ray_commands") == [head, "mlflow server"]


def test_the_local_head_runs_the_autoscaler_that_sets_up_every_worker():
    """Ray 2.60's autoscaler v2 (what `ray up` turns on) counts the local provider's head
    against its one node type's max_workers and sets up one worker of two;
    tests/integration/test_cluster_up.py brings up two with v1."""
    (head, _) = load(LOCAL)["head_start_ray_commands"]
    assert head.startswith("RAY_enable_autoscaler_v2=0 " + NODE_SCRIPT + " ray start --head")


def test_ray_keeps_its_dashboard_on_loopback_and_token_auth_on():
    start = script_function("ray_start")
    assert (
        start.index("ray stop")
        < start.index("export RAY_AUTH_MODE=token")
        < start.index("ray start")
    )
    head, worker = re.findall(r"^\s*ray start .*?[^\\]$", start, re.M | re.S)
    assert "--dashboard-host=127.0.0.1" in head and "--node-ip-address=" in head
    assert '--address="$RAY_HEAD_IP:$GCS_PORT"' in worker and "--node-ip-address=" in worker
    # every later shell on a node (ray exec, ray status, job drivers) carries the mode too
    assert "line_in_bashrc 'export RAY_AUTH_MODE=token'" in script_function("setup")
    for config in (load(AWS), load(LOCAL)):
        assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"


def test_mlflow_starts_after_ray_on_the_head_in_the_background():
    for config in (load(AWS), load(LOCAL)):
        ray, mlflow = node_calls(config, "head_start_ray_commands")
        assert ray.startswith("ray start --head") and mlflow == "mlflow server"
    start, serve = script_function("mlflow_start"), script_function("mlflow_serve")
    assert "nohup setsid" in start and re.search(r"&\s*$", start, re.M), "must not block ray up"
    assert '>> "$STATE/mlflow.log"' in start, "logs to a file"
    assert "/health" in start
    assert "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false" in serve
    # the store's URI (perhaps with a password) through the environment, not argv
    assert (
        "MLFLOW_BACKEND_STORE_URI=${MLFLOW_BACKEND_STORE_URI:-sqlite:///$STATE/mlflow.db}" in serve
    )
    assert "--backend-store-uri" not in serve
    assert "MLFLOW_PORT=${RAYPEFT_MLFLOW_PORT:-5000}" in node_script()


def test_mlflow_binds_the_heads_loopback():
    """Only the Tune driver, on the head, writes to MLflow; people come through SSH."""
    serve = script_function("mlflow_serve")
    assert re.findall(r"--host\s+(\S+)", serve) == ["127.0.0.1"]
    assert '--allowed-hosts "localhost:*,127.0.0.1:*"' in serve
    # the job drivers' default tracking URI is that server
    assert "MLFLOW_TRACKING_URI=${MLFLOW_TRACKING_URI:-http://127.0.0.1:$MLFLOW_PORT}" in (
        script_function("ray_start")
    )


def test_every_node_command_reads_the_clusters_stores():
    """~/.raypeft/cluster.env is shipped to every node and read by every node command that
    starts a server: Ray (head and workers) and the head's MLflow server."""
    for config in (load(AWS), load(LOCAL)):
        assert config["file_mounts"]["~/.raypeft/cluster.env"] == "~/.raypeft/cluster.env"
        assert "~/.raypeft/head.env" not in config["file_mounts"]  # the head's alone
    assert "split_head_secrets" in script_function("ray_start")
    assert "export_worker_env" in script_function("ray_start")
    assert 'export_from "$HEAD_ENV"' in script_function("mlflow_serve")
    example = (REPO / "cluster" / "cluster.env.example").read_text()
    for key in ("MLFLOW_BACKEND_STORE_URI=postgresql+psycopg://", "RAYPEFT_STORAGE_PATH=s3://"):
        assert key in example


SECRET = "s3cr3t-pw"
CLUSTER_ENV = (
    f"MLFLOW_BACKEND_STORE_URI=postgresql+psycopg://mlflow:{SECRET}@db:5432/mlflow\n"
    "MLFLOW_ARTIFACTS_DESTINATION=s3://bucket/mlflow-artifacts\n"
    f"export RAYPEFT_SEARCH_STORAGE=postgresql+psycopg://optuna:{SECRET}@db:5432/optuna\n"
    "RAYPEFT_STORAGE_PATH=s3://bucket/ray_results\n"
    "AWS_ENDPOINT_URL=http://127.0.0.1:9\n"
)


def node_sh(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """cluster/node.sh in ``home`` with a `ray` that writes the environment it was given to
    ~/ray.env (for `ray start`) instead of starting anything."""
    fake = home / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "ray").write_text('#!/bin/sh\n[ "$1" = start ] && env > "$HOME/ray.env"\nexit 0\n')
    (fake / "ray").chmod(0o755)
    base = {"HOME": str(home), "PATH": f"{fake}:/usr/bin:/bin", "RAYPEFT_NODE_IP": "10.0.0.1"}
    return subprocess.run(
        ["bash", str(NODE), *args], env={**base, **env}, capture_output=True, text=True
    )


def test_database_lines_stay_on_the_head_and_out_of_its_ray(tmp_path):
    """The head splits the laptop's cluster.env: database lines into head.env (0600, no file
    mount), the rest kept for the workers; its Ray gets the file's path, not the secrets; a
    worker given that copy exports no database line."""
    head, worker = tmp_path / "head", tmp_path / "worker"
    (head / ".raypeft").mkdir(parents=True)
    env_file = head / ".raypeft" / "cluster.env"
    env_file.write_text(CLUSTER_ENV)
    env_file.chmod(0o600)
    started = node_sh(head, "ray", "start", "--head")
    assert started.returncode == 0, started.stderr
    head_env = head / ".raypeft" / "head.env"
    assert oct(head_env.stat().st_mode & 0o777) == "0o600"
    assert SECRET in head_env.read_text() and "s3://bucket/mlflow-artifacts" in head_env.read_text()
    assert SECRET not in env_file.read_text() and "RAYPEFT_STORAGE_PATH" in env_file.read_text()
    ray_env = (head / "ray.env").read_text()
    assert SECRET not in ray_env
    assert f"RAYPEFT_SECRETS_FILE={head_env}" in ray_env.splitlines()
    assert "RAYPEFT_STORAGE_PATH=s3://bucket/ray_results" in ray_env.splitlines()
    # a second `ray up` that found the file mounts unchanged: the split copy is kept, and so
    # is head.env
    assert node_sh(head, "ray", "start", "--head").returncode == 0
    assert SECRET in head_env.read_text()

    # a worker, with the head's copy (what the head's autoscaler ships)
    (worker / ".raypeft").mkdir(parents=True)
    shutil.copy2(env_file, worker / ".raypeft" / "cluster.env")
    joined = node_sh(worker, "ray", "start", RAY_HEAD_IP="10.0.0.2")
    assert joined.returncode == 0, joined.stderr
    ray_env = (worker / "ray.env").read_text()
    assert SECRET not in ray_env and "RAYPEFT_SECRETS_FILE" not in ray_env
    assert "AWS_ENDPOINT_URL=http://127.0.0.1:9" in ray_env.splitlines()
    # a worker given the laptop's whole file by hand still exports no database line
    (worker / ".raypeft" / "cluster.env").write_text(CLUSTER_ENV)
    joined = node_sh(worker, "ray", "start", RAY_HEAD_IP="10.0.0.2")
    assert joined.returncode == 0 and "not exported" in joined.stderr
    assert SECRET not in (worker / "ray.env").read_text()


@pytest.mark.parametrize("command", [["ray", "start", "--head"], ["ray", "start"]])
def test_a_cluster_env_others_can_read_is_refused(tmp_path, command):
    (tmp_path / ".raypeft").mkdir()
    env_file = tmp_path / ".raypeft" / "cluster.env"
    env_file.write_text(CLUSTER_ENV)
    env_file.chmod(0o644)
    refused = node_sh(tmp_path, *command, RAY_HEAD_IP="10.0.0.2")
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert str(env_file) in line and "chmod 600 ~/.raypeft/cluster.env" in line, line
    assert not (tmp_path / "ray.env").exists()  # nothing started
    assert not (tmp_path / ".raypeft" / "head.env").exists()


# ----------------------------------------------------------------------------- node types


def test_aws_node_types():
    config = load(AWS)
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("GPU") == 0
    assert not re.match(r"(g|p)\d", head["node_config"]["InstanceType"]), "the head is CPU-only"
    workers = {k: v for k, v in types.items() if k != config["head_node_type"]}
    assert workers
    for name, node_type in workers.items():
        assert node_type["resources"]["GPU"] >= 1, name
        assert node_type["resources"]["CPU"] >= 1, name
        assert node_type["min_workers"] == 0, name
        assert 1 <= node_type["max_workers"] <= config["max_workers"], name
    spot = [
        n
        for n, t in workers.items()
        if t["node_config"].get("InstanceMarketOptions", {}).get("MarketType") == "spot"
    ]
    assert spot
    images = {t["node_config"]["ImageId"] for t in types.values()}
    assert len(images) == 1, "one AMI everywhere: the same Python on every node"
    for name, node_type in types.items():
        assert node_type["node_config"]["IamInstanceProfile"]["Name"], name
        assert node_type["node_config"]["MetadataOptions"]["HttpTokens"] == "required", name
    assert config["idle_timeout_minutes"] > 0
    assert isinstance(config["provider"]["cache_stopped_nodes"], bool)


# ----------------------------------------------------------------------------- installs


def test_installs_match_this_repository():
    setup = script_function("setup")
    assert "grep -m1 '^torch==' \"$REPO/constraints.txt\"" in setup
    assert f"RAY_VERSION={ray.__version__} " in node_script(), (
        "the cluster must run the Ray your laptop's `ray up` / `ray job submit` run"
    )
    assert '"ray[default,tune,train]==$RAY_VERSION"' in setup
    assert '-c "$REPO/constraints.txt" -e "$REPO"' in setup
    assert "requirements-offline-assets.txt" in setup
    # torch first, then raypeft (whose torch>=2.4 is then met by the chosen build)
    assert setup.index('"$torch" --index-url') < setup.index('-e "$REPO"')
    for config in (load(AWS), load(LOCAL)):
        assert config["file_mounts"]["~/raypeft"] == "."


def test_a_second_setup_installs_nothing_when_nothing_changed():
    """The stamp names every input of the install and is written only after all of it."""
    setup = script_function("setup")
    for part in ("pyproject.toml", "constraints.txt", "requirements-offline-assets.txt"):
        assert f'"$REPO/{part}"' in setup.split("sha256sum")[0], part
    assert 'stamp="$stamp $torch_index $RAY_VERSION $*"' in setup
    assert setup.index("return 0") < setup.index('"${pip[@]}" --upgrade pip')
    assert setup.rstrip().endswith('echo "$stamp" > ~/venv/.raypeft-setup')


def test_aws_cuda_build_is_chosen_in_one_place():
    script = [line for line in node_script().splitlines() if not line.lstrip().startswith("#")]
    commands = all_commands(load(AWS)) + script
    cuda = [c for c in commands if "download.pytorch.org/whl/cu" in c]
    assert len(cuda) == 1 and cuda[0] in load(AWS)["worker_setup_commands"]


def test_results_go_to_shared_storage_through_run_storage_path():
    assert "storage_path" in RunConfig.model_fields
    assert "RAYPEFT_STORAGE_PATH=s3://" in DOCS.read_text()
    assert "RAYPEFT_STORAGE_PATH=s3://" in (REPO / "cluster" / "cluster.env.example").read_text()


# ----------------------------------------------------------------------------- the docs


def guide_section() -> str:
    text = GUIDE.read_text()
    match = re.search(r"^## Running on a cluster\n(.*?)(?=^## )", text, re.M | re.S)
    assert match, "docs/guide.md: no `## Running on a cluster` section"
    return match.group(0)


def doc_texts() -> dict[str, str]:
    return {"docs/cluster.md": DOCS.read_text(), "docs/guide.md": guide_section()}


def shell_lines(markdown: str) -> list[str]:
    """The commands of the ```bash blocks: continuations joined, heredoc bodies skipped."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, re.S):
        current, heredoc_end = "", None
        for raw in block.splitlines():
            line = raw.strip()
            if heredoc_end:
                heredoc_end = None if line == heredoc_end else heredoc_end
                continue
            marker = re.search(r"<<'?(\w+)'?", line)
            if marker:
                heredoc_end = marker.group(1)
            current += line
            if current.endswith("\\"):
                current = current[:-1] + " "
                continue
            if current:
                out.append(current)
            current = ""
    return out


def _clis() -> dict[str, click.Command]:
    from mlflow.cli import cli as mlflow_cli
    from ray.scripts.scripts import cli as ray_cli

    from raypeft.cli.main import main as raypeft_cli

    return {"ray": ray_cli, "raypeft": raypeft_cli, "mlflow": mlflow_cli}


SEPARATORS = {"&&", "||", "|", ";", "&"}
REDIRECTS = re.compile(r"^(\d?>>?|<|\d?>&\d)$")


def _segments(line: str) -> list[list[str]]:
    """A shell line as simple commands; `$(...)` substitutions become commands of their own."""
    substitutions = re.findall(r"\$\(([^()]*)\)", line)
    line = re.sub(r"\$\(([^()]*)\)", "SUBST", line)
    segments, current = [], []
    for token in shlex.split(line, comments=True):
        if token in SEPARATORS:
            segments.append(current)
            current = []
        else:
            current.append(token)
    segments.append(current)
    for inner in substitutions:
        segments += _segments(inner)
    return [s for s in segments if s]


def _repo_path(path: str) -> Path:
    for prefix in ("/home/ubuntu/raypeft/", "~/raypeft/"):
        if path.startswith(prefix):
            return REPO / path[len(prefix) :]
    return REPO / path


def check_invocation(tokens: list[str], seen: list[str]) -> None:
    """Subcommands and options exist; `raypeft tune` loads; `ray exec` commands recurse."""
    while tokens and (re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[0]) or tokens[0] == "nohup"):
        tokens = tokens[1:]
    if not tokens or tokens[0] not in ("ray", "raypeft", "mlflow"):
        return
    command, path, rest = _clis()[tokens[0]], [tokens[0]], tokens[1:]
    while isinstance(command, click.Group):
        assert rest and rest[0] in command.commands, f"`{' '.join(path)}` has no `{rest[:1]}`"
        command = command.commands[rest[0]]
        path.append(rest[0])
        rest = rest[1:]
    seen.append(" ".join(path))
    options = {opt for p in command.params for opt in p.opts + p.secondary_opts}
    values, positionals, after = {}, [], None
    i = 0
    while i < len(rest):
        token = rest[i]
        if token == "--":
            after = rest[i + 1 :]
            break
        if REDIRECTS.match(token):
            break
        if token.startswith("-") and token != "-":
            name, _, inline = token.partition("=")
            assert name in options, f"`{' '.join(path)}` has no option {name}"
            param = next(p for p in command.params if name in p.opts + p.secondary_opts)
            takes_value = isinstance(param, click.Option) and not param.is_flag
            if takes_value and not inline:
                inline = rest[i + 1]
                i += 1
            values.setdefault(name, []).append(inline)
        else:
            positionals.append(token)
        i += 1
    if after:
        check_invocation(after, seen)
    if path[:2] == ["ray", "exec"]:
        for segment in _segments(positionals[-1]):
            check_invocation(segment, seen)
    if path == ["raypeft", "tune"]:
        overrides = list(values.get("--set", []))
        overrides += [f"tracking.uri={u}" for u in values.get("--tracking-uri", [])]
        load_experiment(_repo_path(values["--space"][0]), overrides)  # raises if invalid
    if path == ["mlflow", "server"]:
        assert values["--host"] != ["0.0.0.0"]


@pytest.mark.parametrize("doc", sorted(doc_texts()))
def test_documented_commands_exist_and_their_experiments_load(doc):
    seen: list[str] = []
    for line in shell_lines(doc_texts()[doc]):
        for segment in _segments(line):
            check_invocation(segment, seen)
    expected = {"ray up", "ray job submit", "ray attach", "ray down", "raypeft tune"}
    if doc == "docs/cluster.md":
        expected |= {
            "ray dashboard",
            "ray exec",
            "ray attach",
            "ray job logs",
            "ray start",
            "ray get-auth-token",
            "mlflow server",
        }
    assert expected <= set(seen), expected - set(seen)


def test_documented_job_submission_uses_the_tunnel_and_the_clusters_stores():
    """A submitted search names no store: the head's environment (cluster.env, node.sh) does."""
    for doc, text in doc_texts().items():
        submit = [line for line in shell_lines(text) if "ray job submit" in line]
        assert submit, doc
        for line in submit:
            assert "--address http://127.0.0.1:8265" in line, doc
            assert "--address auto" in line, doc
            assert "--tracking-uri" not in line and "storage" not in line, (doc, line)
        assert "~/.raypeft/cluster.env" in text, doc


@pytest.mark.parametrize("doc", sorted(doc_texts()))
def test_documented_files_exist(doc):
    text = doc_texts()[doc]
    paths = re.findall(
        r"(?<![\w/~.$-])((?:cluster|search_spaces|docs|schema|scripts|raypeft|tests)/[\w./-]*\w)",
        text,
    )
    paths += re.findall(r"/home/ubuntu/raypeft/([\w./-]*\w)", text)
    paths += re.findall(r"\b(constraints\.txt|requirements-offline-assets\.txt)\b", text)
    assert "cluster/aws.yaml" in paths
    missing = sorted({p for p in paths if not (REPO / p).exists()})
    assert not missing, f"{doc} names files that do not exist: {missing}"
