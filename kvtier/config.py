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

Each key is declared once (:func:`kvtier.config_kinds.key`): its default, a strict converter,
attrs' validators for its bounds, length, pattern or choices, its unit and its text; validation,
the configuration table and ``kvtier check-config`` all follow from that declaration (decision
W8).  This module declares the keys, checks the cross-field rules and exposes the schema as data.
"""

from __future__ import annotations

import difflib
import operator
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import attrs
from attrs.validators import ge, gt, in_, instance_of, le, matches_re, max_len, min_len

from kvtier.config_kinds import (
    KEY,
    Key,
    TierConfigError,
    absent,
    bounds,
    describe,
    field_problems,
    flag,
    fmt,
    integer,
    key,
    maybe_integer,
    maybe_number,
    raise_all,
    maybe_text,
    names,
    number,
    peers,
    principals,
    safe_repr,
    text,
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

# ---- the checks keys share: attrs validators, run in this order (config_kinds.key) ----

MAX_TIMEOUT_S = 86_400.0  # 24 h: any timeout longer than this is a typo or a leak
MIN_DURATION_S = 0.001  # 1 ms: finer than any poll tick; denormals like 1e-320 are typos
NIXL_MIN_REVOKE_S = 0.1  # the NIXL plane's revocation: a window withdrawn, twice its drain (DRAIN_S)
IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
DOTTED_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*", re.ASCII)


def _positive(lo: float, hi: float) -> tuple[Any, ...]:
    """A positive real in ``[lo, hi]``; ``≤ 0`` is refused as such, before the range."""
    return gt(0), le(hi), ge(lo)


def _within(lo: int, hi: int) -> tuple[Any, ...]:
    """An integer in ``[lo, hi]``; a fractional value is refused after the range."""
    return le(hi), ge(lo), instance_of(int)


def _string(longest: int) -> tuple[Any, ...]:
    """A non-empty string of at most ``longest`` characters."""
    return min_len(1), max_len(longest)


_TIMEOUT = _positive(MIN_DURATION_S, MAX_TIMEOUT_S)

_BACKPRESSURE_WHY = (
    "kvtier does its own flow control (bounded fetches, bounded pending fetches "
    "per peer, timeouts); vLLM's store-latency back-pressure detector would drop "
    "stores a remote decoder is waiting for. Remove 'backpressure' from this tier "
    "entry and from the top level of kv_connector_extra_config (vLLM merges a "
    "top-level 'backpressure' block into every tier)."
)


# ---- the config class ----------------------------------------------------


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
    type: str = key("KvTierSecondaryTier", text, *_string(128), matches_re(IDENT_RE), shape="a Python identifier",
                    doc="""
        Class name vLLM's SecondaryTierFactory loads from ``module_path``. vLLM pops it and passes it to
        the tier as ``tier_type``; it is also the tier's metrics label.""")

    module_path: str = key("kvtier.integrations.vllm", text, *_string(256), matches_re(DOTTED_RE),
                           shape="a dotted module path", doc="""
        Python module that holds ``type``. vLLM pops it before calling the tier.""")

    # no colon (a name or IPv4) or two and more (IPv6, in brackets or not): "name:port" is refused
    host: str = key("127.0.0.1", text, *_string(255), matches_re(
                        r"[^\s/:\[\]]+|(?P<b>\[)?[^\s/\[\]]*:[^\s/\[\]]*:[^\s/\[\]]*(?(b)\])"),
                    shape="an address without whitespace, '/' or a port (the port goes in 'port')",
                    doc="""
        Address the producer's listener binds to. Consumers dial the producer at
        the ``remote_host``/``remote_port`` carried in ``kv_transfer_params``, so
        set this to an address they can reach (``0.0.0.0`` binds every interface).""")

    port: int = key(0, integer, *_within(0, 65535), doc="""
        TCP port of the producer's listener; 0 picks a free ephemeral port
        (read the bound address back from the tier).""")

    metrics_port: int | None = key(None, maybe_integer, *_within(0, 65535), doc="""
        TCP port of the Prometheus endpoint (``GET /metrics``, docs/metrics.md),
        bound on ``host``; ``null`` serves none, 0 picks a free ephemeral port.
        Under vLLM data parallelism the engine's ``data_parallel_index`` is added,
        as for ``port``.""")

    locality: str | None = key(None, maybe_text, max_len(64),
                              text="string or `null`; accepted and ignored", doc="""
        Accepted for vLLM compatibility (its factory forwards it) and ignored.""")

    backpressure: None = key(None, absent(_BACKPRESSURE_WHY),
                         text="absent (or null through the Python API); any other value is rejected", doc="""
        Must be absent: kvtier does its own flow control. Omit the key entirely;
        under vLLM even ``"backpressure": null`` is turned into ``{}`` by the spec
        and refused by vLLM's factory before kvtier sees it.""")

    # ---- producer lifecycle -------------------------------------------------
    unbound_store_timeout_s: float = key(60.0, number, *_TIMEOUT, unit="s", doc="""
        How long stored blocks of a ``kv_request_id`` that no consumer has fetched
        yet stay parked (pinned) before they are reaped and the id is tombstoned.""")

    park_clock: str = key("last_store", None, in_(("last_store", "first_store")), doc="""
        Which store starts the reap clock of a parked id: ``last_store`` (every
        store restarts it, so a long prefill is not reaped mid-way) or
        ``first_store`` (vLLM p2p behaviour: the first store decides).""")

    tombstone_retention_s: float = key(600.0, number, *_TIMEOUT, unit="s", doc="""
        How long a reaped or finished ``kv_request_id`` is remembered, so a late
        fetch for it is refused at once instead of waiting for blocks.""")

    tombstone_max: int = key(65_536, integer, *_within(1, 4_194_304), unit="ids", doc="""
        Count cap on remembered (done or tombstoned) ids; the oldest are forgotten first when it is reached.""")

    fetch_supply_timeout_s: float = key(10.0, number, *_TIMEOUT, unit="s", doc="""
        How long a bound fetch waits for blocks that are not stored yet (e.g. a fetch
        that arrives before the store) before the producer answers it with a failure.""")

    transfer_timeout_s: float = key(30.0, number, *_TIMEOUT, unit="s", doc="""
        A transfer that has started must finish within this time, or it fails.""")

    # ---- consumer -----------------------------------------------------------
    load_timeout_s: float = key(30.0, number, *_TIMEOUT, unit="s", doc="""
        How long the consumer waits for a load to finish before it gives up and
        aborts the fetch; the load is reported failed (``load_timeout``) when the
        producer acknowledges the abort, or ``abort_ack_timeout_s`` later at most.""")

    abort_ack_timeout_s: float = key(5.0, number, *_TIMEOUT, unit="s", doc="""
        How long the consumer waits for the producer's terminal answer to an abort,
        again while the producer still sends data and the load's deadline is ahead. Then
        on zmq, if the producer still sends data, the load fails alone (its session
        kept); otherwise the session to that producer is ended (``abort_unacknowledged``)
        and the load fails once the producer can no longer write into its slots.""")

    revoke_timeout_s: float = key(1.0, number, *_TIMEOUT, unit="s", doc="""
        The bound on revoking a producer's access to a load's slots once it cannot answer (its
        session died, or an abort went unanswered): the load is reported failed by then at the
        latest. The zmq plane needs no time; the NIXL plane withdraws the session's window of the
        pool at once and needs ``DRAIN_S`` (50 ms) more (so at least 0.1 s with it). A NIXL pool not
        in shared memory cannot be withdrawn from: its slots stay held past this, logged, and its
        producer is dialled again each time until it accepts a handshake or is proven gone.""")

    # ---- sessions -----------------------------------------------------------
    handshake_timeout_s: float = key(5.0, number, *_TIMEOUT, unit="s", doc="""
        How long a new session may take to complete its hello/hello_ack.""")

    connect_timeout_s: float = key(2.0, number, *_TIMEOUT, unit="s", doc="""
        How long a dial to a producer may wait for the TCP connection. A dial that gets no
        answer within it fails its loads (``connect_timeout``); one that is refused (nothing
        listens at the address) fails them at once (``connect_refused``). The session's
        ``handshake_timeout_s`` still bounds the whole dial.""")

    heartbeat_interval_s: float = key(1.0, number, *_positive(MIN_DURATION_S, 3600.0), unit="s", doc="""
        Interval between pings on an otherwise idle session.""")

    peer_timeout_s: float = key(5.0, number, *_TIMEOUT, unit="s", doc="""
        Silence longer than this marks the peer lost (a stall of this side is
        not counted); its requests fail. A connection that closes or resets
        ends its session at once.""")

    shutdown_grace_s: float = key(3.0, number, *_positive(MIN_DURATION_S, 600.0), unit="s", doc="""
        How long ``shutdown()`` lets transfers and loads in flight finish and the goodbyes flush before it gives
        up on them; it returns within this time, even when a peer is wedged, plus every open job's result (~25 µs
        per parked id on a 2-core host), a data-plane post already running and libzmq's teardown (decision A13).""")

    # ---- limits -------------------------------------------------------------
    max_peers: int = key(128, integer, *_within(1, 4096), unit="peers", doc="""
        Maximum concurrent sessions (inbound and outbound together).""")

    max_blocks_per_fetch: int = key(65_536, integer, *_within(1, 1_048_576), unit="blocks", doc="""
        Most keys in one fetch, and blocks in one store job (more raise ValueError); a peer's larger fetch is refused
        (its load fails peer_error, both sides log the limit): keep it equal across prefill and decode.""")

    max_pending_fetches_per_peer: int = key(1024, integer, *_within(1, 1_048_576), unit="fetches", doc="""
        Maximum fetches one peer may have waiting for their blocks, naming at most 256 keys per allowed fetch in
        all, its first waiting one excepted (bounded by max_blocks_per_fetch); more are refused (too_many_pending).""")

    max_message_bytes: int = key(1_048_576, integer, *_within(4096, 268_435_456), unit="bytes", doc="""
        Largest control-message header accepted (1 MiB by default); bigger ones are answered with an
        error (``oversize``) and dropped, and one over twice this closes the connection (libzmq's
        limit: the sender sees ``peer_disconnected``). Give producers and consumers the same value.""")

    hash_seed: str = key("", text, max_len(1024), doc="""
        Block-hash seed advertised in the handshake; both sides must agree, or
        the session is refused. Empty means "not set".""")

    # ---- data path ----------------------------------------------------------
    data_plane: str = key("zmq", None, in_(("zmq", "nixl")), doc="""
        How block bytes travel: ``zmq`` (payload frames on the control
        connection; no extra dependency) or ``nixl`` (one-sided WRITEs through
        NIXL/UCX: shared-memory copies (CMA) on one host, RDMA across hosts;
        ~1.9x the zmq plane's throughput on one host, docs/dataplane.md). Both peers must
        use the same plane (checked in the handshake).""")

    backends: tuple[str, ...] = key(("UCX",), names,
                                    text="1..16 names (`[A-Za-z0-9_]`, ≤ 64), NIXL's case, no storage one", doc="""
        ``data_plane="nixl"`` only: the NIXL backend plugins to create, by NIXL's names, as
        vLLM's ``p2p`` tier takes them (``["UCX"]``; ``UCX_*`` environment variables tune UCX, see
        docs/dataplane.md). A plugin missing here fails the start with its name.""")

    nixl_progress_interval_s: float = key(0.001, number, *_positive(0.0001, 0.05), unit="s", doc="""
        ``data_plane="nixl"`` only: the longest the manager waits between two calls into NIXL
        while a peer may be writing into its pool or a WRITE of its own is in flight. A batch's
        header arrives as its WRITE's NIXL notification, which is read (and, on the producer, sent)
        only during those calls, and over UCX tcp a WRITE into this pool advances only then too, so
        this bounds a small request's latency; shorter intervals trade CPU (more ticks during a
        large transfer) for it (decision N17). NIXL's own progress thread is not used (it spins
        ~80 % of a core when idle).""")

    integrity: str = key("xxh3_64", None, in_(("xxh3_64", "none")), doc="""
        Per-block digest taken when blocks are parked and checked by the
        consumer as they land; a mismatch fails the load (``corrupt``) instead of
        reporting bytes that are not the parked ones. ``none`` turns the check
        off. Both peers must agree (checked in the handshake). On by default on
        both planes: it costs ~2 % of the zmq plane's throughput and ~13-15 % of
        the NIXL plane's (P1, docs/decisions.md I12).""")

    digest_threads: int | None = key(None, maybe_integer, *_within(0, 256), text="`null` (sized from the machine), "
                                     "or an integer or integral numeric string, 0 ≤ n ≤ 256 (`0`: no pool)", doc="""
        Threads that take the digests of large stores and check (zmq: copy and check) large
        landings, off the thread that calls the manager and outside its lock: ``null`` (the
        default) sizes the pool from the machine (the CPUs this process may use, capped by a
        cgroup quota, at most 8); ``0`` does all of it on the calling thread, under the lock (the
        engine's thread then pays per byte stored). Small stores (≤ 64 KiB) and landings (≤ 1 MiB)
        are always done on the calling thread. Unused with ``integrity="none"`` (decision I14).""")

    gil_switch_interval_s: float | None = key(None, maybe_number, *_positive(0.0001, 0.005), unit="s", doc="""
        Python's thread switch interval while this manager runs (``sys.setswitchinterval``; the
        process's, shared by its managers: the shortest asked for holds, never longer than the
        process's own, and the last one to close puts back what was there unless the process set
        another meanwhile); ``null`` (the default) leaves it alone (5 ms unless the process set it). The I/O loop and the digest pool take the interpreter lock back after every wait
        and every block's digest, up to one interval late while the engine's thread runs Python:
        beside an engine thread in Python 90-100 % of the time a 1-block request took 4.7-27 ms at
        5 ms and 2.0-3.6 ms at 0.5 ms (``python -m bench.gil``, decision C28).""")

    instance: str = key("", text, max_len(128), doc="""
        Name this manager gives itself in handshakes. Sessions to one instance share
        fate once its death is proven (a redial refused, or its address answering for a
        new instance; a closed connection or silence proves nothing, I23, I33): new loads
        to its siblings then fail fast (``instance_down``) until one is heard again (B11); a sibling
        heard since outlived that rank, whose later refusals condemn nothing (I37). Loads already out
        keep their deadlines. Give every rank of a pod the same value; empty: a random name each.""")

    # ---- security (docs/security.md) -----------------------------------------
    auth: str = key("none", None, in_(("none", "curve")), doc="""
        ``curve``: every connection is authenticated and encrypted with libzmq CURVE, and only
        peers whose public certificate is in ``auth_allowed_keys_dir`` get in. ``none``: plain TCP,
        anyone who can reach ``host:port`` can talk to this tier (a loud warning is logged when
        ``host`` is not a loopback address).""")

    auth_secret_key_file: str = key("", text, max_len(4096), matches_re(r"[^\x00]*"), shape="a file path", doc="""
        This instance's secret certificate (``NAME.key_secret`` from ``kvtier keys generate``).
        Required with ``auth=curve``, refused without it; ``NAME`` is this instance's principal.""")

    auth_allowed_keys_dir: str = key("", text, max_len(4096), matches_re(r"[^\x00]*"), shape="a directory path", doc="""
        Directory of the public certificates (``*.key``) of every peer allowed in; a file's stem is that
        peer's principal (one key under two names is refused). A producer's certificate lists its
        ``endpoints`` in its metadata, which is how a consumer knows the key to expect before it dials.
        Required with ``auth=curve``, refused without it.""")

    allowed_peers: tuple[str, ...] = key(("*",), peers,
                                         text='list of `"*"`, `"host:port"`, `"host"` or CIDR (`"10.0.0.0/8"`), non-empty',
                                        doc="""
        Producer endpoints this tier may dial when a request's ``kv_transfer_params`` name them:
        ``"host:port"``, ``"host"`` (any port), a CIDR network, or ``"*"`` (any: the default, for
        compatibility; set it in production, see docs/security.md). A request naming another
        endpoint is refused before any socket exists: lookup says MISS and the engine recomputes.""")

    # ---- the symmetric path (remote_kv_source; docs/integrations/vllm.md, decisions Y1-Y16) ------
    serve_external: bool = key(False, flag, doc="""
        Answer peers' probes from this engine's own tiers (the producer side of the symmetric
        path): a peer's request with ``remote_kv_source`` naming this tier fetches whatever prefix
        blocks this engine holds. Off by default: a probe tells the peer whether a prompt was
        served here and lets it read that prompt's KV, so turn it on only among instances that may
        share their caches (with ``auth="curve"`` and ``serve_allowed_principals`` across
        tenants). Consumers probe whether or not this is on.""")

    serve_allowed_principals: tuple[str, ...] = key(("*",), principals,
        text='list of principal names (certificate stems) or `["*"]`, non-empty', doc="""
        With ``serve_external``: the authenticated principals (``auth="curve"`` certificate stems)
        whose probes are answered; others are refused ``not_serving``. ``["*"]``: every peer
        allowed to connect. Anything but ``["*"]`` needs ``auth="curve"`` (without authentication
        a principal is whatever the peer claims).""")

    probe_timeout_s: float = key(1.0, number, *_TIMEOUT, unit="s", doc="""
        The longest a symmetric request's lookups answer RETRY (the engine defers the request)
        for one round: from the round's first key, the dial and handshake, the probe and the
        peer's reply included. Then the keys answer MISS and the engine computes them.""")

    serve_lookup_timeout_s: float = key(0.25, number, *_TIMEOUT, unit="s", doc="""
        How long a producer waits for blocks its engine reports pending (on their way into its
        primary tier), or its serve windows have not reached, before answering a probe miss. Must be below
        ``probe_timeout_s``, so a fleet with one config answers before its consumers give up.""")

    offer_timeout_s: float = key(10.0, number, *_TIMEOUT, unit="s", doc="""
        How long a producer keeps blocks pinned for a peer's round that was answered but not
        fetched; then the pins are released and the peer told ``offer_expired``.""")

    serve_max_rounds_per_peer: int = key(256, integer, *_within(1, 1_048_576), unit="rounds", doc="""
        Live symmetric rounds one peer may have on this producer; more probes are refused ``serve_busy``.""")

    serve_max_probes_per_round: int = key(8, integer, *_within(1, 1024), unit="probes", doc="""
        Probes one round may carry (a round grows by the keys an engine step looks up); more end
        the round ``serve_busy``.""")

    serve_max_pinned_blocks_per_peer: int = key(16384, integer, *_within(1, 1 << 30), unit="blocks", doc="""
        Distinct engine blocks one peer's rounds may keep pinned (one several rounds pin counts once);
        a lookup pins what fits (blocks pinned already cost nothing) and answers the rest miss. It is
        also the keys (at least 4,096) one probe may name and one serve window asks the engine about;
        a peer's rounds may have four times that waiting (past it: miss, a new round ``serve_busy``).""")

    serve_max_pinned_fraction: float = key(0.5, number, *_positive(0.001, 1.0), doc="""
        Fraction of the block pool all peers' rounds may keep pinned (distinct blocks), so the engine
        keeps room to compute; it bounds lookups as ``serve_max_pinned_blocks_per_peer`` does.""")

    # ---- polling ------------------------------------------------------------
    poll_interval_s: float = key(0.001, number, *_positive(0.0001, 1.0), unit="s", doc="""
        Accepted and checked, no longer used: the I/O loop has no polling
        cadence (it sleeps until input or its next deadline, decision C12).""")

    background_poll: bool = key(False, flag, doc="""
        Run kvtier's I/O loop on its own thread (``kvtier-io``): engine calls
        only hand it a command and return.  When false, the loop runs on the
        caller's thread: each engine call is applied at once and ``poll()`` /
        ``get_finished_jobs()`` read the network.  The vLLM adapter turns it
        on unless the entry sets it.""")

    def __attrs_post_init__(self) -> None:
        problems = [exc for rule in CROSS_FIELD_RULES if (exc := rule.problem(self)) is not None]

        def no(message: str, *keys: str) -> None:
            problems.append(TierConfigError(message, keys=keys))

        if self.data_plane == "nixl" and self.revoke_timeout_s < NIXL_MIN_REVOKE_S:  # else: PlaneError at start
            no(f"revoke_timeout_s={self.revoke_timeout_s} is below {NIXL_MIN_REVOKE_S} s, the least the nixl plane "
               "needs to withdraw a window and drain it", "revoke_timeout_s", "data_plane")
        if self.metrics_port and self.metrics_port == self.port:  # else: "Address already in use" at start
            no(f"metrics_port={self.metrics_port} is port too: the Prometheus endpoint and the producer's listener "
               "cannot bind one port; pick another (0: a free one)", "port", "metrics_port")
        if self.serve_allowed_principals != ("*",) and self.auth != "curve":
            no(f"serve_allowed_principals={list(self.serve_allowed_principals)!r} needs auth='curve': without "
               "authentication a principal is whatever the peer claims (use [\"*\"] or turn CURVE on)",
               "serve_allowed_principals", "auth")
        if "*" in self.serve_allowed_principals and len(self.serve_allowed_principals) > 1:
            no("serve_allowed_principals lists \"*\" with other names: \"*\" already allows every peer",
               "serve_allowed_principals")
        given = [k for k in ("auth_secret_key_file", "auth_allowed_keys_dir") if getattr(self, k)]
        if self.auth == "curve":
            for key in ("auth_secret_key_file", "auth_allowed_keys_dir"):
                if key not in given:
                    no(f"auth='curve' needs {key} (see docs/security.md)", "auth", key)
        elif given:
            # Fail closed: key files without auth='curve' would run unauthenticated while the
            # operator believes otherwise (a forgotten auth key, a template switched half-way).
            no(f"{' and '.join(given)} set but auth='none': nothing would be authenticated; set auth='curve' to "
               f"use the keys, or remove {'them' if len(given) > 1 else 'it'}", "auth", *given)
        raise_all(problems)  # every problem at once, not one per attempt

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
                close = difflib.get_close_matches(key.lower().replace("-", "_"), known, n=1, cutoff=0.6)  # FOO_S too
                hint = (f" ({_NOT_OURS[key]})" if key in _NOT_OURS
                        else f" (did you mean {close[0]!r}?)" if close else "")
                parts.append(f"{safe_repr(key)}{hint}")
            # the did-you-mean is the useful part (every key lives in the docs); bad values too, at once
            raise_all([TierConfigError(
                "unknown kvtier tier config key(s): " + ", ".join(parts)
                + ". Every key, with its range: docs/configuration.md",
                keys=tuple(unknown),
            ), *field_problems(cls, mapping)])
        _refuse_builtin_type(mapping)
        try:
            return cls(**mapping)
        except TierConfigError:  # the first bad value stopped construction: name every one
            raise_all(field_problems(cls, mapping))
            raise

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


# keys of vLLM's p2p tier with no kvtier counterpart: a did-you-mean would point at an unrelated key
_NOT_OURS = {"num_threads": "vLLM p2p's UCX thread count: kvtier has no such key, drop it"}
_KEYS: tuple[str, ...] = tuple(a.name for a in attrs.fields(TierConfig))

#: ``type`` names vLLM 0.33.0 registers for its own secondary tiers: its factory looks a registered
#: name up before ``module_path``, so such an entry would load vLLM's tier, not kvtier.
VLLM_BUILTIN_TIERS: frozenset[str] = frozenset({"p2p", "fs", "obj", "kvcr", "example"})


def _refuse_builtin_type(mapping: Mapping[str, Any]) -> None:
    """A kvtier entry whose ``type`` names one of vLLM's own tiers (``"p2p"``) is a mistake either
    way: vLLM loads its tier, not kvtier (or, through the Python API, the entry was copied from a
    ``p2p`` config).  Say which ``type``/``module_path`` to write (docs/migrating-from-p2p.md)."""
    name = mapping.get("type")
    if isinstance(name, str) and (builtin := name.strip().lower()) in VLLM_BUILTIN_TIERS:
        what = ("vLLM's factory looks registered names up before module_path, so this entry would load vLLM's own tier"
                if name == builtin else f"vLLM matches names exactly, so it would look a class {name!r} up in "
                "module_path and fail")  # only the exact name is in vLLM's registry
        raise TierConfigError(f"type={name!r} names vLLM's built-in {builtin!r} tier, not kvtier: {what}. Write "
                              '"type": "KvTierSecondaryTier", "module_path": "kvtier.integrations.vllm" '
                              "(docs/migrating-from-p2p.md maps the p2p keys)", keys=("type",))

DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {a.name: a.default for a in attrs.fields(TierConfig)}
)
"""Every key's code default (read-only)."""


# ---- cross-field relations ------------------------------------------------


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

    def problem(self, cfg: TierConfig) -> TierConfigError | None:  # None: the relation holds
        a = getattr(cfg, self.lhs)
        b = getattr(cfg, self.rhs)
        ok = _OPS[self.op](a, self.factor * b)
        if not ok:
            return TierConfigError(
                f"{self.lhs}={safe_repr(a)} and {self.rhs}={safe_repr(b)} violate "
                f"{self.text()}: {self.why}",
                keys=(self.lhs, self.rhs),
            )


_OPS: dict[str, Callable[[float, float], bool]] = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}

CROSS_FIELD_RULES: tuple[CrossFieldRule, ...] = (
    CrossFieldRule(
        "peer_timeout_s", ">=", 2, "heartbeat_interval_s",
        "a peer must be allowed to miss at least one heartbeat before it is declared lost",
    ),
    CrossFieldRule(
        "load_timeout_s", ">", 1, "fetch_supply_timeout_s",
        "the producer's answer to a fetch waiting for blocks must reach the consumer before it gives up "
        "(across engines too: keep producers' fetch_supply_timeout_s below their consumers' load_timeout_s)",
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
        k: Key = a.metadata[KEY]
        lo, hi = bounds(k.checks)
        rows.append(ConfigRow(a.name, a.default, k.unit, k.doc, describe(k), lo, hi))
    return rows
