"""The chain update: next public states and order of every chain, from the targets' local states.

mgmtd's chain updater (3FS ``generateNewChain``, run every 1 s by the primary) recomputes
each chain from the local states that heartbeats reported.  Here it is a pure function,
:func:`next_chain`, driven by one table, :data:`RULES`: each row says what a target's next
public state is, given its current public state, its local state and a *context* that
depends on the rest of the chain.  The same rows are rendered into this module's docs
(:func:`rules_markdown`) and drive the table-driven test, so a row cannot exist untested.

Sources of the rows (column ``source``):

- ``note``: stated in research/3fs.md §3 ("serving+alive stays serving; serving+offline ->
  offline, except the *first* serving target when none remain -> lastsrv; syncing+up-to-date
  -> serving; waiting/offline+online -> syncing only if the chain has a serving target and
  no other syncing target; new order serving, lastsrv, syncing, waiting, offline; any
  change bumps chain version"; "returning lastsrv resets uncommitted chunks").
- ``ours``: *our choice*, where the note is silent or leaves the outcome implicit; always
  the conservative one (never make a target serving without a completed resync, never give
  up the last serving copy).  Each such row says whether 3FS's own design notes
  (``docs/design_notes.md``, its state-transition table keyed by local state, public state
  and the predecessor's public state) agree; all of ours do.

How the note's one-step rule meets 3FS's table: 3FS moves a returning offline target to
waiting and, on a later scan, waiting -> syncing when its *predecessor* is serving.  With
the order serving < lastsrv < syncing < waiting < offline, a waiting target's predecessor
is serving exactly when the chain has a serving target and no syncing target and it is
the first waiting one, so the two agree; we decide it in the same scan, as the note says.

Evaluation order within one update (each phase sees the results of the previous ones):

1. rows with context ``any``;
2. serving+offline: does any target stay or become serving (from phase 1)?  If none does,
   the first serving target in chain order becomes lastsrv and the rest go offline;
3. syncing+online: keeps syncing only if the new chain has a serving target to sync from;
4. returning targets (waiting/offline + online), in chain order: the first one becomes
   syncing if the new chain has a serving target and no syncing target; the rest wait.

A target with no entry in ``local`` (mgmtd has not heard of it since it started or took
over) keeps its public state and counts as what it is: *our choice*, because inventing a
failure would force a resync or even a lastsrv; missing heartbeats are the registry's job
(:func:`fireflyer.mgmt.registry.scan_failures` reports OFFLINE after the fail interval).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import msgspec

from fireflyer.core.errors import Internal

from .model import Chain, ChainTarget, LocalState, PublicState, RoutingInfo, TargetId, TargetInfo

__all__ = [
    "Context",
    "Rule",
    "RULES",
    "ORDER",
    "TargetDecision",
    "decide_targets",
    "next_chain",
    "update_chains",
    "apply_to_routing",
    "rules_markdown",
]

P = PublicState
L = LocalState


class Context(enum.StrEnum):
    """What else in the chain a row depends on (evaluated on the *new* chain, see module docs)."""

    ANY = "any"
    SERVING_REMAINS = "another target stays or becomes serving"
    FIRST_SERVING_NONE_REMAIN = "no target stays serving; this is the first serving target"
    LATER_SERVING_NONE_REMAIN = "no target stays serving; an earlier target was serving"
    HAS_SERVING = "the new chain has a serving target"
    NO_SERVING = "the new chain has no serving target"
    SYNC_SLOT_FREE = "a serving target, no syncing target, first returning target in chain order"
    OTHER_SYNCING = "a serving target, and another target is syncing"
    EARLIER_RETURNING = "a serving target, no syncing target, an earlier returning target syncs"


class Rule(NamedTuple):
    current: PublicState
    local: LocalState
    context: Context
    next: PublicState
    source: str  # "note" (research/3fs.md §3 states it) | "ours" (our choice)
    why: str


C = Context

#: The chain-update rules, one row per (current public, local, context).  The implementation
#: looks rows up here; the test builds a chain for every row.
# fmt: off
RULES: tuple[Rule, ...] = (
    # serving
    Rule(P.SERVING, L.UPTODATE, C.ANY, P.SERVING, "note", "serving + alive stays serving"),
    Rule(P.SERVING, L.ONLINE, C.ANY, P.SERVING, "note", "serving + alive stays serving"),
    Rule(P.SERVING, L.OFFLINE, C.SERVING_REMAINS, P.OFFLINE, "note", "a failed replica leaves service, to the tail"),
    Rule(P.SERVING, L.OFFLINE, C.FIRST_SERVING_NONE_REMAIN, P.LASTSRV, "note",
         "the last copy: the chain is unavailable until this target returns"),
    Rule(P.SERVING, L.OFFLINE, C.LATER_SERVING_NONE_REMAIN, P.OFFLINE, "note",
         "only the first serving target in chain order is kept as lastsrv"),
    # syncing
    Rule(P.SYNCING, L.UPTODATE, C.ANY, P.SERVING, "note", "resync done (sync-done received): serves"),
    Rule(P.SYNCING, L.ONLINE, C.HAS_SERVING, P.SYNCING, "ours",
         "resync continues from the serving predecessor (3FS table agrees)"),
    Rule(P.SYNCING, L.ONLINE, C.NO_SERVING, P.WAITING, "ours",
         "no serving copy left to sync from: waits and resyncs afresh later (3FS table agrees)"),
    Rule(P.SYNCING, L.OFFLINE, C.ANY, P.OFFLINE, "note", "a failed replica leaves service, to the tail"),
    # waiting
    Rule(P.WAITING, L.UPTODATE, C.ANY, P.WAITING, "ours",
         "up-to-date without a resync is not trusted: waits until it reports online (3FS table agrees)"),
    Rule(P.WAITING, L.ONLINE, C.SYNC_SLOT_FREE, P.SYNCING, "note", "resync starts: one at a time per chain"),
    Rule(P.WAITING, L.ONLINE, C.NO_SERVING, P.WAITING, "note", "no serving copy to sync from"),
    Rule(P.WAITING, L.ONLINE, C.OTHER_SYNCING, P.WAITING, "note", "one resync at a time per chain"),
    Rule(P.WAITING, L.ONLINE, C.EARLIER_RETURNING, P.WAITING, "note",
         "one resync at a time; the earlier target in chain order goes first"),
    Rule(P.WAITING, L.OFFLINE, C.ANY, P.OFFLINE, "ours",
         "a failed target goes offline, to the tail (3FS table agrees)"),
    # lastsrv
    Rule(P.LASTSRV, L.UPTODATE, C.ANY, P.SERVING, "ours",
         "note: unavailable 'until it returns'; a returning lastsrv resets uncommitted chunks, "
         "so it holds exactly the committed data: it serves again (3FS table agrees)"),
    Rule(P.LASTSRV, L.ONLINE, C.ANY, P.SERVING, "ours",
         "as up-to-date: the lastsrv copy is the newest committed data there is (3FS table agrees)"),
    Rule(P.LASTSRV, L.OFFLINE, C.ANY, P.LASTSRV, "ours",
         "still down: keep waiting for it, never give up the last copy automatically (3FS table agrees)"),
    # offline
    Rule(P.OFFLINE, L.UPTODATE, C.ANY, P.WAITING, "ours",
         "alive, but a returning target must resync first: waits until it reports online (3FS table agrees)"),
    Rule(P.OFFLINE, L.ONLINE, C.SYNC_SLOT_FREE, P.SYNCING, "note", "resync starts: one at a time per chain"),
    Rule(P.OFFLINE, L.ONLINE, C.NO_SERVING, P.WAITING, "note", "no serving copy to sync from"),
    Rule(P.OFFLINE, L.ONLINE, C.OTHER_SYNCING, P.WAITING, "note", "one resync at a time per chain"),
    Rule(P.OFFLINE, L.ONLINE, C.EARLIER_RETURNING, P.WAITING, "note",
         "one resync at a time; the earlier target in chain order goes first"),
    Rule(P.OFFLINE, L.OFFLINE, C.ANY, P.OFFLINE, "ours", "still down (3FS table agrees)"),
)
# fmt: on

_LOOKUP: dict[tuple[PublicState, LocalState, Context], Rule] = {
    (r.current, r.local, r.context): r for r in RULES
}

#: New chain order: by class, stable within a class (the previous order is kept among targets
#: of one class).  So a failed target moves behind every live one -- to the tail, and a failed
#: head hands the head role to the next serving target -- while several offline targets keep
#: their relative order, and among returning targets the one earlier in the chain resyncs first.
ORDER: tuple[PublicState, ...] = (P.SERVING, P.LASTSRV, P.SYNCING, P.WAITING, P.OFFLINE)
_RANK = {s: i for i, s in enumerate(ORDER)}

_RETURNING = (P.WAITING, P.OFFLINE)


class TargetDecision(NamedTuple):
    """Why a target got its next state: the row applied, or None when its local state is unknown."""

    target_id: TargetId
    current: PublicState
    next: PublicState
    rule: Rule | None


def _rule(current: PublicState, local: LocalState, context: Context) -> Rule:
    try:
        return _LOOKUP[(current, local, context)]
    except KeyError:  # a hole in RULES; the completeness test makes this unreachable
        raise Internal(
            f"no chain rule for {current}+{local} in context {context!r}",
            public_state=str(current),
            local_state=str(local),
            context=str(context),
        ) from None


def decide_targets(chain: Chain, local: Mapping[TargetId, LocalState]) -> tuple[TargetDecision, ...]:
    """Each target's next public state and the rule that gave it, in the *current* chain order."""
    targets = chain.targets
    rules: list[Rule | None] = [None] * len(targets)
    nxt: list[PublicState] = [t.public_state for t in targets]  # unknown local state: unchanged

    # phase 1: rows that depend on nothing else
    for i, t in enumerate(targets):
        ls = local.get(t.target_id)
        if ls is not None and (t.public_state, ls, C.ANY) in _LOOKUP:
            rules[i] = _rule(t.public_state, ls, C.ANY)
            nxt[i] = rules[i].next  # type: ignore[union-attr]

    def pending(cur: tuple[PublicState, ...], ls: LocalState) -> list[int]:
        return [
            i
            for i, t in enumerate(targets)
            if rules[i] is None and t.public_state in cur and local.get(t.target_id) is ls
        ]

    # phase 2: failed serving targets; keep the first as lastsrv when no serving target remains
    failed_serving = pending((P.SERVING,), L.OFFLINE)
    remains = any(nxt[i] is P.SERVING for i in range(len(targets)) if i not in failed_serving)
    for n, i in enumerate(failed_serving):
        if remains:
            ctx = C.SERVING_REMAINS
        else:
            ctx = C.FIRST_SERVING_NONE_REMAIN if n == 0 else C.LATER_SERVING_NONE_REMAIN
        rules[i] = _rule(P.SERVING, L.OFFLINE, ctx)
        nxt[i] = rules[i].next  # type: ignore[union-attr]

    # phase 3: an ongoing resync needs a serving target to copy from
    has_serving = P.SERVING in nxt
    for i in pending((P.SYNCING,), L.ONLINE):
        rules[i] = _rule(P.SYNCING, L.ONLINE, C.HAS_SERVING if has_serving else C.NO_SERVING)
        nxt[i] = rules[i].next  # type: ignore[union-attr]

    # phase 4: returning targets, one resync at a time, in chain order
    other_syncing = P.SYNCING in nxt
    slot_taken = False
    for i in pending(_RETURNING, L.ONLINE):
        if not has_serving:
            ctx = C.NO_SERVING
        elif other_syncing:
            ctx = C.OTHER_SYNCING
        elif slot_taken:
            ctx = C.EARLIER_RETURNING
        else:
            ctx = C.SYNC_SLOT_FREE
            slot_taken = True
        rules[i] = _rule(targets[i].public_state, L.ONLINE, ctx)
        nxt[i] = rules[i].next  # type: ignore[union-attr]

    return tuple(TargetDecision(t.target_id, t.public_state, nxt[i], rules[i]) for i, t in enumerate(targets))


def next_chain(chain: Chain, local: Mapping[TargetId, LocalState]) -> Chain:
    """The chain after one update: states by :data:`RULES`, order by :data:`ORDER`.

    Returns ``chain`` itself (same version) when nothing changed; otherwise a new Chain with
    ``version + 1`` -- a change of order alone also bumps it, since it moves the head.
    """
    decided = decide_targets(chain, local)
    new_targets = tuple(
        ChainTarget(target_id=d.target_id, public_state=d.next)
        for d in sorted(decided, key=lambda d: _RANK[d.next])  # sorted() is stable
    )
    if new_targets == chain.targets:
        return chain
    return Chain(chain_id=chain.chain_id, version=chain.version + 1, targets=new_targets)


def update_chains(chains: Iterable[Chain], local: Mapping[TargetId, LocalState]) -> list[Chain]:
    """One updater pass: the chains that changed (new versions), in input order."""
    out = []
    for chain in chains:
        new = next_chain(chain, local)
        if new is not chain:
            out.append(new)
    return out


def apply_to_routing(
    routing: RoutingInfo,
    changed: Iterable[Chain],
    local: Mapping[TargetId, LocalState] | None = None,
) -> RoutingInfo:
    """Routing info with ``changed`` chains swapped in and target records brought in line.

    Target records get their chain's public state (and, when ``local`` is given, the local
    state).  The routing version rises by one iff anything differs, so clients that poll by
    version (3FS: every 10 s) see each chain update exactly once.
    """
    chains = {c.chain_id: c for c in routing.chains}
    for c in changed:
        chains[c.chain_id] = c
    public = {t.target_id: t.public_state for c in chains.values() for t in c.targets}
    targets: list[TargetInfo] = []
    for t in routing.targets:
        ps = public.get(t.target_id, t.public_state)
        ls = t.local_state if local is None else local.get(t.target_id, t.local_state)
        if ps is not t.public_state or ls is not t.local_state:
            t = msgspec.structs.replace(t, public_state=ps, local_state=ls)
        targets.append(t)
    new_chains = tuple(sorted(chains.values(), key=lambda c: c.chain_id))
    new_targets = tuple(targets)
    if new_chains == routing.chains and new_targets == routing.targets:
        return routing
    return RoutingInfo(
        version=routing.version + 1,
        nodes=routing.nodes,
        targets=new_targets,
        chains=new_chains,
        chain_tables=routing.chain_tables,
    )


def rules_markdown() -> str:
    """:data:`RULES` as a Markdown table (for docs and ``ff`` admin output)."""
    lines = [
        "| current | local | context | next | source | why |",
        "|---|---|---|---|---|---|",
    ]
    for r in RULES:
        lines.append(f"| {r.current} | {r.local} | {r.context} | {r.next} | {r.source} | {r.why} |")
    return "\n".join(lines)


__doc__ = (__doc__ or "") + "\nThe rules as implemented:\n\n" + rules_markdown() + "\n"
