"""The scheduling decision: (tasks, nodes, quotas, now, config) -> starts, preemptions, reasons.

One call is one tick of HAI's assigner + matcher, as a pure function (no I/O, no clock: ``now``
comes in).  The rules, in the order they are applied:

1. Waiting runs are taken by priority (highest first), then FIFO by their chain's first submission
   (a resumed run keeps its place, as HAI sorts by ``first_id``), then by run id.
2. Allocation is by whole nodes and all or nothing (gang): a run starts with every node it asked for
   or not at all.
3. A run is packed inside one zone when it fits there now (best fit: the zone with the fewest free
   nodes that still holds it, so large holes stay whole); otherwise it may span zones, but at most
   one running run spans zones (paper §III-B), and never when the spec pins a zone.
4. When the free nodes do not suffice, a run may preempt running runs of lower priority (and, with
   ``preempt_equal_priority``, later-submitted runs of its own priority and another user), never a
   run of the same user and priority, and never one younger than its minimum runtime.  Victims are
   taken lowest priority first, then newest first.  An ABOVE_NORMAL run counts as NORMAL once it has
   run ``demote_above_normal_s`` (HAI's documented demotion).
5. Preempted runs keep their nodes until their agents release them (the node view's ``task``
   clears); meanwhile those nodes are *releasing*.  The run that preempted them reserves them (and
   the free nodes it needs beside them), so nothing else is started there, in this cycle or the
   next: once released they are free and it, being first in the order, gets them.  A run that
   finds enough releasing nodes for it (from an earlier cycle's preemption) waits for them instead
   of preempting more.
6. Quotas: a run starts at priority p in node group g only while its user, and its shared group,
   hold no more than their quota at (g, p) with it; a run is charged at the level it was admitted at.
   An expired entry counts as absent (the default quota applies).
7. Drained nodes get no new work (their running runs keep going until they end or are preempted,
   as Slurm's drain does; a drained node freed by a victim is not counted as coming free).

AUTO: HAI gives an AUTO task "the highest priority level that still has quota".  We resolve it when
the run is considered: the highest level at which an explicit quota entry of its user (or shared
group) in its node group has room for it; with no such entry, ``config.auto_fallback`` (LOW by
default, the level of HAI's external users) under the default quota.  The run keeps the level it
started at; the next run of the chain resolves again.

Lower-priority runs may start on free nodes a blocked higher-priority run could not use
(backfill); a blocked run that preempted nothing reserves nothing.  Every waiting run that does not
start gets one :class:`Reason`: a code and a one-line message.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence

import msgspec

from fireflyer.sched.model import (
    DRAINED,
    LEVELS,
    NodeView,
    Priority,
    Quota,
    SchedConfig,
    Task,
    TaskSpec,
)

__all__ = [
    "Start", "Preempt", "Reason", "Decision", "decide", "effective_priority", "resolve_auto",
    "UNKNOWN_GROUP", "INVALID", "TOO_LARGE", "DRAINED_NODES", "ZONE_RULE", "OVER_QUOTA",
    "NOT_ENOUGH_NODES", "WAITING_RELEASE", "REASON_CODES", "QuotaBook",
]

UNKNOWN_GROUP = "unknown_group"
INVALID = "invalid"
TOO_LARGE = "too_large"
DRAINED_NODES = "drained"
ZONE_RULE = "zone_rule"
OVER_QUOTA = "over_quota"
NOT_ENOUGH_NODES = "not_enough_nodes"
WAITING_RELEASE = "waiting_release"
REASON_CODES = (UNKNOWN_GROUP, INVALID, TOO_LARGE, DRAINED_NODES, ZONE_RULE, OVER_QUOTA, NOT_ENOUGH_NODES,
                WAITING_RELEASE)


class Start(msgspec.Struct, frozen=True, kw_only=True):
    """Start run ``task`` on ``nodes`` (rank order) at ``priority`` (AUTO resolved)."""

    task: int
    nodes: tuple[str, ...]
    priority: Priority
    zones: tuple[str, ...]


class Preempt(msgspec.Struct, frozen=True, kw_only=True):
    """Interrupt running run ``task`` so that run ``for_task`` (at ``for_priority``) gets its nodes."""

    task: int
    for_task: int
    for_priority: Priority
    reason: str


class Reason(msgspec.Struct, frozen=True, kw_only=True):
    """Why a waiting run did not start this cycle (HAI's ``scheduler_msg``)."""

    code: str
    message: str


class Decision(msgspec.Struct, kw_only=True):
    starts: list[Start] = msgspec.field(default_factory=list)
    preempts: list[Preempt] = msgspec.field(default_factory=list)
    waiting: dict[int, Reason] = msgspec.field(default_factory=dict)


def effective_priority(task: Task, now: float, config: SchedConfig) -> int:
    """The level a running run defends itself with: its admitted level, ABOVE_NORMAL demoted to
    NORMAL after ``demote_above_normal_s`` of running."""
    p = task.priority if task.priority is not None else task.spec.priority
    if (p == Priority.ABOVE_NORMAL and task.started_at is not None
            and now - task.started_at >= config.demote_above_normal_s):
        return int(Priority.NORMAL)
    return int(p)


class QuotaBook:
    """Quota limits and the nodes charged against them during one decision."""

    def __init__(self, quotas: Iterable[Quota], default: int | None, now: float) -> None:
        self.limits: dict[tuple[str, str, int], int] = {}
        # which levels each (owner, group) has an explicit entry for, highest first (for AUTO)
        levels: dict[tuple[str, str], set[int]] = defaultdict(set)
        for q in quotas:
            if q.expires_at is not None and q.expires_at <= now:
                continue
            self.limits[(q.owner, q.group, int(q.priority))] = q.max_nodes
            levels[(q.owner, q.group)].add(int(q.priority))
        self.levels = {k: sorted(v, reverse=True) for k, v in levels.items()}
        self.default = default
        self.used: dict[tuple[str, str, int], int] = defaultdict(int)

    def _owners(self, spec: TaskSpec) -> tuple[str, ...]:
        return (spec.user, spec.shared_group) if spec.shared_group else (spec.user,)

    def charge(self, spec: TaskSpec, priority: int, nodes: int) -> None:
        for owner in self._owners(spec):
            self.used[(owner, spec.group, priority)] += nodes

    def refusal(self, spec: TaskSpec, priority: int, nodes: int) -> str | None:
        """None if ``nodes`` more fit the quotas of ``spec``'s user at ``priority``, else why not."""
        explicit = False
        for owner in self._owners(spec):
            key = (owner, spec.group, priority)
            limit = self.limits.get(key)
            if limit is None:
                continue
            explicit = True
            if self.used[key] + nodes > limit:
                return (f"{owner} holds {self.used[key]} of its {limit}-node quota at "
                        f"{Priority(priority).name} in group {spec.group}; this run needs {nodes}")
        if not explicit and self.default is not None:
            key = (spec.user, spec.group, priority)
            if self.used[key] + nodes > self.default:
                return (f"{spec.user} holds {self.used[key]} of the default {self.default}-node quota at "
                        f"{Priority(priority).name} in group {spec.group}; this run needs {nodes}")
        return None

    def explicit_levels(self, spec: TaskSpec) -> list[int]:
        out: set[int] = set()
        for owner in self._owners(spec):
            out.update(self.levels.get((owner, spec.group), ()))
        return sorted(out, reverse=True)


def resolve_auto(spec: TaskSpec, book: QuotaBook, config: SchedConfig) -> int | None:
    """The level an AUTO run starts at now, or None when no level has quota for it (module doc)."""
    candidates = book.explicit_levels(spec)
    if int(config.auto_fallback) not in candidates:
        candidates.append(int(config.auto_fallback))
    for level in candidates:
        if level in _REAL_LEVELS and book.refusal(spec, level, spec.nodes) is None:
            return level
    return None


_REAL_LEVELS = frozenset(int(p) for p in LEVELS)


def _node_key(name: str) -> tuple[str, int, str]:
    # node2 before node10: pack runs onto neighbouring names (a stand-in for "same leaf switch")
    stem = name.rstrip("0123456789")
    digits = name[len(stem):]
    return (stem, int(digits) if digits else -1, name)


class _Group:
    """The nodes of one node group, by zone, as the cycle goes on."""

    def __init__(self) -> None:
        self.free: dict[str, list[str]] = defaultdict(list)  # zone -> free enabled nodes, name order
        self.releasing: dict[str, list[str]] = defaultdict(list)  # zone -> enabled nodes being released
        self.enabled: dict[str, int] = defaultdict(int)
        self.total = 0
        self.drained = 0
        self.drain_reasons: list[str] = []
        self.zone_of: dict[str, str] = {}  # enabled node -> zone (drained nodes never come free)
        self.protected = 0  # running runs not yet past their minimum runtime

        self.zone_list: list[str] = []
        self.max_enabled = 0
        # the "free by zone" text of reasons, rebuilt only when a free list changes (deep queues
        # give thousands of reasons against the same few counts)
        self.version = 0
        self._free_text: dict[tuple[str, ...], tuple[int, str]] = {}

    def seal(self) -> None:
        self.zone_list = sorted(self.enabled)
        self.max_enabled = max(self.enabled.values(), default=0)

    def free_text(self, zones: list[str]) -> str:
        key = tuple(zones)
        cached = self._free_text.get(key)
        if cached is None or cached[0] != self.version:
            cached = (self.version, ", ".join(f"{z or '-'}: {len(self.free[z])}" for z in zones))
            self._free_text[key] = cached
        return cached[1]


class _Victims:
    """Running, preemptible runs of one group in victim order: lowest level, then newest."""

    def __init__(self, runs: list[tuple[int, float, Task]], group: _Group) -> None:
        # (effective level, started_at, task); lowest level first, newest first, higher id first
        runs.sort(key=lambda r: (r[0], -r[1], -r[2].id))
        self.runs = runs
        self.taken: set[int] = set()
        # per run, how many of its nodes come free in each zone (drained ones never do)
        self.gain: dict[int, dict[str, int]] = {}
        for _, _, t in runs:
            per: dict[str, int] = defaultdict(int)
            for x in t.nodes:
                z = group.zone_of.get(x)
                if z is not None:
                    per[z] += 1
            self.gain[t.id] = per
        # per zone option, the runs with nodes there (indexes into runs) and where the untaken part
        # starts: victims are mostly taken in order, so a deep queue does not rescan the taken ones
        self._lists: dict[tuple[str, ...], list[int]] = {}
        self._first: dict[tuple[str, ...], int] = {}

    def gain_in(self, t: Task, option: tuple[str, ...]) -> int:
        per = self.gain[t.id]
        return sum(per.get(z, 0) for z in option)

    def candidates(self, option: tuple[str, ...]) -> Iterator[tuple[int, int, Task]]:
        """(level, nodes it frees in ``option``, run) of the untaken runs, in victim order."""
        idx = self._lists.get(option)
        if idx is None:
            idx = self._lists[option] = [i for i, r in enumerate(self.runs) if self.gain_in(r[2], option)]
            self._first[option] = 0
        first = self._first[option]
        while first < len(idx) and self.runs[idx[first]][2].id in self.taken:
            first += 1
        self._first[option] = first
        for k in range(first, len(idx)):
            level, _, t = self.runs[idx[k]]
            if t.id not in self.taken:
                yield level, self.gain_in(t, option), t


def decide(tasks: Sequence[Task], nodes: Sequence[NodeView], quotas: Iterable[Quota], now: float,
           config: SchedConfig | None = None) -> Decision:
    """One scheduling cycle (module doc).  Pure: the same inputs give the same decision."""
    config = config or SchedConfig()
    decision = Decision()

    # --- the nodes, by group and zone --------------------------------------------------------
    groups: dict[str, _Group] = defaultdict(_Group)
    node_zone: dict[str, str] = {}
    node_enabled: dict[str, bool] = {}
    holder: dict[str, int | None] = {}
    for n in sorted(nodes, key=lambda n: _node_key(n.name)):
        g = groups[n.group]
        g.total += 1
        node_zone[n.name] = n.zone
        holder[n.name] = n.task
        enabled = n.state != DRAINED
        node_enabled[n.name] = enabled
        if not enabled:
            g.drained += 1
            if n.reason and len(g.drain_reasons) < 3:
                g.drain_reasons.append(f"{n.name}: {n.reason}")
            continue
        g.enabled[n.zone] += 1
        g.zone_of[n.name] = n.zone
        if n.task is None:
            g.free[n.zone].append(n.name)
    groups = dict(groups)
    for g in groups.values():
        g.seal()

    # --- running runs: quota charges, the cross-zone slot, victims, releasing nodes -------------
    book = QuotaBook(quotas, config.default_quota, now)
    cross_zone: int | None = None
    victims_by_group: dict[str, list[tuple[int, float, Task]]] = defaultdict(list)
    for t in sorted((t for t in tasks if t.running), key=lambda t: t.id):
        level = int(t.priority if t.priority is not None else t.spec.priority)
        if level == int(Priority.AUTO):
            level = int(config.auto_fallback)
        book.charge(t.spec, level, len(t.nodes))
        if cross_zone is None and len({node_zone.get(n, "") for n in t.nodes}) > 1:
            cross_zone = t.id
        group = groups.get(t.spec.group)
        if t.releasing:
            if group is not None:
                for n in t.nodes:
                    if holder.get(n) == t.id and node_enabled.get(n, False):
                        group.releasing[node_zone[n]].append(n)
            continue
        protected_s = t.spec.min_runtime_s if t.spec.min_runtime_s is not None else config.min_runtime_s
        started = t.started_at if t.started_at is not None else now
        if now - started >= protected_s:
            victims_by_group[t.spec.group].append((effective_priority(t, now, config), started, t))
        elif group is not None:
            group.protected += 1
    victims = {g: _Victims(v, groups[g]) for g, v in victims_by_group.items() if g in groups}

    # --- waiting runs, in order --------------------------------------------------------------
    queue: list[tuple[int, float, int, Task, int | None]] = []
    for t in tasks:
        if not t.waiting:
            continue
        level: int | None = int(t.spec.priority)
        if level == int(Priority.AUTO):
            level = None  # resolved against the quotas when its turn comes
        # AUTO runs queue at the level they would get against what runs now; if the runs ahead of
        # them use that quota up meanwhile, they resolve lower when their turn comes
        order = level if level is not None else (resolve_auto(t.spec, book, config) or int(config.auto_fallback))
        queue.append((-order, t.submitted_at, t.id, t, level))
    queue.sort(key=lambda q: q[:3])

    # smallest size that already failed, per (group, pinned zone, level, user when it matters):
    # resources only shrink during a cycle, so anything as large fails too (keeps a deep queue O(n))
    failed_at: dict[tuple[str, str, int, str], tuple[int, str]] = {}

    for _, _, _, t, level in queue:
        spec = t.spec
        n = spec.nodes
        group = groups.get(spec.group)
        if n < 1:
            decision.waiting[t.id] = Reason(code=INVALID, message=f"asks for {n} nodes; a run needs at least 1")
            continue
        if group is None:
            decision.waiting[t.id] = Reason(code=UNKNOWN_GROUP,
                                            message=f"node group {spec.group!r} has no nodes")
            continue
        if n > group.total:
            decision.waiting[t.id] = Reason(code=TOO_LARGE, message=(
                f"needs {n} nodes; group {spec.group} has only {group.total}"))
            continue
        enabled_total = group.total - group.drained
        if n > enabled_total:
            decision.waiting[t.id] = Reason(code=DRAINED_NODES, message=(
                f"needs {n} nodes; {group.drained} of the {group.total} nodes of group {spec.group} are "
                f"drained ({'; '.join(group.drain_reasons) or 'no reason given'})"))
            continue
        if spec.zone and n > group.enabled.get(spec.zone, 0):
            decision.waiting[t.id] = Reason(code=ZONE_RULE, message=(
                f"pinned to zone {spec.zone!r}, which has {group.enabled.get(spec.zone, 0)} enabled nodes "
                f"in group {spec.group}; needs {n}"))
            continue
        if level is None:
            level = resolve_auto(spec, book, config)
            if level is None:
                decision.waiting[t.id] = Reason(code=OVER_QUOTA, message=(
                    f"AUTO: no priority level has quota for {n} more nodes of group {spec.group} "
                    f"for {spec.user}"))
                continue
        refusal = book.refusal(spec, level, n)
        if refusal is not None:
            decision.waiting[t.id] = Reason(code=OVER_QUOTA, message=f"over quota: {refusal}")
            continue
        zones = [spec.zone] if spec.zone else group.zone_list
        max_zone = group.enabled.get(spec.zone, 0) if spec.zone else group.max_enabled
        may_span = config.allow_cross_zone and not spec.zone and len(zones) > 1
        if n > max_zone and not may_span:
            decision.waiting[t.id] = Reason(code=ZONE_RULE, message=(
                f"needs {n} nodes, more than any zone of group {spec.group} has ({max_zone}), and "
                f"runs may not span zones here"))
            continue
        if n > max_zone and cross_zone is not None:
            decision.waiting[t.id] = Reason(code=ZONE_RULE, message=(
                f"needs {n} nodes, more than any zone of group {spec.group} has ({max_zone}); run "
                f"{cross_zone} already spans zones and only one may"))
            continue

        # --- place on free nodes ---
        fits = [z for z in zones if len(group.free[z]) >= n]
        if fits:
            z = min(fits, key=lambda z: (len(group.free[z]), z))
            picked = group.free[z][:n]
            del group.free[z][:n]
            group.version += 1
            _start(decision, book, t, level, picked, (z,))
            continue
        total_free = sum(len(group.free[z]) for z in zones)
        if may_span and cross_zone is None and total_free >= n:
            picked, used = [], []
            for z in sorted(zones, key=lambda z: (-len(group.free[z]), z)):
                take = min(n - len(picked), len(group.free[z]))
                if take:
                    picked += group.free[z][:take]
                    del group.free[z][:take]
                    group.version += 1
                    used.append(z)
                if len(picked) == n:
                    break
            cross_zone = t.id
            _start(decision, book, t, level, picked, tuple(used))
            continue

        # --- wait for releasing nodes, or preempt ---
        memo_key = (spec.group, spec.zone, level, spec.user if config.preempt_equal_priority else "")
        failed = failed_at.get(memo_key)
        if failed is not None and n >= failed[0]:
            decision.waiting[t.id] = _not_enough(n, group, zones, failed[1])
            continue
        plan = _plan(t, level, n, group, zones, may_span and cross_zone is None,
                     victims.get(spec.group), now, config)
        if plan is None:
            why = _why_no_victims(t, level, group, victims.get(spec.group), config)
            failed_at[memo_key] = (n, why)
            decision.waiting[t.id] = _not_enough(n, group, zones, why)
            continue
        chosen, from_free, from_releasing, used_zones = plan
        for z, names in from_free.items():
            taken = set(names)
            group.free[z] = [x for x in group.free[z] if x not in taken]
            group.version += 1
        waiting_on: set[int] = set()
        for z, names in from_releasing.items():
            taken = set(names)
            group.releasing[z] = [x for x in group.releasing[z] if x not in taken]
            waiting_on.update(h for x in names if (h := holder.get(x)) is not None)
        book.charge(spec, level, n)  # reserved: nobody else takes this quota meanwhile
        if len(used_zones) > 1:
            cross_zone = t.id
        pool = victims[spec.group] if chosen else None
        for v in chosen:
            assert pool is not None
            pool.taken.add(v.id)
            waiting_on.add(v.id)
            decision.preempts.append(Preempt(task=v.id, for_task=t.id, for_priority=Priority(level), reason=(
                f"preempted for run {t.id} ({Priority(level).name}, {n} nodes) of {spec.user}")))
        coming = sum(len(v) for v in from_releasing.values()) + sum(
            pool.gain_in(v, used_zones) for v in chosen if pool is not None)
        decision.waiting[t.id] = Reason(code=WAITING_RELEASE, message=(
            f"waiting for {coming} nodes to be released by run(s) {', '.join(str(i) for i in sorted(waiting_on))}"))
    return decision


def _start(decision: Decision, book: QuotaBook, t: Task, level: int, picked: list[str],
           zones: tuple[str, ...]) -> None:
    book.charge(t.spec, level, len(picked))
    decision.starts.append(Start(task=t.id, nodes=tuple(picked), priority=Priority(level), zones=zones))


def _eligible(v: Task, v_level: int, t: Task, level: int, config: SchedConfig) -> bool:
    if v_level < level:
        return True
    # same level: only with time sharing on, only a later-submitted run, never the same user's
    return (config.preempt_equal_priority and v_level == level and v.spec.user != t.spec.user
            and (v.submitted_at, v.id) > (t.submitted_at, t.id))


def _plan(t: Task, level: int, n: int, group: _Group, zones: list[str], may_span: bool,
          pool: _Victims | None, now: float, config: SchedConfig,
          ) -> tuple[list[Task], dict[str, list[str]], dict[str, list[str]], tuple[str, ...]] | None:
    """The cheapest way to get ``n`` nodes from free + releasing nodes + victims: in one zone if any
    zone can do it (lowest victims, then fewest victim nodes, then zone name), else across zones
    when allowed."""
    # cost of a plan: the highest level it interrupts first (victims go lowest priority first, so
    # a zone with a LOW victim beats one with a NORMAL victim), then how many nodes it interrupts
    best: tuple[tuple[int, int], tuple[str, ...], list[Task]] | None = None
    for option in [(z,) for z in zones]:
        got = _plan_in(t, level, n, group, option, pool, config)
        if got is not None and (best is None or (got[0], option) < (best[0], best[1])):
            best = (got[0], option, got[1])
    if best is None and may_span:
        span = tuple(zones)
        got = _plan_in(t, level, n, group, span, pool, config)
        if got is not None:
            best = (got[0], span, got[1])
    if best is None:
        return None
    _, option, chosen = best
    # the nodes it reserves: releasing first (they come free soonest, being already on their way),
    # then free ones; victims' nodes are implicitly its own
    need = n - sum(pool.gain_in(v, option) for v in chosen if pool is not None)
    from_releasing: dict[str, list[str]] = {}
    from_free: dict[str, list[str]] = {}
    for z in option:
        take = min(need, len(group.releasing[z]))
        if take:
            from_releasing[z] = group.releasing[z][:take]
            need -= take
    for z in option:
        take = min(need, len(group.free[z]))
        if take:
            from_free[z] = group.free[z][:take]
            need -= take
    assert need <= 0
    used = tuple(z for z in option if z in from_free or z in from_releasing
                 or (pool is not None and any(pool.gain[v.id].get(z) for v in chosen)))
    return chosen, from_free, from_releasing, used or option


def _plan_in(t: Task, level: int, n: int, group: _Group, option: tuple[str, ...], pool: _Victims | None,
             config: SchedConfig) -> tuple[tuple[int, int], list[Task]] | None:
    """Victims in ``option``'s zones for ``n`` nodes, with the plan's cost, or None if impossible."""
    have = sum(len(group.free[z]) + len(group.releasing[z]) for z in option)
    if have >= n:
        return (-1, 0), []
    if pool is None:
        return None
    chosen: list[tuple[int, int, Task]] = []  # (level, nodes it frees here, run)
    freed = 0
    for v_level, gain, v in pool.candidates(option):
        if v_level > level:
            break
        if not _eligible(v, v_level, t, level, config):
            continue
        chosen.append((v_level, gain, v))
        freed += gain
        if have + freed >= n:
            # drop victims the later ones made unnecessary (a LOW 1-node run taken before the
            # 8-node run that alone suffices): fewer interrupted runs, same rule for who goes
            for c in reversed(chosen[:-1]):
                if have + freed - c[1] >= n:
                    chosen.remove(c)
                    freed -= c[1]
            return (max(c[0] for c in chosen), freed), [c[2] for c in chosen]
    return None


def _why_no_victims(t: Task, level: int, group: _Group, pool: _Victims | None, config: SchedConfig) -> str:
    protected = (f" ({group.protected} run(s) of the group are inside their minimum runtime)"
                 if group.protected else "")
    lower = 0 if pool is None else sum(
        1 for lv, _, v in pool.runs if v.id not in pool.taken and _eligible(v, lv, t, level, config))
    if not lower:
        return f"no running run of lower priority may be preempted for it{protected}"
    return f"preempting all {lower} eligible lower-priority run(s) would still not free enough{protected}"


def _not_enough(n: int, group: _Group, zones: list[str], why: str) -> Reason:
    return Reason(code=NOT_ENOUGH_NODES, message=f"needs {n} nodes, free by zone {group.free_text(zones)}; {why}")
