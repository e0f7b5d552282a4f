"""kvtier configuration: one frozen attrs class, strictly converted.

``TierConfig`` holds every key a user can write in a vLLM
``kv_connector_extra_config.secondary_tiers[i]`` entry for kvtier, plus
kvtier's own timers and limits.  It is the single source of truth for the keys,
their defaults, units, bounds and descriptions (each field's metadata):
``DEFAULTS`` and ``config_table()`` are derived from the class, and
``docs/configuration.md`` is rendered from ``config_table()`` by the
repository's tools (``python -m tools docs``; this module renders nothing).

Rules (scenario B25, docs/scenarios.md):

* Every bad value fails closed at construction with a ``TierConfigError``
  (a ``ValueError``) whose message names the key and the offending value's
  ``repr``.
* Numbers may be given as ``int``, ``float`` or a decimal numeric string
  (``"180"``, ``" 180\\n"``, ``"59.5"``, ``"1e3"``).  ``bool`` is rejected
  (it is an ``int`` subclass, so it is checked explicitly), as are NaN, +-inf,
  values <= 0, overflowing values (``10**400``, ``"1e999"``), values outside
  the documented range, and every other type (``None``, lists, ``bytes``,
  ``Decimal``, numpy scalars other than ``float64``).  ``Decimal`` is rejected
  on purpose: it is not a JSON type, and accepting it would invite silent
  precision games; convert explicitly.
* Integer keys additionally reject values with a fractional part
  (``128.5``, ``"128.5"``); ``128.0`` and ``"1e3"`` are accepted.
* ``background_poll`` takes a real ``bool`` only (no 0/1, no ``"true"``).
* ``TierConfig.from_dict`` rejects unknown keys, with a did-you-mean
  suggestion (``unbound_store_timout_s`` -> ``unbound_store_timeout_s``).
* Cross-field relations (``CROSS_FIELD_RULES``) are checked at construction,
  so ``attrs.evolve`` re-validates them too.

The value kinds that do the converting, and ``TierConfigError``, live in
:mod:`kvtier.config_kinds`; this module declares the keys with them, checks the
cross-field rules and exposes the schema as data.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import attrs

from kvtier.config_kinds import (
    DOTTED_RE,
    IDENT_RE,
    Bool,
    Choice,
    Float,
    Int,
    Kind,
    MustBeNone,
    NameList,
    OptionalInt,
    OptionalStr,
    PeerList,
    PrincipalList,
    Str,
    TierConfigError,
    fmt,
    safe_repr,
)

__all__ = [
    "CROSS_FIELD_RULES",
    "DEFAULTS",
    "VLLM_BUILTIN_TIERS",
    "ConfigRow",
    "CrossFieldRule",
    "TierConfig",
    "TierConfigError",
    "config_table",
]

# --------------------------------------------------------------------------
# declaring a key: its kind and its text, kept in the field's metadata
# --------------------------------------------------------------------------

_KIND = "kvtier.kind"
_DOC = "kvtier.doc"

MAX_TIMEOUT_S = 86_400.0  # 24 h: any timeout longer than this is a typo or a leak
MIN_DURATION_S = 0.001  # 1 ms: finer than any poll tick; denormals like 1e-320 are typos
_TIMEOUT = Float(MIN_DURATION_S, MAX_TIMEOUT_S)


def _field(kind: Kind, default: Any, *, doc: str) -> Any:
    """An attrs field whose converter is ``kind.convert`` (defaults are converted too); ``kind``
    (validation and unit) and ``doc`` (what the key means, whitespace folded) are kept in the
    field's metadata, where :func:`config_table` reads them."""

    def convert(value: Any, field: attrs.Attribute) -> Any:
        return kind.convert(field.name, value)

    return attrs.field(
        default=default,
        converter=attrs.Converter(convert, takes_field=True),
        metadata={_KIND: kind, _DOC: " ".join(doc.split())},
    )


_BACKPRESSURE_WHY = (
    "kvtier does its own flow control (bounded fetches, bounded pending fetches "
    "per peer, timeouts); vLLM's store-latency back-pressure detector would drop "
    "stores a remote decoder is waiting for. Remove 'backpressure' from this tier "
    "entry and from the top level of kv_connector_extra_config (vLLM merges a "
    "top-level 'backpressure' block into every tier)."
)


# --------------------------------------------------------------------------
# the config class
# --------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class TierConfig:
    """kvtier settings: one vLLM ``secondary_tiers[i]`` entry, validated.

    Build it from the user's JSON with ``TierConfig.from_dict(entry)`` (rejects
    unknown keys), or directly with keyword arguments.  Every field is
    converted strictly and range-checked; cross-field relations in
    ``CROSS_FIELD_RULES`` are checked after all fields are converted.
    ``attrs.evolve(cfg, key=value)`` builds a new, fully re-validated config.
    """

    # ---- vLLM secondary_tiers[] entry keys --------------------------------
    type: str = _field(Str(128, IDENT_RE, "a Python identifier"), "KvTierSecondaryTier", doc="""
        Class name vLLM's SecondaryTierFactory loads from ``module_path``.
        vLLM pops it and passes it to the tier as ``tier_type``; it is also the
        tier's metrics label.""")

    module_path: str = _field(
        Str(256, DOTTED_RE, "a dotted module path"), "kvtier.integrations.vllm", doc="""
        Python module that holds ``type``. vLLM pops it before calling the tier.""")

    host: str = _field(
        Str(255, re.compile(r"[^\s/]+"), "an address without whitespace or '/'"), "127.0.0.1", doc="""
        Address the producer's listener binds to. Consumers dial the producer at
        the ``remote_host``/``remote_port`` carried in ``kv_transfer_params``, so
        set this to an address they can reach (``0.0.0.0`` binds every interface).""")

    port: int = _field(Int(0, 65535), 0, doc="""
        TCP port of the producer's listener; 0 picks a free ephemeral port
        (read the bound address back from the tier).""")

    metrics_port: int | None = _field(OptionalInt(0, 65535), None, doc="""
        TCP port of the Prometheus endpoint (``GET /metrics``, docs/metrics.md),
        bound on ``host``; ``null`` serves none, 0 picks a free ephemeral port.
        Under vLLM data parallelism the engine's ``data_parallel_index`` is added,
        as for ``port``.""")

    locality: str | None = _field(OptionalStr(), None, doc="""
        Accepted for vLLM compatibility (its factory forwards it) and ignored.""")

    backpressure: None = _field(MustBeNone(_BACKPRESSURE_WHY), None, doc="""
        Must be absent: kvtier does its own flow control. Omit the key entirely;
        under vLLM even ``"backpressure": null`` is turned into ``{}`` by the spec
        and refused by vLLM's factory before kvtier sees it.""")

    # ---- producer lifecycle -------------------------------------------------
    unbound_store_timeout_s: float = _field(_TIMEOUT, 60.0, doc="""
        How long stored blocks of a ``kv_request_id`` that no consumer has
        fetched yet stay parked (pinned) before they are reaped and the id is
        tombstoned.""")

    park_clock: str = _field(Choice(("last_store", "first_store")), "last_store", doc="""
        Which store starts the reap clock of a parked id: ``last_store`` (every
        store restarts it, so a long prefill is not reaped mid-way) or
        ``first_store`` (vLLM p2p behaviour: the first store decides).""")

    tombstone_retention_s: float = _field(_TIMEOUT, 600.0, doc="""
        How long a reaped or finished ``kv_request_id`` is remembered, so a late
        fetch for it is refused at once instead of waiting for blocks.""")

    tombstone_max: int = _field(Int(1, 4_194_304, "ids"), 65_536, doc="""
        Count cap on remembered (done or tombstoned) ids; the oldest are
        forgotten first when it is reached.""")

    fetch_supply_timeout_s: float = _field(_TIMEOUT, 10.0, doc="""
        How long a bound fetch waits for blocks that are not stored yet (e.g. a
        fetch that arrives before the store) before the producer answers it with
        a failure.""")

    transfer_timeout_s: float = _field(_TIMEOUT, 30.0, doc="""
        A transfer that has started must finish within this time, or it fails.""")

    # ---- consumer -----------------------------------------------------------
    load_timeout_s: float = _field(_TIMEOUT, 30.0, doc="""
        How long the consumer waits for a load to finish before it gives up and
        aborts the fetch; the load is reported failed (``load_timeout``) when the
        producer acknowledges the abort, or ``abort_ack_timeout_s`` later at most.""")

    abort_ack_timeout_s: float = _field(_TIMEOUT, 5.0, doc="""
        How long the consumer waits for the producer's terminal answer to an
        abort. Past it the session to that producer is ended
        (``abort_unacknowledged``) and the load fails once the data plane confirms
        the producer can no longer write into its slots (at once on the zmq
        plane).""")

    revoke_timeout_s: float = _field(_TIMEOUT, 1.0, doc="""
        The bound on revoking a producer's access to a load's slots once it cannot answer (its
        session died, or an abort went unanswered): the load is reported failed by then at the
        latest. The zmq plane needs no time; the NIXL plane withdraws the session's window of the
        pool at once and needs ``DRAIN_S`` (50 ms) more. A NIXL pool that is not shared memory
        cannot be withdrawn from: its slots stay held past this, logged each time it passes.""")

    # ---- sessions -----------------------------------------------------------
    handshake_timeout_s: float = _field(_TIMEOUT, 5.0, doc="""
        How long a new session may take to complete its hello/hello_ack.""")

    connect_timeout_s: float = _field(_TIMEOUT, 2.0, doc="""
        How long a dial to a producer may wait for the TCP connection. A dial that gets no
        answer within it fails its loads (``connect_timeout``); one that is refused (nothing
        listens at the address) fails them at once (``connect_refused``). The session's
        ``handshake_timeout_s`` still bounds the whole dial.""")

    heartbeat_interval_s: float = _field(Float(MIN_DURATION_S, 3600.0), 1.0, doc="""
        Interval between pings on an otherwise idle session.""")

    peer_timeout_s: float = _field(_TIMEOUT, 5.0, doc="""
        Silence longer than this marks the peer lost; its requests fail. A
        connection that closes or resets ends its session at once.""")

    shutdown_grace_s: float = _field(Float(MIN_DURATION_S, 600.0), 3.0, doc="""
        How long ``shutdown()`` lets transfers and loads in flight finish and
        the goodbyes flush before it gives up on them; shutdown returns within
        this time (plus a few milliseconds) even when a peer is wedged.""")

    # ---- limits -------------------------------------------------------------
    max_peers: int = _field(Int(1, 4096, "peers"), 128, doc="""
        Maximum concurrent sessions (inbound and outbound together).""")

    max_blocks_per_fetch: int = _field(Int(1, 1_048_576, "blocks"), 65_536, doc="""
        Maximum number of keys in one fetch.""")

    max_pending_fetches_per_peer: int = _field(Int(1, 1_048_576, "fetches"), 1024, doc="""
        Maximum fetches one peer may have outstanding; more are refused.""")

    max_message_bytes: int = _field(Int(4096, 268_435_456, "bytes"), 1_048_576, doc="""
        Largest control-message header accepted (1 MiB by default); bigger
        messages are answered with an error and dropped.""")

    hash_seed: str = _field(Str(1024, allow_empty=True), "", doc="""
        Block-hash seed advertised in the handshake; both sides must agree, or
        the session is refused. Empty means "not set".""")

    # ---- data path ----------------------------------------------------------
    data_plane: str = _field(Choice(("zmq", "nixl")), "zmq", doc="""
        How block bytes travel: ``zmq`` (payload frames on the control
        connection; no extra dependency) or ``nixl`` (one-sided WRITEs through
        NIXL/UCX: shared-memory copies (CMA) on one host, RDMA across hosts;
        ~1.9x the zmq plane's throughput on one host, docs/dataplane.md). Both peers must
        use the same plane (checked in the handshake).""")

    backends: tuple[str, ...] = _field(NameList(), ("UCX",), doc="""
        ``data_plane="nixl"`` only: the NIXL backend plugins to create, by NIXL's names, as
        vLLM's ``p2p`` tier takes them (``["UCX"]``; ``UCX_*`` environment variables tune UCX, see
        docs/dataplane.md). A plugin missing here fails the start with its name.""")

    nixl_progress_interval_s: float = _field(Float(0.0001, 0.05), 0.001, doc="""
        ``data_plane="nixl"`` only: the longest the manager waits between two calls into NIXL
        while a peer may be writing into its pool or a WRITE of its own is in flight. A batch's
        header arrives as its WRITE's NIXL notification, which is read (and, on the producer, sent)
        only during those calls, and over UCX tcp a WRITE into this pool advances only then too, so
        this bounds a small request's latency; shorter intervals trade CPU (more ticks during a
        large transfer) for it (decision N17). NIXL's own progress thread is not used (it spins
        ~80 % of a core when idle).""")

    integrity: str = _field(Choice(("xxh3_64", "none")), "xxh3_64", doc="""
        Per-block digest taken when blocks are parked and checked by the
        consumer as they land; a mismatch fails the load (``corrupt``) instead of
        reporting bytes that are not the parked ones. ``none`` turns the check
        off. Both peers must agree (checked in the handshake). On by default on
        both planes: it costs ~2 % of the zmq plane's throughput and ~13-15 % of
        the NIXL plane's (P1, docs/decisions.md I12).""")

    digest_threads: int | None = _field(OptionalInt(0, 256), None, doc="""
        Threads that take the digests of large stores and check (zmq: copy and check) large
        landings, off the thread that calls the manager and outside its lock: ``null`` (the
        default) sizes the pool from the machine (the CPUs this process may use, capped by a
        cgroup quota, at most 8); ``0`` does all of it on the calling thread, under the lock (the
        engine's thread then pays per byte stored). Small stores (≤ 64 KiB) and landings (≤ 1 MiB)
        are always done on the calling thread. Unused with ``integrity="none"`` (decision I14).""")

    instance: str = _field(Str(128, allow_empty=True), "", doc="""
        Name this manager gives itself in handshakes. Sessions to one instance
        share fate: when one dies, new loads to its siblings fail fast
        (``instance_down``) until one is heard again (B11). Give every rank of one
        producer pod the same value; empty: a random name per manager.""")

    # ---- security (docs/security.md) -----------------------------------------
    auth: str = _field(Choice(("none", "curve")), "none", doc="""
        ``curve``: every connection is authenticated and encrypted with libzmq CURVE, and only
        peers whose public certificate is in ``auth_allowed_keys_dir`` get in. ``none``: plain TCP,
        anyone who can reach ``host:port`` can talk to this tier (a loud warning is logged when
        ``host`` is not a loopback address).""")

    auth_secret_key_file: str = _field(Str(4096, re.compile(r"[^\x00]+"), "a file path", allow_empty=True), "", doc="""
        This instance's secret certificate (``NAME.key_secret`` from ``kvtier keys generate``).
        Required with ``auth=curve``, refused without it; ``NAME`` is this instance's principal.""")

    auth_allowed_keys_dir: str = _field(
        Str(4096, re.compile(r"[^\x00]+"), "a directory path", allow_empty=True), "", doc="""
        Directory of the public certificates (``*.key``) of every peer allowed in; a file's stem
        is that peer's principal. A producer's certificate lists its ``endpoints`` in its metadata,
        which is how a consumer knows the key to expect before it dials. Required with
        ``auth=curve``, refused without it.""")

    allowed_peers: tuple[str, ...] = _field(PeerList(), ("*",), doc="""
        Producer endpoints this tier may dial when a request's ``kv_transfer_params`` name them:
        ``"host:port"``, ``"host"`` (any port), a CIDR network, or ``"*"`` (any: the default, for
        compatibility; set it in production, see docs/security.md). A request naming another
        endpoint is refused before any socket exists: lookup says MISS and the engine recomputes.""")

    # ---- the symmetric path (remote_kv_source; docs/integrations/vllm.md, decisions Y1-Y16) ------
    serve_external: bool = _field(Bool(), False, doc="""
        Answer peers' probes from this engine's own tiers (the producer side of the symmetric
        path): a peer's request with ``remote_kv_source`` naming this tier fetches whatever prefix
        blocks this engine holds. Off by default: a probe tells the peer whether a prompt was
        served here and lets it read that prompt's KV, so turn it on only among instances that may
        share their caches (with ``auth="curve"`` and ``serve_allowed_principals`` across
        tenants). Consumers probe whether or not this is on.""")

    serve_allowed_principals: tuple[str, ...] = _field(PrincipalList(), ("*",), doc="""
        With ``serve_external``: the authenticated principals (``auth="curve"`` certificate stems)
        whose probes are answered; others are refused ``not_serving``. ``["*"]``: every peer
        allowed to connect. Anything but ``["*"]`` needs ``auth="curve"`` (without authentication
        a principal is whatever the peer claims).""")

    probe_timeout_s: float = _field(_TIMEOUT, 1.0, doc="""
        The longest a symmetric request's lookups answer RETRY (the engine defers the request)
        for one round: from the round's first key, the dial and handshake, the probe and the
        peer's reply included. Then the keys answer MISS and the engine computes them.""")

    serve_lookup_timeout_s: float = _field(_TIMEOUT, 0.25, doc="""
        How long a producer waits for blocks its engine reports pending (on their way into its
        primary tier) before answering a probe miss for them. Must be below
        ``probe_timeout_s``, so a fleet with one config answers before its consumers give up.""")

    offer_timeout_s: float = _field(_TIMEOUT, 10.0, doc="""
        How long a producer keeps blocks pinned for a peer's round that was answered but not
        fetched; then the pins are released and the peer told ``offer_expired``.""")

    serve_max_rounds_per_peer: int = _field(Int(1, 1_048_576, "rounds"), 256, doc="""
        Live symmetric rounds one peer may have on this producer; more probes are refused
        ``serve_busy``.""")

    serve_max_probes_per_round: int = _field(Int(1, 1024, "probes"), 8, doc="""
        Probes one round may carry (a round grows by the keys an engine step looks up); more end
        the round ``serve_busy``.""")

    serve_max_pinned_blocks_per_peer: int = _field(Int(1, 1 << 30, "blocks"), 16384, doc="""
        Engine blocks one peer's rounds may keep pinned together; a probe that could exceed it is
        refused ``serve_busy``.""")

    serve_max_pinned_fraction: float = _field(Float(0.001, 1.0, unit=""), 0.5, doc="""
        Fraction of the block pool all peers' rounds may keep pinned together, so the engine keeps
        room to compute.""")

    # ---- polling ------------------------------------------------------------
    poll_interval_s: float = _field(Float(0.0001, 1.0), 0.001, doc="""
        Accepted and checked, no longer used: the I/O loop has no polling
        cadence (it sleeps until input or its next deadline, decision C12).""")

    background_poll: bool = _field(Bool(), False, doc="""
        Run kvtier's I/O loop on its own thread (``kvtier-io``): engine calls
        only hand it a command and return.  When false, the loop runs on the
        caller's thread: each engine call is applied at once and ``poll()`` /
        ``get_finished_jobs()`` read the network.  The vLLM adapter turns it
        on unless the entry sets it.""")

    def __attrs_post_init__(self) -> None:
        for rule in CROSS_FIELD_RULES:
            rule.check(self)
        if self.serve_allowed_principals != ("*",) and self.auth != "curve":
            raise TierConfigError(
                f"serve_allowed_principals={list(self.serve_allowed_principals)!r} needs auth='curve': without "
                "authentication a principal is whatever the peer claims (use [\"*\"] or turn CURVE on)",
                keys=("serve_allowed_principals", "auth"),
            )
        if "*" in self.serve_allowed_principals and len(self.serve_allowed_principals) > 1:
            raise TierConfigError(
                "serve_allowed_principals lists \"*\" with other names: \"*\" already allows every peer",
                keys=("serve_allowed_principals",),
            )
        if self.auth == "curve":
            for key in ("auth_secret_key_file", "auth_allowed_keys_dir"):
                if not getattr(self, key):
                    raise TierConfigError(f"auth='curve' needs {key} (see docs/security.md)", keys=("auth", key))
        else:
            # Fail closed: key files without auth='curve' would run unauthenticated while the
            # operator believes otherwise (a forgotten auth key, a template switched half-way).
            given = [k for k in ("auth_secret_key_file", "auth_allowed_keys_dir") if getattr(self, k)]
            if given:
                raise TierConfigError(
                    f"{' and '.join(given)} set but auth='none': nothing would be authenticated; set "
                    f"auth='curve' to use the keys, or remove {'them' if len(given) > 1 else 'it'}",
                    keys=("auth", *given),
                )

    # ---- dict round trip ----------------------------------------------------

    @classmethod
    def from_dict(cls, mapping: Mapping[str, Any]) -> TierConfig:
        """Build from a ``secondary_tiers[i]`` entry; unknown keys are rejected.

        Raises:
            TierConfigError: a non-mapping, a non-string or unknown key (with a
                did-you-mean suggestion), a bad value, or a broken cross-field
                relation.
        """
        if not isinstance(mapping, Mapping):
            raise TierConfigError(
                f"kvtier tier config must be a mapping (a JSON object), got "
                f"{type(mapping).__name__}: {safe_repr(mapping)}"
            )
        known = _KEYS
        bad_type = [k for k in mapping if not isinstance(k, str)]
        if bad_type:
            raise TierConfigError(
                f"kvtier tier config keys must be strings, got {safe_repr(bad_type)}"
            )
        unknown = [k for k in mapping if k not in known]
        if unknown:
            parts = []
            for key in unknown:
                close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                parts.append(f"{safe_repr(key)}{hint}")
            # the did-you-mean is the useful part; the list of every key lives in the docs
            raise TierConfigError(
                "unknown kvtier tier config key(s): " + ", ".join(parts)
                + ". Every key, with its range: docs/configuration.md",
                keys=tuple(unknown),
            )
        _refuse_builtin_type(mapping)
        return cls(**mapping)

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape ``from_dict`` accepts (``from_dict(c.to_dict()) == c``).

        ``locality`` and ``backpressure`` are left out while ``None``: vLLM
        turns an explicit ``"backpressure": null`` into ``{}`` and refuses it.
        """
        out: dict[str, Any] = {}
        for a in attrs.fields(TierConfig):
            value = getattr(self, a.name)
            if value is None and a.name in ("locality", "backpressure"):
                continue
            out[a.name] = value
        return out


_KEYS: tuple[str, ...] = tuple(a.name for a in attrs.fields(TierConfig))

#: ``type`` names vLLM 0.33.0 registers for its own secondary tiers: its factory looks a registered
#: name up before ``module_path``, so such an entry would load vLLM's tier, not kvtier.
VLLM_BUILTIN_TIERS: frozenset[str] = frozenset({"p2p", "fs", "obj", "kvcr", "example"})


def _refuse_builtin_type(mapping: Mapping[str, Any]) -> None:
    """A kvtier entry whose ``type`` names one of vLLM's own tiers (``"p2p"``) is a mistake either
    way: vLLM loads its tier, not kvtier (or, through the Python API, the entry was copied from a
    ``p2p`` config).  Say which ``type``/``module_path`` to write (docs/migrating-from-p2p.md)."""
    name = mapping.get("type")
    if isinstance(name, str) and name.strip().lower() in VLLM_BUILTIN_TIERS:
        raise TierConfigError(
            f"type={name!r} names vLLM's built-in {name.strip().lower()!r} tier, not kvtier: vLLM's factory "
            "looks registered names up before module_path, so this entry would load vLLM's own tier. Write "
            '"type": "KvTierSecondaryTier", "module_path": "kvtier.integrations.vllm" '
            "(docs/migrating-from-p2p.md maps the p2p keys)",
            keys=("type",),
        )

DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {a.name: a.default for a in attrs.fields(TierConfig)}
)
"""Every key's code default (read-only)."""


# --------------------------------------------------------------------------
# cross-field relations
# --------------------------------------------------------------------------


class CrossFieldRule(NamedTuple):
    """``lhs <op> factor * rhs``, checked at construction."""

    lhs: str
    op: str  # one of ">", ">=", "<", "<="
    factor: float
    rhs: str
    why: str

    def text(self) -> str:
        rhs = self.rhs if self.factor == 1 else f"{fmt(self.factor)} * {self.rhs}"
        return f"{self.lhs} {self.op} {rhs}"

    def check(self, cfg: TierConfig) -> None:
        a = getattr(cfg, self.lhs)
        b = getattr(cfg, self.rhs)
        ok = _OPS[self.op](a, self.factor * b)
        if not ok:
            raise TierConfigError(
                f"{self.lhs}={safe_repr(a)} and {self.rhs}={safe_repr(b)} violate "
                f"{self.text()}: {self.why}",
                keys=(self.lhs, self.rhs),
            )


_OPS: dict[str, Callable[[float, float], bool]] = {
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
}

CROSS_FIELD_RULES: tuple[CrossFieldRule, ...] = (
    CrossFieldRule(
        "peer_timeout_s", ">=", 2, "heartbeat_interval_s",
        "a peer must be allowed to miss at least one heartbeat before it is declared lost",
    ),
    CrossFieldRule(
        "load_timeout_s", ">", 1, "fetch_supply_timeout_s",
        "the producer's definitive answer to a fetch waiting for blocks must reach "
        "the consumer before the consumer gives up",
    ),
    CrossFieldRule(
        "handshake_timeout_s", "<", 1, "load_timeout_s",
        "a fetch queued behind a handshake must still have load time left",
    ),
    CrossFieldRule(
        "abort_ack_timeout_s", "<", 1, "load_timeout_s",
        "an abort must be acknowledged well within the consumer's load budget",
    ),
    CrossFieldRule(
        "heartbeat_interval_s", ">=", 1, "poll_interval_s",
        "heartbeats cannot be sent more often than the transport is polled",
    ),
    CrossFieldRule(
        "serve_lookup_timeout_s", "<", 1, "probe_timeout_s",
        "a producer must answer a probe (pending blocks as miss) before its consumers stop waiting for it",
    ),
)


# --------------------------------------------------------------------------
# the schema as data (docs/configuration.md and the README's table are rendered from it by the
# repository's tools: python -m tools docs)
# --------------------------------------------------------------------------


class ConfigRow(NamedTuple):
    """One row of the configuration table in ``docs/configuration.md``; ``minimum`` and
    ``maximum`` are a numeric key's bounds (``None`` for other keys)."""

    key: str
    default: Any
    unit: str
    description: str
    validation: str
    minimum: float | None = None
    maximum: float | None = None


def config_table() -> list[ConfigRow]:
    """One ``ConfigRow`` per key, in declaration order."""
    rows = []
    for a in attrs.fields(TierConfig):
        kind: Kind = a.metadata[_KIND]
        rows.append(ConfigRow(a.name, a.default, kind.unit, a.metadata[_DOC], kind.describe(),
                              getattr(kind, "lo", None), getattr(kind, "hi", None)))
    return rows
