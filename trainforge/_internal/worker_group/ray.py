"""Workers as Ray actors, for runs on a Ray cluster (``ScalingConfig(executor="ray")``, or "auto" with
``ray.init()`` called or ``$RAY_ADDRESS`` set).

A group is one placement group, one bundle per worker (``resources_per_worker``: 1 CPU by default,
plus GPUs and custom resources, with ``placement_strategy``), and one actor per bundle; rank r is
bundle r. Each actor's long-running method runs trainforge's worker command loop
(``worker_main.run_in_actor``): it connects back over TCP to the driver's listener, which binds to
the driver's Ray node IP (``ray.util.get_node_ip_address()``; 127.0.0.1 for a cluster whose nodes
run on 127.0.0.1, as in the tests), and its fds 1 and 2 become sockets to the driver, which prints
their lines with the rank prefix and writes ``logs/rank_N.log`` as for local workers. The messaging
is :class:`SocketWorkerGroup`'s, shared with local processes.

Node rank = the order in which nodes first appear among the ranks; local rank and local world size
count the ranks on each node; MASTER_ADDR is rank 0's node IP; CUDA_VISIBLE_DEVICES the GPUs Ray
assigned to the actor.

Death: the control socket closes, or the actor method's ObjectRef fails (checked with
``ray.wait(timeout=0)`` at every poll); the failure carries Ray's reason (worker process died, node
died) and the node's address. Stacks of a hung worker: the worker's reader thread answers a "stacks"
command with ``faulthandler.dump_traceback(all_threads=True)``. Shutdown: exit command, bounded
wait, ``ray.kill`` of every actor (and, on the driver's node, of the processes they started), then
the placement group is removed. A restart is a new group: new actors in a new placement group.

Requests the cluster can never hold fail before any actor starts, and requests that fit but wait
are logged (ray_placement.py). A local storage path with workers on other machines than the driver
is a ``ValueError`` before training. ``ray.data.Dataset`` inputs: ray_data.py.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import IO, Any

import ray

from trainforge._internal import constants
from trainforge._internal.config import ScalingConfig
from trainforge._internal.exceptions import WorkerFailure, WorkerStartError
from trainforge._internal.log_streaming import LogStreamer
from trainforge._internal.process_tree import kill_and_reap
from trainforge._internal.worker_group.api import Executor, WorkerGroup, WorkerMetadata, WorkerSpec
from trainforge._internal.worker_group.listener import WorkerListener
from trainforge._internal.worker_group.ray_placement import (
    bundle_of,
    check_feasible,
    free_resources,
    wait_placement_group,
)
from trainforge._internal.worker_group.socket_group import SocketWorkerGroup, WorkerHandle


# ------------------------------------------------------------------------------------------------
# The actor
# ------------------------------------------------------------------------------------------------
class _WorkerActor:
    """Runs in a Ray worker process. ``run`` is the worker: it returns only after the exit command."""

    def run(self, address: str, authkey: bytes, key: str, env: dict[str, str], preload: tuple[str, ...]) -> None:
        from trainforge._internal.worker_group.worker_main import run_in_actor

        context = ray.get_runtime_context()
        info = {
            "hostname": socket.gethostname(),
            "node_ip": ray.util.get_node_ip_address(),
            "node_id": context.get_node_id(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "boot_id": _boot_id(),
        }
        run_in_actor(address, authkey, key, env, preload, info)


def _boot_id() -> str:
    """This machine's boot id: equal on driver and worker means the worker's pid is ours to watch."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


_remote_actor_cls: Any = None


def _actor_cls() -> Any:
    global _remote_actor_cls
    if _remote_actor_cls is None:
        _remote_actor_cls = ray.remote(_WorkerActor)
    return _remote_actor_cls


# ------------------------------------------------------------------------------------------------
# Failures
# ------------------------------------------------------------------------------------------------
@dataclass
class RayWorkerFailure(WorkerFailure):
    """A Ray worker that died: there is no exit status to show, so Ray's reason takes its place."""

    node: str = ""

    def exit_description(self) -> str:
        if self.exit_code is not None:
            return super().exit_description()
        return f"the Ray actor died on node {self.node}: {self.message}" if self.node else self.message


def death_reason(exc: BaseException) -> str:
    """The useful part of a Ray ActorDiedError: why the actor is dead (worker process died, node
    died, killed), without the class/actor-id preamble and the list of common causes."""
    text = getattr(exc, "error_msg", None) or str(exc)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    body = [ln for ln in lines if not ln.startswith(("class_name:", "actor_id:", "pid:", "namespace:", "ip:"))]
    if body and body[0].startswith("The actor died unexpectedly before finishing this task"):
        body = body[1:] or body
    reason = " ".join(body) or type(exc).__name__
    for cut in (" Some common causes", " The actor never ran"):
        reason = reason.split(cut)[0]
    return reason.strip()


# ------------------------------------------------------------------------------------------------
# The group
# ------------------------------------------------------------------------------------------------
class RayWorker(WorkerHandle):
    def __init__(self, spec: WorkerSpec, key: str, actor: Any):
        super().__init__()
        self.spec = spec
        self.key = key
        self.actor = actor
        self.ref: Any = None  # the ObjectRef of actor.run(): fails when the actor dies
        self.info: dict[str, Any] = {}

    @property
    def pid(self) -> int:
        return int(self.info.get("pid", -1))

    @property
    def node(self) -> str:
        ip, node_id = self.info.get("node_ip", "?"), str(self.info.get("node_id", "?"))
        return f"{ip} (id {node_id[:12]})"


class RayWorkerGroup(SocketWorkerGroup):
    """One attempt's actors. ``storage_is_local``: the run directory is a local path, so every worker
    must run on the driver's machine."""

    def __init__(
        self,
        scaling: ScalingConfig,
        listener: WorkerListener,
        attempt: int,
        spawn_env: dict[str, str],
        log_dir: str | None,
        log_to_driver: bool,
        storage_is_local: bool,
    ):
        super().__init__(log_dir, log_to_driver)
        self._scaling = scaling
        self._listener = listener
        self._attempt = attempt
        self._spawn_env = spawn_env
        self._storage_is_local = storage_is_local
        self._pg: Any = None
        self.freeing: dict[str, float] = {}  # Ray's view once this group's resources are free again

    # -- starting ---------------------------------------------------------------------------------
    def _launch(self, specs: list[WorkerSpec], preload: tuple[str, ...]) -> None:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        n, bundle, strategy = len(specs), bundle_of(self._scaling), self._scaling.placement_strategy
        self._pg = placement_group([dict(bundle) for _ in range(n)], strategy=strategy)
        wait_placement_group(self._pg, n, bundle, strategy)
        self._check_storage_reachable()
        custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
        cls = _actor_cls()
        for spec in specs:
            key = self._listener.new_key()
            actor = cls.options(
                num_cpus=bundle.get("CPU", 0),
                num_gpus=bundle.get("GPU", 0),
                resources=custom,
                max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self._pg, placement_group_bundle_index=spec.rank
                ),
            ).remote()
            w = RayWorker(spec, key, actor)
            self._workers.append(w)
            self._listener.expect(key, self._on_hello(w), self._on_output(w))
            w.ref = actor.run.remote(self._listener.address, self._listener.authkey, key, self._spawn_env, preload)
        self._wait_connected()
        nodes = [str(w.info.get("node_id")) for w in self._workers]
        master = str(self._workers[0].info.get("node_ip", "127.0.0.1"))
        gpus = [list(w.info.get("gpu_ids", [])) for w in self._workers]
        from trainforge._internal.worker_group.env import place_specs

        place_specs(specs, nodes, self._attempt, master, self._scaling, gpus)

    def _on_hello(self, w: RayWorker) -> Any:
        def on_hello(conn: Any, info: dict[str, Any]) -> None:
            w.info = info
            w.conn = conn

        return on_hello

    def _on_output(self, w: RayWorker) -> Any:
        def on_output(target: str, stream: IO[bytes]) -> None:
            w.streamers.append(LogStreamer(stream, target))

        return on_output

    def _wait_connected(self) -> None:
        timeout = constants.worker_start_timeout_s()
        deadline = time.monotonic() + timeout
        workers = self._workers
        while not self._listener.wait_for(lambda: all(w.conn is not None for w in workers), 0.2):
            dead = self._exited([w for w in workers if w.conn is None])
            if dead:
                w = workers[min(dead)]
                raise WorkerStartError(f"Ray worker rank {w.rank} died during start-up: {self._reason(w)}")
            if time.monotonic() > deadline:
                missing = [w.rank for w in workers if w.conn is None]
                raise WorkerStartError(
                    f"Ray workers {missing} did not connect to the driver at {self._listener.address} within "
                    f"{timeout:.0f}s. The driver listens on its Ray node IP: check that the worker nodes can "
                    f"reach it, or raise ${constants.ENV_START_TIMEOUT_S} if the cluster is slow."
                )
        for w in workers:
            self._listener.forget(w.key)

    def _check_storage_reachable(self) -> None:
        """A local storage path works only if every worker shares the driver's machine."""
        if not self._storage_is_local:
            return
        from ray.util import placement_group_table

        table = placement_group_table(self._pg)
        by_id = {n["NodeID"]: n for n in ray.nodes()}
        hosts = {socket.gethostname()}
        for node_id in table.get("bundles_to_node_id", {}).values():
            node = by_id.get(node_id, {})
            hosts.add(node.get("NodeManagerHostname") or node.get("NodeManagerAddress") or node_id)
        if len(hosts) > 1:
            raise ValueError(
                f"RunConfig.storage_path is a local path, but the Ray workers run on other machines "
                f"({sorted(hosts)}) that cannot see the driver's disk. Use a path every node shares (NFS) "
                "or an fsspec URL (e.g. s3://bucket/prefix)."
            )

    def _metadata(self, w: RayWorker) -> WorkerMetadata:
        assert w.spec is not None
        return WorkerMetadata(
            w.rank, w.spec.local_rank, w.spec.node_rank, w.pid, str(w.info.get("hostname", "")),
            str(w.info.get("node_ip", "")), list(w.spec.gpu_ids),
        )  # fmt: skip

    @property
    def reserved(self) -> dict[str, float]:
        """What this group's placement group holds (until shutdown removes it)."""
        if self._pg is None or self._shutdown_done:
            return {}
        return {k: v * len(self._workers) for k, v in bundle_of(self._scaling).items()}

    # -- deaths -----------------------------------------------------------------------------------
    def _exited(self, workers: list[RayWorker]) -> set[int]:
        refs = [w.ref for w in workers if w.ref is not None]
        if not refs:
            return set()
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        done = {r.hex() for r in ready}
        return {w.rank for w in workers if w.ref is not None and w.ref.hex() in done}

    def _await_exit(self, w: RayWorker, timeout: float) -> None:
        if w.ref is not None:
            ray.wait([w.ref], timeout=max(0.0, timeout), fetch_local=False)

    def _reason(self, w: RayWorker) -> str:
        if w.ref is None:
            return "it was never started"
        ready, _ = ray.wait([w.ref], timeout=0, fetch_local=False)
        if not ready:
            return "its connection to the driver closed (Ray reports no cause yet)"
        try:
            ray.get(w.ref)
        except Exception as exc:  # the actor's death, as Ray describes it
            return death_reason(exc)
        return "its worker loop ended without the exit command"

    def _death(self, w: RayWorker) -> WorkerFailure:
        if w.ref is not None:
            # A lost node takes Ray a moment to declare; its verdict is the useful part.
            ray.wait([w.ref], timeout=5.0, fetch_local=False)
        return RayWorkerFailure(
            rank=w.rank,
            pid=w.pid,
            kind="died",
            message=self._reason(w),
            log_tail="".join(list(w.tail)[-40:]),
            time=time.time(),
            node=w.node,
        )

    # -- stacks -----------------------------------------------------------------------------------
    def dump_stacks(self, rank: int, timeout: float = 3.0) -> str:
        return self._request_stacks(rank, timeout)

    # -- stopping ---------------------------------------------------------------------------------
    def _stop(self, running: list[RayWorker], grace: float) -> None:
        """``ray.kill`` every actor. Workers on this machine (any node of it) are also watched as
        processes: we return once they are gone, and the processes they started are killed too
        (Ray kills the actor's process, not its children)."""
        import psutil

        local, children = self._local_processes()
        kill_actors([w.actor for w in self._workers], timeout=10)
        _gone, alive = psutil.wait_procs(local, timeout=5)
        kill_and_reap(alive + children, timeout=5)

    def _local_processes(self) -> tuple[list[Any], list[Any]]:
        """The worker processes on this machine and their descendants."""
        import psutil

        workers, children = [], []
        here = _boot_id()
        for w in self._workers:
            if not here or w.info.get("boot_id") != here or w.pid <= 0:
                continue
            try:
                proc = psutil.Process(w.pid)
                workers.append(proc)
                children += proc.children(recursive=True)
            except psutil.Error:
                pass
        return workers, children

    def _release(self) -> None:
        for w in self._workers:
            self._listener.forget(w.key)
        if self._pg is not None:
            from ray.util.placement_group import remove_placement_group

            held = {k: v * len(self._workers) for k, v in bundle_of(self._scaling).items()}
            try:
                before = free_resources(ray.available_resources())
                remove_placement_group(self._pg)
            except Exception:  # the cluster is going away
                return
            # Ray's resource view catches up a moment later: until then this group still counts as
            # room (for the next sizing decision), see :meth:`RayExecutor.available`.
            self.freeing = {k: before.get(k, 0.0) + v for k, v in held.items()}


def kill_actors(actors: list[Any], timeout: float) -> None:
    """``ray.kill`` the actors and wait (up to ``timeout``) until Ray reports them dead: a call to a
    killed actor fails once its process is gone."""
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # already dead
            pass
    probes = []
    for actor in actors:
        try:
            probes.append(actor.__ray_ready__.remote())
        except Exception:
            pass
    if probes:
        ray.wait(probes, num_returns=len(probes), timeout=timeout, fetch_local=False)


# ------------------------------------------------------------------------------------------------
# The executor
# ------------------------------------------------------------------------------------------------
class RayExecutor(Executor):
    """Connects to Ray (``ray.init()`` if needed), checks the request against the cluster, and makes
    one :class:`RayWorkerGroup` per attempt."""

    name = "ray"

    def __init__(self, scaling: ScalingConfig, preload: tuple[str, ...], log_dir: str | None, log_to_driver: bool,
                 storage: Any):  # fmt: skip
        from trainforge._internal import ray_utils
        from trainforge._internal.worker_group.env import spawn_env

        ray_utils.ensure_connected()
        check_feasible(scaling, scaling.min_workers)
        self.scaling = scaling
        self._preload = preload
        self._log_dir = log_dir
        self._log_to_driver = log_to_driver
        self._storage_is_local = getattr(storage, "fs", None) is None
        self._spawn_env = spawn_env(scaling)
        self._listener = WorkerListener(ray.util.get_node_ip_address())
        self._attempt = 0
        self._group: RayWorkerGroup | None = None
        self._data_coordinators: list[Any] = []
        self._data_attempt = -1

    def make_specs(self, attempt: int, n: int) -> list[WorkerSpec]:
        self._attempt = attempt
        return [WorkerSpec(rank, rank, n, 0, n) for rank in range(n)]  # placed by the group

    def make_group(self) -> WorkerGroup:
        self._group = RayWorkerGroup(self.scaling, self._listener, self._attempt, self._spawn_env, self._log_dir,
                                     self._log_to_driver, self._storage_is_local)  # fmt: skip
        return self._group

    def available(self) -> dict[str, float]:
        """Ray's free resources, plus what the run's current group holds (room for itself). After a
        group was stopped, wait (up to 3 s) for Ray's view to show its resources free again."""
        group = self._group
        if group is not None and group.freeing:
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                free = free_resources(ray.available_resources())
                if all(free.get(k, 0.0) >= v - 1e-6 for k, v in group.freeing.items()):
                    break
                time.sleep(0.05)
            group.freeing = {}
        free = free_resources(ray.available_resources())
        for k, v in (group.reserved if group is not None else {}).items():
            free[k] = free.get(k, 0.0) + v
        return free

    def split_ray_dataset(self, name: str, dataset: Any, n: int, split: bool) -> list[Any]:
        from trainforge._internal.worker_group.ray_data import split_dataset

        if self._data_attempt != self._attempt:
            self._release_data()  # the previous attempt's splits are done with
            self._data_attempt = self._attempt
        shards, coordinators = split_dataset(name, dataset, n, split)
        self._data_coordinators += coordinators
        return shards

    def _release_data(self) -> None:
        kill_actors(self._data_coordinators, timeout=10)
        self._data_coordinators = []

    def close(self) -> None:
        self._release_data()
        self._listener.close()
