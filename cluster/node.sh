#!/usr/bin/env bash
# What every raypeft cluster node runs, shared by cluster/aws.yaml and cluster/local.yaml: the
# launcher copies the repository to ~/raypeft (file_mounts) and then calls this script in
# setup_commands, head_start_ray_commands and worker_start_ray_commands. The two files differ
# in their provider section and in the torch build they pass to `setup`; every node command is
# here, and tests/integration/test_cluster_up.py runs it through a real `ray up`.
#
#   node.sh setup TORCH_INDEX_URL [PACKAGE ...]
#       ~/venv (activated by ~/.bashrc, with RAY_AUTH_MODE=token), torch from TORCH_INDEX_URL
#       (the one setting of the torch build: https://download.pytorch.org/whl/cu128, .../cpu,
#       ...) at constraints.txt's version, then raypeft (with the production stores' drivers,
#       psycopg and boto3), Ray and the offline assets, then any extra PACKAGEs. Idempotent:
#       a second `ray up` re-runs it, and installs nothing when the dependency files, the
#       torch build, Ray's version and the PACKAGEs are those of the last install.
#   node.sh ray start --head [RAY START OPTION ...]
#   node.sh ray start [RAY START OPTION ...]
#       Stops this node's Ray (`ray stop`: the ssh user's Ray processes), then starts the head,
#       or a worker joining $RAY_HEAD_IP (set by the launcher), with token authentication, the
#       node's address and the ports below; the options given are passed on (the head's
#       --autoscaling-config).
#   node.sh mlflow server [ARTIFACTS_DESTINATION]
#       The MLflow tracking server on the head, in the background, bound to the head's
#       loopback (only the Tune driver, on the head, writes to it; you reach it through an
#       SSH tunnel): its store $MLFLOW_BACKEND_STORE_URI (default: sqlite in
#       ~/raypeft-state), artefacts in ARTIFACTS_DESTINATION, else
#       $MLFLOW_ARTIFACTS_DESTINATION (s3://...), else ~/raypeft-state/mlartifacts. It replaces the
#       server a previous `ray up` started and stops by itself when this node's Ray stops
#       (`ray down`). Fails, showing its log, when it does not answer in 60 s.
#
# The cluster's stores and secrets: ~/.raypeft/cluster.env (shipped from your laptop by the
# launcher's file mounts, mode 0600, else every command here refuses it; cluster/cluster.env.example
# shows it) names where the MLflow server keeps runs and artefacts, the Optuna study's
# database (RAYPEFT_SEARCH_STORAGE), Ray Tune's storage (RAYPEFT_STORAGE_PATH), and the S3
# endpoint and credentials where there is no instance profile. Empty: sqlite on the head.
# Its database lines (HEAD_ONLY below) stay on the head: `ray start --head` moves them into
# ~/.raypeft/head.env (0600), which no file mount ships, and leaves the rest in cluster.env,
# the copy the head's autoscaler ships to the workers. So a worker's disk and its processes
# (trials included) never hold a database password. On the head, the MLflow server reads
# head.env into its own environment; Ray's processes get only its path
# (RAYPEFT_SECRETS_FILE), which `raypeft` reads when it starts: the job driver, the only
# other writer, takes the Optuna database from it.
# The node's address (what Ray binds) is the address the launcher reached it at over SSH
# (the server side of $SSH_CONNECTION): provider.head_ip / worker_ips on your own machines,
# the private address on EC2 (the public one is NAT, never seen by the instance).
# RAYPEFT_NODE_IP overrides it. Ports, with Ray's and MLflow's defaults (override them in the
# node's environment, e.g. ~/.bashrc, where another Ray already uses them):
#   RAYPEFT_GCS_PORT=6379 RAYPEFT_DASHBOARD_PORT=8265 RAYPEFT_CLIENT_PORT=10001
#   RAYPEFT_AGENT_PORT=52365 RAYPEFT_MLFLOW_PORT=5000
# and the head's Prometheus exporters (Ray reads these two itself; a port another Ray on the
# machine holds leaves the exporter silently off):
#   DASHBOARD_METRIC_PORT=44227 AUTOSCALER_METRIC_PORT=44217
set -euo pipefail

CLUSTER_ENV=~/.raypeft/cluster.env # from the laptop; on a worker, the head's split copy
HEAD_ENV=~/.raypeft/head.env         # the head's alone: never a file mount
# What only the head's writers (MLflow server, job driver) need: the database URIs, the
# databases' password where it is kept out of them (libpq's PGPASSWORD), and the server's
# artefact destination.
HEAD_ONLY="MLFLOW_BACKEND_STORE_URI|RAYPEFT_SEARCH_STORAGE|PGPASSWORD|MLFLOW_ARTIFACTS_DESTINATION"
# The first line of a cluster.env the head has split: a fresh copy from the laptop lacks it.
SPLIT_MARK="# split by node.sh on the head: its database lines are in ~/.raypeft/head.env"
HEAD_ONLY_LINE="^[[:space:]]*(export[[:space:]]+)?($HEAD_ONLY)=" # one such assignment

REPO=~/raypeft
STATE=~/raypeft-state
RAY_VERSION=2.60.0 # the Ray of the laptop: `ray up`, `ray job submit` and the cluster must agree
GCS_PORT=${RAYPEFT_GCS_PORT:-6379}
DASHBOARD_PORT=${RAYPEFT_DASHBOARD_PORT:-8265}
CLIENT_PORT=${RAYPEFT_CLIENT_PORT:-10001}
AGENT_PORT=${RAYPEFT_AGENT_PORT:-52365}
MLFLOW_PORT=${RAYPEFT_MLFLOW_PORT:-5000}

node_ip() {
  if [ -n "${RAYPEFT_NODE_IP:-}" ]; then
    echo "$RAYPEFT_NODE_IP"
  elif [ -n "${SSH_CONNECTION:-}" ]; then
    set -- $SSH_CONNECTION # client address, client port, server address, server port
    echo "$3"
  else
    echo "node.sh: no node address: not run over SSH and RAYPEFT_NODE_IP unset" >&2
    exit 2
  fi
}

# A file of secrets that others can read is refused, naming the fix (rsync keeps the laptop's
# mode, so the fix is made there).
refuse_readable() {
  local file=$1 mode
  [ -f "$file" ] || return 0
  mode=$(stat -c %a "$file")
  if (((8#$mode & 8#077) != 0)); then
    echo "node.sh: $file is mode $mode (readable by others) and holds the cluster's" \
      "passwords: run chmod 600 ~/.raypeft/cluster.env on your laptop, then ray up again" >&2
    exit 2
  fi
}

# Export every assignment of an env file (no-op when it is absent).
export_from() {
  [ -f "$1" ] || return 0
  set -a
  # shellcheck source=/dev/null
  . "$1"
  set +a
}

# The head only, before its Ray starts (so before its autoscaler ships cluster.env to any
# worker): a cluster.env fresh from the laptop is split, its HEAD_ONLY lines into head.env
# and the rest kept in cluster.env under SPLIT_MARK. An already split one (a `ray up` that
# found the file mounts unchanged) is left as it is, and so is head.env.
split_head_secrets() {
  refuse_readable "$CLUSTER_ENV"
  [ -f "$CLUSTER_ENV" ] || return 0
  if [ "$(head -n 1 "$CLUSTER_ENV")" = "$SPLIT_MARK" ]; then return 0; fi
  (
    umask 077
    grep -E "$HEAD_ONLY_LINE" "$CLUSTER_ENV" > "$HEAD_ENV.new" || true
    { echo "$SPLIT_MARK"; grep -vE "$HEAD_ONLY_LINE" "$CLUSTER_ENV" || true; } > "$CLUSTER_ENV.new"
  )
  mv "$HEAD_ENV.new" "$HEAD_ENV"
  mv "$CLUSTER_ENV.new" "$CLUSTER_ENV"
}

# A worker: never a HEAD_ONLY line in its environment, even from a cluster.env that was not
# split by a head (a copy made by hand).
export_worker_env() {
  refuse_readable "$CLUSTER_ENV"
  [ -f "$CLUSTER_ENV" ] || return 0
  if grep -qE "$HEAD_ONLY_LINE" "$CLUSTER_ENV"; then
    echo "node.sh: $CLUSTER_ENV on a worker holds database lines; they are not exported" >&2
  fi
  set -a
  # shellcheck source=/dev/null
  . <(grep -vE "$HEAD_ONLY_LINE" "$CLUSTER_ENV" || true)
  set +a
}

line_in_bashrc() { grep -qxF "$1" ~/.bashrc 2>/dev/null || echo "$1" >> ~/.bashrc; }

setup() {
  local torch_index=$1
  shift
  # Ubuntu's python3 comes without its venv module (python3-venv).
  if ! python3 -c "import ensurepip" 2> /dev/null; then
    sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq
    sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq python3-venv
  fi
  # A virtualenv (Ubuntu 24.04's system Python refuses `pip install`, PEP 668), activated by
  # ~/.bashrc, which the launcher sources before every command. Every shell on the node
  # (`ray exec`, `ray attach`, `ray status`, job drivers) talks to Ray with the token.
  test -x ~/venv/bin/pip || python3 -m venv ~/venv
  line_in_bashrc 'source ~/venv/bin/activate'
  line_in_bashrc 'export RAY_AUTH_MODE=token'
  # What this install is made of; the same as the last one's: nothing to install. raypeft is
  # installed editable, so a code change needs no install; a changed dependency, pin, build
  # or Ray version does. (pip itself takes ~30 s per node to find everything installed.)
  local stamp
  stamp=$(cat "$REPO/pyproject.toml" "$REPO/constraints.txt" \
    "$REPO/requirements-offline-assets.txt" | sha256sum | cut -c1-16)
  stamp="$stamp $torch_index $RAY_VERSION $*"
  if [ "$(cat ~/venv/.raypeft-setup 2> /dev/null)" = "$stamp" ]; then
    echo "node.sh setup: ~/venv is up to date ($stamp)"
    return 0
  fi
  rm -f ~/venv/.raypeft-setup
  # --no-compile: byte-compiling every module of the venv (~24,000) takes a minute of CPU
  # per node; Python compiles the few thousand a process imports on first import and keeps
  # them (the node's shells do not set PYTHONDONTWRITEBYTECODE)
  local pip=(~/venv/bin/pip install --quiet --disable-pip-version-check --no-compile)
  "${pip[@]}" --upgrade pip
  # torch first, from the chosen build, so that raypeft's `torch>=2.4` is already met by it;
  # -c constraints.txt then pins torch (whatever the build) and pyarrow<26 (mlflow).
  local torch
  torch=$(grep -m1 '^torch==' "$REPO/constraints.txt")
  "${pip[@]}" "$torch" --index-url "$torch_index"
  # editable_mode=compat: the repository folder on sys.path (a .pth file), so that `import
  # raypeft` finds the package even where ~/raypeft itself is importable as a namespace
  # package: in the home directory, the working directory of `ray job submit` entrypoints
  # and their Ray workers (with setuptools' default import hook, the empty namespace wins
  # there, and the methods are never registered).
  "${pip[@]}" -c "$REPO/constraints.txt" -e "$REPO" --config-settings editable_mode=compat \
    "ray[default,tune,train]==$RAY_VERSION"
  "${pip[@]}" --no-deps -r "$REPO/requirements-offline-assets.txt"
  if [ $# -gt 0 ]; then "${pip[@]}" -c "$REPO/constraints.txt" "$@"; fi
  echo "$stamp" > ~/venv/.raypeft-setup
}

ray_start() {
  local ip head=false
  if [[ " $* " == *" --head "* ]]; then head=true; fi
  # the stores' settings first: a file refused stops the node before anything is stopped
  if $head; then
    split_head_secrets
    export_from "$CLUSTER_ENV"
    # the path, not the secrets: `raypeft` (the job driver) reads the file when it starts
    if [ -f "$HEAD_ENV" ]; then export RAYPEFT_SECRETS_FILE=$HEAD_ENV; fi
  else
    export_worker_env
  fi
  ip=$(node_ip)
  ray stop
  ulimit -n 65536 || true
  export RAY_AUTH_MODE=token # GCS, dashboard and job API accept only callers with the token
  if $head; then
    # The job drivers (raypeft tune) record into the head's MLflow server by default.
    export MLFLOW_TRACKING_URI=${MLFLOW_TRACKING_URI:-http://127.0.0.1:$MLFLOW_PORT}
    # The dashboard and job API on the head's loopback only: `ray dashboard CLUSTER.yaml`
    # tunnels to it.
    ray start "$@" --node-ip-address="$ip" --port="$GCS_PORT" \
      --dashboard-host=127.0.0.1 --dashboard-port="$DASHBOARD_PORT" \
      --ray-client-server-port="$CLIENT_PORT" --dashboard-agent-listen-port="$AGENT_PORT" \
      --disable-usage-stats
  else
    ray start "$@" --address="$RAY_HEAD_IP:$GCS_PORT" --node-ip-address="$ip" \
      --dashboard-agent-listen-port="$AGENT_PORT" --disable-usage-stats
  fi
}

# The server's process group, led by this script (`node.sh mlflow serve`): it ends the server
# when this node's Ray is gone (`ray down`, or the `ray stop` of the next `ray up`).
mlflow_serve() {
  # the server's own environment: the stores' settings, the database URI among them
  export_from "$CLUSTER_ENV"
  export_from "$HEAD_ENV"
  local destination=${1:-${MLFLOW_ARTIFACTS_DESTINATION:-$STATE/mlartifacts}}
  echo $$ > "$STATE/mlflow.pid"
  # The store's URI (it may hold a password) reaches the server through its environment,
  # never its command line. --allowed-hosts: the Host headers MLflow answers (its
  # DNS-rebinding guard): loopback names, as the driver and an SSH tunnel's localhost:PORT
  # send them.
  MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false \
    MLFLOW_BACKEND_STORE_URI=${MLFLOW_BACKEND_STORE_URI:-sqlite:///$STATE/mlflow.db} \
    mlflow server --host 127.0.0.1 --port "$MLFLOW_PORT" \
    --allowed-hosts "localhost:*,127.0.0.1:*" --workers 2 \
    --serve-artifacts --artifacts-destination "$destination" &
  local server=$!
  while kill -0 "$server" 2> /dev/null && pgrep -u "$(id -u)" -x gcs_server > /dev/null; do
    sleep 5
  done
  echo "node.sh: Ray stopped on this node; stopping the MLflow server"
  kill -- -$$
}

mlflow_start() {
  local destination=${1:-} # empty: head.env's MLFLOW_ARTIFACTS_DESTINATION (mlflow_serve)
  local url="http://127.0.0.1:$MLFLOW_PORT"
  mkdir -p "$STATE"
  echo "$url" > "$STATE/tracking_uri"
  if [ -f "$STATE/mlflow.pid" ]; then
    local old
    old=$(cat "$STATE/mlflow.pid")
    if ps -o args= -p "$old" | grep -q "node.sh mlflow serve"; then
      kill -- "-$old" || true
      while ps -o args= -p "$old" > /dev/null; do sleep 1; done
    fi
  fi
  # nohup + setsid: neither `ray up`'s SSH session nor this script waits for it.
  nohup setsid bash "$0" mlflow serve "$destination" >> "$STATE/mlflow.log" 2>&1 < /dev/null &
  for _ in $(seq 60); do
    if curl -sf "$url/health" > /dev/null; then
      echo "MLflow: $url on the head (ssh -L $MLFLOW_PORT:127.0.0.1:$MLFLOW_PORT to reach it)"
      return 0
    fi
    sleep 1
  done
  tail -n 30 "$STATE/mlflow.log"
  return 1
}

case "${1:-} ${2:-}" in
  "setup "*) shift; setup "$@" ;;
  "ray start") shift 2; ray_start "$@" ;;
  "mlflow server") shift 2; mlflow_start "$@" ;;
  "mlflow serve") shift 2; mlflow_serve "$@" ;;
  *)
    echo "usage: node.sh setup TORCH_INDEX_URL [PACKAGE ...] | ray start [--head] [OPTION ...]" \
      "| mlflow server [ARTIFACTS_DESTINATION]" >&2
    exit 2
    ;;
esac
