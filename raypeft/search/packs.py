# Over 500 lines on purpose: a pack seen from Tune, one book of seats for registry, server, trials.
"""Packed trials (``resources.trials_per_worker: K``): K configurations train on one frozen
backbone, and each is still a Ray Tune trial of its own.

Every configuration is a Tune trial (:func:`trial_in_pack`) asking Ray for 1/K of a worker's
CPUs and GPUs, so Optuna's searcher (one Optuna trial per configuration), the scheduler
(its own decision per trial), the MLflow tracker (one child run per configuration), the live
table, repeats, ``--resume`` and Ctrl-C see trials as they always do. Such a trial does not
train: it takes a seat in a **pack server** (:class:`PackServer`, a Ray actor on its node that
asks for no resources, its members hold them) and relays to ``tune.report`` what the server
reports for it: the metrics and checkpoint of each evaluation, exactly those it would report
alone (:mod:`raypeft.training.pack_host`), plus the pack's id, size and padding waste.

A per-search :class:`PackRegistry` (a Ray actor the search owns, so its servers end with the
search) seats each trial in a server of its node, device and backbone with a free slot, and
starts a server where none has one. A pack pads its members' prompts to the longest (a
search that samples DePT's m mixes lengths), so the registry groups them by prompt shape:
while the node has room for another pack, a trial whose shape no pack holds opens one; once
the node's packs cover it, a trial takes the free slot that adds the least padding, the
fullest pack first among equals.

How a member learns that Tune is done with its trial (Ray 2.60, ``ray.train._internal.session``):
a function trainable's ``tune.report`` blocks until Tune asks the trial for its next result
(``_TrainSession._report_training_result`` waits on ``continue_lock``, released by the next
``get_next``), which Tune does only after the scheduler let the trial go on. A stopped trial's
``tune.report`` raises ``SystemExit(0)`` instead, when Tune stops its actor
(``FunctionTrainable.cleanup`` -> ``session.finish``) or, with ``reuse_actors``, resets it for
the next trial (``FunctionTrainable.reset_config``, which waits 2 s for the thread to end).
So a member asks its server for the next report only after ``tune.report`` returned: that
call is the acknowledgement, and the server holds the member (no steps) until it arrives. A
stopped member leaves in its ``finally``; one whose process died is found by the server's
watcher (a pending call to the dead actor fails with ``ActorDiedError``): its slot is free.
A real Tune run pins both behaviours (tests/unit/test_private_reliance.py).
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
import uuid
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray import tune
from ray.exceptions import (
    ActorDiedError,
    ActorUnavailableError,
    GetTimeoutError,
    RayError,
    RayTaskError,
)
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raypeft.config.schema import ExperimentConfig, trial_config
from raypeft.data import TokenizedTask
from raypeft.methods import BackboneDims, MethodConfig
from raypeft.modeling.backbones import built_from_config
from raypeft.search.resources import trial_request, trials_on
from raypeft.search.trial_runners import (
    _checkpoint_folder,
    gpu_device,
    trial_in_process,
    worker_identity,
)
from raypeft.tracking.system_metrics import sampler_for
from raypeft.training.pack import MemberSpec
from raypeft.training.pack_host import MemberReport, PackHost, PackRefused

# A trial that finds every pack of its node full although the node only holds as many trials
# as those packs seat waits this long for a slot to free (a stopped trial leaving) before it
# opens another pack: packing density only, never correctness.
SEAT_WAIT_S = 30.0
WATCH_EVERY_S = 1.0  # how often a server checks that its members' trials are alive
# A member whose trial cannot be checked this many times in a row fails (see _watch)
WATCH_TRIES = 3
LEAVE_TIMEOUT_S = 1.5  # Tune gives a reused actor's old trial 2 s to end


@dataclass(frozen=True)
class Place:
    """What a pack's members share: a backbone (``group``) on one device of one node."""

    group: str  # backbone_group(cfg)
    node: str  # Ray node id
    gpus: tuple[str, ...] = ()  # the GPU ids Ray assigned (a fraction of one GPU)


def backbone_group(cfg: ExperimentConfig) -> str:
    """Trials of one group can share a frozen backbone: the same model (name, revision,
    length), precision, backbone dropout and, for a randomly initialised test model,
    ``train.seed``."""
    seed = cfg.train.seed if built_from_config(cfg.model.name) else None
    key = {
        "model": cfg.model.model_dump(mode="json"),
        "precision": cfg.train.precision,
        "backbone_dropout": cfg.train.backbone_dropout,
    }
    return json.dumps({**key, "seed": seed}, sort_keys=True)


@dataclass(frozen=True)
class PromptShape:
    """What a member pads its pack's fused batch to: the prompt positions it prepends and the
    key/value prefix slots (deep prompts' ``kv`` style) it adds in each layer."""

    positions: int = 0
    prefix: int = 0

    @classmethod
    def of(cls, method: MethodConfig, dims: BackboneDims) -> PromptShape:
        resolved = method.resolve(dims)  # a budget's derived length
        return cls(resolved.prompt_positions(), resolved.prefix_length())


def padding_per_row(shapes: Collection[PromptShape]) -> int:
    """Padded slots in each row of a pack of members of these shapes: each member's prompt
    and prefix padded to the longest."""
    if not shapes:
        return 0
    longest = max(s.positions for s in shapes), max(s.prefix for s in shapes)
    return sum(longest[0] - s.positions + longest[1] - s.prefix for s in shapes)


@dataclass
class _Seats:
    place: Place
    keys: dict[str, PromptShape] = field(default_factory=dict)  # seated trial -> its shape

    def padding_added(self, shape: PromptShape) -> int:
        """Padded slots per row that seating a member of ``shape`` here adds."""
        shapes = list(self.keys.values())
        return padding_per_row([*shapes, shape]) - padding_per_row(shapes)


class PackBook:
    """Which pack seats which trial: the registry's bookkeeping (no Ray)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.packs: dict[str, _Seats] = {}  # pack id -> its place and seated trials
        self.seat_of: dict[str, str] = {}  # trial key -> pack id
        self.trial_of: dict[str, str] = {}  # Tune actor -> the trial it runs (one at a time)

    def open(self, pack_id: str, place: Place) -> None:
        self.packs[pack_id] = _Seats(place)

    def forget(self, pack_id: str) -> None:
        """A pack whose server died: its trials are seated nowhere."""
        for key in self.packs.pop(pack_id, _Seats(Place("", ""))).keys:
            self.seat_of.pop(key, None)

    def count(self, place: Place) -> int:
        return sum(1 for p in self.packs.values() if p.place == place)

    def place(
        self,
        key: str,
        place: Place,
        actor: str,
        shape: PromptShape = PromptShape(),
        *,
        exact: bool = False,
    ) -> tuple[str | None, list[tuple]]:
        """Seat trial ``key`` (run by Tune actor ``actor``) in the pack of ``place`` with a
        free slot where its ``shape`` adds the least padding, the fullest first among equals;
        with ``exact``, only where it adds none. Returns ``(pack id, None: no such slot)`` and
        the stale seats it freed ``[(pack id, key)]``: an earlier run of this trial
        (restarted), or the trial the same actor ran before (a reused actor runs one trial at
        a time)."""
        stale = []
        for old in {key, self.trial_of.get(actor)} - {None}:
            pack_id = self.release(old)
            if pack_id is not None:
                stale.append((pack_id, old))
        self.trial_of[actor] = key
        free = [
            (p.padding_added(shape), -len(p.keys), pid)
            for pid, p in self.packs.items()
            if p.place == place and len(p.keys) < self.capacity
        ]
        free = [f for f in free if f[0] == 0] if exact else free
        if not free:
            return None, stale
        pack_id = min(free)[2]  # least padding; among equals the fullest: packs fill first
        self.sit(key, pack_id, shape)
        return pack_id, stale

    def sit(self, key: str, pack_id: str, shape: PromptShape = PromptShape()) -> None:
        self.packs[pack_id].keys[key] = shape
        self.seat_of[key] = pack_id

    def release(self, key: str, pack_id: str | None = None) -> str | None:
        """Free the trial's seat (only if in ``pack_id``, when given); its pack's id."""
        seated = self.seat_of.get(key)
        if seated is None or (pack_id is not None and seated != pack_id):
            return None
        del self.seat_of[key]
        self.packs[seated].keys.pop(key, None)
        return seated


# ----------------------------------------------------------------------------- Ray actors


class PackRegistry:
    """The search's pack servers, and which trial sits in which (a threaded Ray actor)."""

    def __init__(self, cfg: ExperimentConfig, data_ref: list, dims: BackboneDims):
        self.cfg, self.data_ref, self.dims = cfg, data_ref, dims
        self.capacity = cfg.resources.trials_per_worker
        self.threads = pack_threads(cfg)
        self.book = PackBook(self.capacity)
        self.servers: dict[str, Any] = {}
        self.cond = threading.Condition()

    def assign(self, key: str, place: Place, actor: str, method: MethodConfig) -> tuple[str, Any]:
        """A seat for trial ``key`` (its ``method`` config gives its prompt shape): ``(pack
        id, server)``. While the node has room for another pack, only a slot where the trial
        adds no padding; else a new server. Once the node is covered by packs, the slot that
        adds the least padding; a new server only where none is free after
        :data:`SEAT_WAIT_S` (a slot must be about to free)."""
        shape = PromptShape.of(method, self.dims)
        fit = self._packs_fit(place.node)  # the node's resources: asked once, not per wait
        deadline, stale = time.monotonic() + SEAT_WAIT_S, []
        with self.cond:
            while True:
                covered = self.book.count(place) >= fit
                pack_id, freed = self.book.place(key, place, actor, shape, exact=not covered)
                stale += freed
                if pack_id is None:
                    if not covered or time.monotonic() >= deadline:
                        pack_id = self._open(key, place, shape)
                if pack_id is not None:
                    break
                self.cond.wait(0.2)
            for old_pack, old_key in stale:
                # the same trial again in the same pack replaces its earlier run there
                if (old_pack, old_key) != (pack_id, key) and old_pack in self.servers:
                    self.servers[old_pack].leave.remote(old_key)
            return pack_id, self.servers[pack_id]

    def leave(self, key: str) -> None:
        """Trial ``key`` ended (it told its server too): its seat is free. Called by the
        trial's own process, so a reused actor's next trial is seated after it left."""
        with self.cond:
            self.book.release(key)
            self.cond.notify_all()

    def release(self, key: str, pack_id: str) -> None:
        """A server freed the trial's slot (finished, diverged, refused, gone)."""
        with self.cond:
            self.book.release(key, pack_id)
            self.cond.notify_all()

    def forget(self, pack_id: str) -> None:
        """A server that died: its trials restart (from their checkpoints) elsewhere."""
        with self.cond:
            self.book.forget(pack_id)
            self.servers.pop(pack_id, None)
            self.cond.notify_all()

    def close(self) -> None:
        """End every pack server (the search is over)."""
        with self.cond:
            for server in self.servers.values():
                ray.kill(server)
            self.servers.clear()

    def _packs_fit(self, node: str) -> int:
        """How many packs the trials one node holds at once fill."""
        resources = next(
            (n["Resources"] for n in ray.nodes() if n.get("NodeID") == node and n.get("Alive")),
            {},
        )
        return math.ceil(trials_on(resources, self.cfg) / self.capacity)

    def _open(self, key: str, place: Place, shape: PromptShape) -> str:
        """Start a pack server on the trial's node, and seat the trial in it."""
        pack_id = f"pack-{uuid.uuid4().hex[:8]}"
        options: dict[str, Any] = {
            "num_cpus": 0,  # its members hold the worker's CPUs and GPUs
            "max_concurrency": 2 * self.capacity + 8,  # members block in calls on it
            "scheduling_strategy": NodeAffinitySchedulingStrategy(place.node, soft=False),
        }
        if place.gpus:  # it asks for no GPU: it sees the node's GPUs and trains on theirs
            options["runtime_env"] = {"env_vars": {NOSET_CUDA: "1"}}
        me = ray.get_runtime_context().current_actor
        server = _RemoteServer.options(**options).remote(
            self.data_ref, self.capacity, pack_id, list(place.gpus), self.threads, me
        )
        self.servers[pack_id] = server
        self.book.open(pack_id, place)
        self.book.sit(key, pack_id, shape)
        return pack_id


# Ray leaves CUDA_VISIBLE_DEVICES alone in a worker that has this set
NOSET_CUDA = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"


class PackServer:
    """One pack on one node (a threaded Ray actor): trains its members in a
    :class:`~raypeft.training.pack_host.PackHost` and watches that their trials live."""

    def __init__(
        self, data_ref: list, capacity: int, pack_id: str, gpus: list, threads: int, registry
    ):
        task: TokenizedTask = ray.get(data_ref[0])
        device = gpu_device(gpus)
        self.pack_id, self.registry = pack_id, registry
        # where the pack trains: tagged on each member's run, as for an unpacked trial
        self.identity = {**worker_identity(device), "worker_gpu_ids": ",".join(gpus)}
        self.host = PackHost(
            task,
            capacity=capacity,
            device=device,
            pack_id=pack_id,
            threads=threads,
            on_leave=self._released,
        ).start()
        self.lock = threading.Lock()
        # trial key -> (its Tune actor, a pending ping, the actor's id)
        self.watched: dict[str, tuple[Any, Any, str]] = {}
        threading.Thread(target=self._watch, name=f"{pack_id}-watch", daemon=True).start()

    def join(self, spec: MemberSpec, actor, actor_id: str) -> dict:
        """Add the trial run by Tune actor ``actor`` (raises ``PackRefused`` when it cannot
        join); where it trains. A Tune actor runs one trial at a time: the trial it ran
        before (reused for this one) leaves first."""
        with self.lock:
            before = [k for k, (_, _, a) in self.watched.items() if a == actor_id]
            for key in before:
                del self.watched[key]
        for key in before:
            if key != spec.key:
                self.host.leave(key)
        self.host.join(spec)
        with self.lock:
            self.watched[spec.key] = (actor, actor.__ray_ready__.remote(), actor_id)
        return self.identity

    def next_report(self, key: str) -> MemberReport:
        return self.host.next_report(key)

    def leave(self, key: str) -> None:
        self.host.leave(key)

    def _released(self, key: str) -> None:
        self.registry.release.remote(key, self.pack_id)

    def _watch(self) -> None:
        """A member whose trial's actor died leaves (its trial will not ask again).

        Each member's actor has one ``__ray_ready__`` call pending: Tune's actors run one
        call at a time, so it waits while the trial trains, returns between two of Tune's
        calls (then another is sent), and fails with ``ActorDiedError`` once the actor is
        dead. A stopped trial whose actor Tune keeps for reuse stays alive: it leaves when
        Tune resets the actor for the next trial (its ``tune.report`` raises).

        A check that fails otherwise is told apart deliberately. An actor Ray calls
        unavailable (``ActorUnavailableError``: "temporarily unavailable but may be
        available later"; one that never comes back is declared dead) is asked again, as
        often as it takes. Any other failure counts: once a member's checks failed
        :data:`WATCH_TRIES` times in a row (seconds apart, so a passing hiccup has cleared),
        the failure is taken as permanent and the member fails with it: its trial's next
        report raises the reason, which reaches Tune's trial error and the summary, instead
        of the member holding its slot unwatched and the search hanging in silence."""
        failed: dict[str, int] = {}  # member -> its checks that failed in a row
        while True:
            time.sleep(WATCH_EVERY_S)
            serving = set(self.host.keys())
            with self.lock:
                for key in [k for k in self.watched if k not in serving]:
                    del self.watched[key]
                pings = dict(self.watched)
            for key in [k for k in failed if k not in pings]:
                del failed[key]
            for key, watched in pings.items():
                try:
                    self._check(key, *watched)
                except Exception as exc:  # noqa: BLE001 - counted; the member fails at the limit
                    failed[key] = failed.get(key, 0) + 1
                    if failed[key] >= WATCH_TRIES:
                        self._give_up(key, exc)
                        del failed[key]
                else:
                    failed.pop(key, None)

    def _give_up(self, key: str, exc: Exception) -> None:
        """The member's trial fails with why its checks failed (it leaves the pack)."""
        with self.lock:
            self.watched.pop(key, None)
        if isinstance(exc, RayTaskError) and exc.cause is not None:
            exc = exc.cause  # what the call raised, not Ray's wrapper with its traceback
        text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        why = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        self.host.fail(
            key,
            RuntimeError(
                f"pack {self.pack_id} lost track of trial {key}: checking that its Ray actor "
                f"lives failed {WATCH_TRIES} times in a row ({why})"
            ),
        )

    def _check(self, key: str, actor, ping, actor_id: str) -> None:
        """Whether the trial's actor answered its ping; ``ActorDiedError``: it left. Another
        failure of the ping is raised, after the next ping is sent (the next check asks
        afresh); an actor unavailable for a moment is simply asked again."""
        ready, _ = ray.wait([ping], timeout=0)
        if not ready:
            return
        error = None
        try:
            ray.get(ping)
        except ActorDiedError:
            self.host.leave(key)
            return
        except ActorUnavailableError:  # transient by Ray's own word: ask again
            pass
        except RayError as exc:
            error = exc
        with self.lock:
            if key in self.watched:
                self.watched[key] = (actor, actor.__ray_ready__.remote(), actor_id)
        if error is not None:
            raise error


_RemoteServer = ray.remote(PackServer)
_RemoteRegistry = ray.remote(PackRegistry)


def pack_threads(cfg: ExperimentConfig) -> int:
    """Torch threads of a pack: its worker's CPUs (``train.num_threads`` if set)."""
    return cfg.train.num_threads or max(1, int(cfg.resources.cpus_per_worker))


@contextlib.contextmanager
def open_packs(cfg: ExperimentConfig, data_ref, dims: BackboneDims) -> Iterator[Any]:
    """The search's pack registry while a Tune experiment runs (None: trials do not pack);
    its pack servers end with it. ``dims``: the backbone's, to resolve each trial's prompt
    shape."""
    if cfg.resources.trials_per_worker == 1:
        yield None
        return
    registry = _RemoteRegistry.options(num_cpus=0, max_concurrency=64).remote(cfg, [data_ref], dims)
    try:
        yield registry
    finally:
        with contextlib.suppress(RayError):
            ray.get(registry.close.remote(), timeout=30)
        ray.kill(registry)


# ----------------------------------------------------------------------------- member trials


@dataclass
class Seat:
    """A trial's place in a pack: it relays the server's reports to Tune."""

    registry: Any
    server: Any
    pack_id: str
    key: str
    identity: dict  # where the pack trains

    def relay(self, sampled) -> None:
        """Report to Tune what the pack reports for this trial, until its trial ends (its
        last step, divergence, or Tune stopping it: then ``tune.report`` raises)."""
        try:
            while True:
                # asking for the next report tells the server Tune accepted the last one
                report: MemberReport = ray.get(self.server.next_report.remote(self.key))
                if report.metrics is None:  # resumed at its last step: nothing left to do
                    return
                folder = report.folder
                checkpoint = tune.Checkpoint.from_directory(folder) if folder else None
                tune.report({**report.metrics, **self.identity, **sampled()}, checkpoint=checkpoint)
                if report.final:
                    return
        except ActorDiedError:  # the server died: the trial fails, and Ray restarts it
            self.registry.forget.remote(self.pack_id)
            raise
        finally:
            self.leave()

    def leave(self) -> None:
        """Out of the pack (the server frees the slot and the last checkpoint folder) and
        out of the registry's book, before this process can run another trial."""
        with contextlib.suppress(RayError, GetTimeoutError):
            self.server.leave.remote(self.key)
            ray.get(self.registry.leave.remote(self.key), timeout=LEAVE_TIMEOUT_S)


def take_seat(registry, key: str, cfg: ExperimentConfig, resume_from: Path | None) -> Seat | None:
    """Join a pack of this node (``resume_from``: the trial's checkpoint, read before this
    returns); None when the pack refuses the configuration (it then trains alone)."""
    context = ray.get_runtime_context()
    gpus = tuple(str(i) for i in ray.get_gpu_ids())
    place = Place(backbone_group(cfg), context.get_node_id(), gpus)
    spec = MemberSpec(key, cfg, resume_from)
    retried = False
    while True:
        assigned = registry.assign.remote(key, place, context.get_actor_id(), cfg.method)
        pack_id, server = ray.get(assigned)
        try:
            actor = context.current_actor
            identity = ray.get(server.join.remote(spec, actor, context.get_actor_id()))
            return Seat(registry, server, pack_id, key, identity)
        except RayTaskError as err:
            if not isinstance(err.cause, PackRefused):
                raise  # building the trial failed: it fails, as it would alone
            ray.get(registry.leave.remote(key))
            return None
        except ActorDiedError:  # a server that died: forgotten, and one more try
            ray.get(registry.forget.remote(pack_id))
            if retried:
                raise
            retried = True


def trial_in_pack(config: dict, *, base: dict, data_ref: list, threads: int, packs: list) -> None:
    """Tune function trainable of a packed trial: one configuration, trained in a pack of
    its node, reporting as an unpacked trial does; alone when no pack takes it."""
    cfg = trial_config(ExperimentConfig.model_validate(base), config)
    key = tune.get_context().get_trial_id()
    # a trial Tune restarts (`raypeft tune --resume`, a dead worker) continues from its
    # latest checkpoint, as alone
    with _checkpoint_folder(tune.get_checkpoint()) as resume_from:
        seat = take_seat(packs[0], key, cfg, resume_from)
    if seat is None:  # its method or backbone cannot share this pack: trains alone
        share = max(1, threads // cfg.resources.trials_per_worker)
        trial_in_process(config, base=base, data_ref=data_ref, threads=share)
        return
    sampled = sampler_for(cfg.tracking)  # MLflow system metrics of the node
    with sampled:
        seat.relay(sampled)


def packed_trainable(cfg: ExperimentConfig, data_ref: ray.ObjectRef, registry):
    """The Tune trainable of a packed trial: 1/K of a worker's CPUs and GPUs."""
    wrapped = tune.with_parameters(
        trial_in_pack,
        base=cfg.model_dump(mode="json"),
        data_ref=[data_ref],
        threads=pack_threads(cfg),
        packs=[registry],
    )
    return tune.with_resources(wrapped, trial_request(cfg))
