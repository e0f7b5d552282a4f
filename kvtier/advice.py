"""What to change, per reason code: the operator's half of every failure kvtier reports.

The spec says what each reason *means* (``spec/lifecycle.toml [reasons]``, generated into
:data:`kvtier.lifecycle.REASON_DOCS`); this table says **what to look at or change** when it shows
up.  ``docs/troubleshooting.md`` is rendered from both (``python -m tools docs``), ``kvtier why``
prints both for one request, and a test fails when a reason has no advice (decision E2).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from kvtier.lifecycle import Reason
from kvtier.wire.codec import WireReason

__all__ = ["ADVICE", "HANDSHAKE_FIELDS", "WIRE_ADVICE", "advice", "handshake_hint"]

_R = Reason

ADVICE: Mapping[Reason, str] = MappingProxyType({
    # ---- the producer's parked blocks --------------------------------------------------------
    _R.REAPED: "No consumer fetched the blocks within `unbound_store_timeout_s`: it came later (its side then "
               "says `reaped` too) or never (the proxy sent the decode elsewhere, or the request was cancelled "
               "before decode). If late, raise it above your worst prefill→decode admission delay, or find why "
               "decode admits late (proxy backlog, decode queue: `kvtier_oldest_parked_age_seconds`). A late "
               "consumer recomputes; nothing is lost but time.",
    _R.ABORTED: "The consumer gave up or its engine finished the request first: look at the consumer's side "
                "(`kvtier why` there) for its reason (`load_timeout`, `cancelled`, `corrupt`).",
    _R.TRANSFER_FAILED: "The data plane could not move the blocks: check the producer's log for the plane's "
                        "error (UCX/NIXL with `data_plane=\"nixl\"`, docs/dataplane.md) and the network between "
                        "the two hosts.",
    _R.TRANSFER_TIMEOUT: "A transfer ran longer than `transfer_timeout_s`: the link is slower than the request is "
                         "large (`kvtier_transfer_throughput_bytes_per_second`), or the consumer stopped reading. "
                         "Raise `transfer_timeout_s` for very large requests.",
    _R.SUPPLY_TIMEOUT: "The fetch arrived before the blocks and they never came within `fetch_supply_timeout_s`: "
                       "the prefill engine did not store them (failed prefill, wrong `kv_request_id` in the "
                       "prefill leg) or is slower than that. Check that both legs carry the same id.",
    _R.INCOMPLETE: "The prefill request ended without storing every block the decoder asked for: the two "
                   "engines disagree on the prompt (different prompt text or tokenizer, block size, "
                   "`--prefix-caching-hash-algo`) or the prefill was cut short.",
    _R.NOTHING_STORED: "The prefill request ended without storing anything under this id (its engine could not "
                       "store the blocks: a full CPU tier, `cpu_bytes_to_use`). The decoder recomputes.",
    _R.DRAINED: "The engine called `drain_jobs` (vLLM: `reset_cache`) while the id waited for its consumer (or, "
                "fetched, for blocks its engine had not stored). "
                "Expected during a cache reset; the consumer recomputes.",
    _R.SHUTDOWN: ("This manager or its peer shut down. Routine during a restart or a rolling upgrade. A producer's "
                  "store jobs may end shutdown while the consumer still landed and checked every block of the "
                  "transfer and reports success: the producer cannot know the bytes arrived, so it releases "
                  "them as failed (nothing wrong was delivered)."),
    _R.ROUND_FINISHED: "A store arrived after the id's blocks were already transferred: the engine stored more "
                       "chunks than the decoder fetched (a prefill that continues after the hand-off). Harmless.",
    _R.ID_IN_USE: "Two prefill requests used one `kv_request_id`, or the two legs of one request carry different "
                  "`life` values: make the proxy generate a fresh id per client request (a uuid4), and when it "
                  "sends `life`, send the same value in both legs (`remote_decoder.life` = "
                  "`remote_prefiller.life`, e.g. the router's request uuid).",
    # ---- refused fetches -------------------------------------------------------------------------
    _R.DUPLICATE_FETCH: "Two decoders (or two rounds) fetched one id: the proxy sent one `kv_request_id` to two "
                        "decode requests. One id per client request.",
    _R.TOO_MANY_PENDING: "One consumer has `max_pending_fetches_per_peer` fetches waiting for blocks not yet "
                         "stored, or, with one waiting already, more than 256 keys per allowed fetch in all: "
                         "decode runs far ahead of prefill. Raise the limit or send the decode leg after the "
                         "prefill response.",
    _R.ALREADY_SERVED: "The id's blocks already went to a consumer: a second decode request reused the id, or a "
                       "retry after a success. One id per client request.",
    _R.NOT_AUTHORISED: "The producer request named another consumer for this id (`remote_decoder.consumer`): "
                       "check the proxy's value against this decoder's CURVE principal (its key file's stem).",
    # ---- the consumer's load -----------------------------------------------------------------------
    _R.LOAD_TIMEOUT: "The producer did not finish within `load_timeout_s`: it is stalled or overloaded "
                     "(`kvtier_tick_lag_seconds` there), the link is slow for the request's size, or the "
                     "prefill stored its blocks late or never (then the producer's `fetch_supply_timeout_s` "
                     "must be below this `load_timeout_s` for its `supply_timeout` answer to come first). Look "
                     "at the producer's side of the id (`kvtier why` against its metrics endpoint). Raise "
                     "`load_timeout_s` only for very large requests.",
    _R.CANCELLED: "The engine finished the request while its load ran (a client disconnect, a preemption). "
                  "Its result (which frees the load's slots) waits for the producer's answer to our abort: "
                  "while the producer still sends us data that answer may queue behind it, up to "
                  "`load_timeout_s` + `abort_ack_timeout_s` + `revoke_timeout_s` after the load was submitted "
                  "(on zmq the load then ends alone, its session kept: L20). "
                  "Nothing to change "
                  "unless it is frequent.",
    _R.DUPLICATE_LOAD: "The engine submitted a second load for an id while one was live: an engine adapter bug, "
                       "or a request id reused by the proxy.",
    _R.ONE_FETCH_PER_ID: "The id was already loaded once: each `kv_request_id` is fetched at most once. The "
                         "proxy must not send the same id to a second decode request.",
    _R.INCOMPLETE_DATA: "The producer said done but blocks were missing: a producer bug or a corrupted stream; "
                        "report it with both sides' logs.",
    _R.CORRUPT: "A block's bytes at landing differ from the digest its sender took. On a PD load the "
                "producer took it when it parked the block: the prefill engine reused or overwrote a "
                "block before its store job's result (an engine bug: blocks must stay unchanged until the "
                "result; a change made before the loop took the store's digest is not caught, decision I42). "
                "On a symmetric load the serving peer took it as its transfer began (Y9): that engine changed "
                "a block it had pinned for us (an engine bug). On either, the bytes may have changed on the "
                "way (a faulty NIC, link or proxy; TCP's checksum misses some) or in memory. To tell where, keep `integrity = \"xxh3_64\"` on both sides; "
                "never turn it off to make this go away. A `bad_payload` wire error logged just before it means "
                "the producer sent payload frames that are not the blocks it named (a producer bug).",
    _R.TRANSFER_STALLED: "The data plane kept references to a cancelled transfer past `transfer_timeout_s`; the "
                         "session was ended to free them. Check the data plane (NIXL/UCX logs) and the link.",
    _R.ABORT_UNACKNOWLEDGED: "The producer did not answer our abort within `abort_ack_timeout_s` of the last data "
                             "it sent us (on zmq pings and pongs do not count, however many; on nixl, whose writes "
                             "bypass the connection, they do): it is stalled or unreachable. Check the producer process and the network. "
                             "(On zmq a producer still sending other loads' data is not given up: the aborted load "
                             "ends alone, with its own reason, L20. On nixl the answer waits for the WRITEs already "
                             "posted: what the link drains in half abort_ack_timeout_s, T23, and 1 MiB before its "
                             "rate is known.)",
    _R.INSTANCE_DOWN: "A dial to another rank of the same producer instance (same `instance`, same host) was "
                      "refused, or its address answered for a new instance: the pod may be gone, so loads to "
                      "its ranks fail fast until one is heard (once one is, that rank's later refusals change "
                      "nothing, I37). Look at why that rank died (`connect_refused` in the log).",
    # ---- sessions ------------------------------------------------------------------------------
    _R.CONSUMER_LOST: ("Another fetch of the id — another consumer's, or this one's before a reconnect — had "
                       "bound it and its session died: the producer released the blocks then (its `kvtier why` "
                       "names that consumer). The engine recomputes. Frequent: look for decode instances dying or "
                       "cut off mid-load, or a router that retries a request on a second decode instance."),
    _R.PEER_LOST: "The session with the peer died; the log line `session with … ended: <reason>` names why "
                  "(the job then usually carries that reason itself).",
    _R.HANDSHAKE_TIMEOUT: "The peer accepted TCP but did not complete kvtier's handshake within "
                          "`handshake_timeout_s`: it is not a kvtier listener (a wrong `remote_port`), it is "
                          "stalled, or NIXL's agent setup is slow on its host. On the nixl plane a handshake also "
                          "reads three times 64 KiB through the plane before it admits a session, and waits until "
                          "the producer's writes of an earlier session of ours into our slots have drained: on a "
                          "slow link after a cancelled large load raise `handshake_timeout_s`. If the log says "
                          "the dial ended "
                          "before its name lookup answered, no TCP connection was made: this host's DNS "
                          "resolver is slow; fix it or give the producer's address as an IP.",
    _R.HANDSHAKE_MISMATCH: "The two sides differ in protocol version, block size/layout, hash seed, data plane "
                           "or integrity: the log names the field. Use one kvtier release, one model and KV "
                           "layout, the same `--prefix-caching-hash-algo` (and `PYTHONHASHSEED`), `data_plane` "
                           "and `integrity` on both (docs/compatibility.md).",
    _R.SELF_FETCH: "The request named this instance's own address (a router or proxy picked the same instance for "
                   "both ends): on nixl a NIXL agent cannot load from itself. Send such a request without "
                   "remote_prefiller / remote_kv_source (the instance's prefix cache holds its blocks), or run "
                   "`data_plane: zmq`, which can.",
    _R.SESSION_STILL_HELD: "Nothing to change for one: the producer had not yet seen our earlier session end (it "
                           "was stalled, or our new dial raced that session's end); the next dial is admitted. "
                           "Every time: requests name this producer under two names (e.g. `localhost` and "
                           "`127.0.0.1`), and NIXL admits one session per consumer agent: use one name.",
    _R.PEER_TIMEOUT: "Nothing was heard from the peer for `peer_timeout_s`: the process hangs (a long GC or "
                     "engine step holding the tier's lock) or the network dropped packets.",
    _R.PEER_DISCONNECTED: "The peer closed the connection (it exited, restarted, or the connection reset). "
                          "Routine when a peer restarts; frequent ones point at the network. A producer that shut "
                          "down while more data was queued to us than its shutdown_grace_s let through looks the "
                          "same here (its own record says shutdown): give it a longer grace. Right after we sent a "
                          "large fetch (thousands of keys): a message over twice the peer's max_message_bytes "
                          "closes the connection; give both sides the same max_message_bytes.",
    _R.PEER_RESTARTED: "The peer came back with a new session: it restarted. Requests bound to the old session "
                       "failed and recompute.",
    _R.CONNECT_REFUSED: "Nothing listens at the producer address the request named, or no route leads there: "
                        "check the proxy's `remote_host`/`remote_port` against the prefill engine's `host` and "
                        "`port` (+ its data-parallel rank), that the prefill engine runs, and this host's route "
                        "to it.",
    _R.UNRESOLVED_HOST: "The producer's host name in the request does not resolve on this host: check the proxy's "
                        "`remote_host` spelling and this host's resolver (/etc/resolv.conf, /etc/hosts); an IP "
                        "address needs no lookup. The producer itself may be fine.",
    _R.CONNECT_TIMEOUT: "The producer address did not answer TCP within `connect_timeout_s`: a firewall drops "
                        "the packets, or the address is not routable from this host.",
    _R.AUTH_FAILED: "The CURVE handshake failed: both sides must run the same `auth`; with `auth = \"curve\"` "
                    "each side's public certificate (`NAME.key` from `kvtier keys generate`) must be in the "
                    "other's `auth_allowed_keys_dir`, and the producer's certificate must list the endpoint "
                    "the consumer dials (`--endpoint`; without one naming it nothing is dialled). The log line "
                    "says which side is missing what "
                    "(docs/security.md). With `auth = \"none\"` here, an address that is not a kvtier listener "
                    "(a service that hangs up) reads the same: check `remote_host` and `remote_port`.",
    _R.PLANE_FAULT: "The data plane reported the path to this peer broken (on NIXL: a remote-disconnect error at a "
                    "WRITE), so the session was ended; the next load dials a fresh one. Frequent ones point at the "
                    "network between the hosts or at a peer whose NIXL agent restarted (docs/dataplane.md).",
    _R.SEND_FAILED: "The transport could not send to the peer (its connection is gone): see the session's end "
                    "in the log.",
    _R.TOO_MANY_PEERS: "This manager (or the peer) already has `max_peers` sessions: raise `max_peers`, or "
                       "find the peers holding sessions they do not use.",
    _R.PEER_NOT_ALLOWED: "The request named a producer endpoint not in `allowed_peers`: add the prefill "
                         "endpoints (or their network) to `allowed_peers` — with data parallelism, every rank's "
                         "port or the host alone — or fix the proxy if it should not name that address "
                         "(docs/security.md).",
    _R.IDLE_EVICTED: "An idle inbound session was ended to admit a new peer at `max_peers`: raise `max_peers` if "
                     "this is frequent.",
    # ---- engine-side refusals ---------------------------------------------------------------------
    _R.LOCAL: "(a success) The request had no remote decoder: nothing to hand off.",
    _R.NOT_NEEDED: "(a success) The decoder needed none of the blocks (a local prefix-cache hit) and released "
                   "them at once.",
    _R.INVALID_PARAMS: "The request's `kv_transfer_params` were malformed: the warning in the log names the "
                       "field; fix the proxy (docs/integrations/vllm.md, What the PD proxy sends).",
    _R.NOT_A_CONSUMER: "A load for a request whose params name no remote producer: the proxy sent the decode "
                       "leg without `remote_prefiller`.",
    _R.BAD_JOB: "The engine handed the tier a malformed job (an adapter bug); the log has the error.",
    _R.JOB_REFUSED: "The manager refused the job; the log has the error (often a shutdown in progress).",
    # ---- the symmetric path ------------------------------------------------------------------------
    _R.PROBE_TIMEOUT: "The peer did not answer the probe within `probe_timeout_s` (dial and handshake "
                      "included): it is unreachable, overloaded or not serving. The engine computes the "
                      "blocks; check the router's choice of peer.",
    _R.NOT_SERVING: "The peer does not serve us: turn `serve_external` on there, and with CURVE add our "
                    "principal to its `serve_allowed_principals`.",
    _R.SERVE_BUSY: "The peer is at one of its serve budgets (`serve_max_*`: rounds, probes per round, or a "
                   "pinned-block budget of 0), or our earlier rounds' keys still wait for its engine "
                   "(`serve_max_pinned_blocks_per_peer` keys): raise them there, or spread symmetric requests "
                   "over more peers.",
    _R.NOT_OFFERED: "A load named blocks the peer's probe reply did not offer (or the round had ended): an "
                    "engine adapter bug.",
    _R.OFFER_EXPIRED: "We did not fetch offered blocks within `offer_timeout_s` (the peer's): this engine "
                      "deferred the request too long. Raise `offer_timeout_s` on the peer if frequent.",
    _R.NOT_ANNOUNCED_PROBE: "The engine looked keys up for a symmetric request it never announced: an engine "
                            "adapter bug.",
    # ---- ignore-rule labels (kvtier_ignored_inputs_total) -----------------------------------------
    _R.NO_RECORD: "An input for an id this side no longer (or never) knew: routine for late messages; a "
                  "steady rate means ids are pruned too early (`tombstone_retention_s`).",
    _R.STALE: "A late or duplicate input, dropped: routine.",
    _R.NOT_BOUND: "An input about an id not bound to that peer, dropped: routine.",
    _R.PEER_ERROR: "The peer refused one of our messages as malformed (e.g. over its `max_message_bytes`): "
                   "align `max_message_bytes` and `max_blocks_per_fetch` on both sides. If our log shows a "
                   "\"bad message from\" that peer instead, it sent one we could not read: check both "
                   "sides run the same kvtier release.",
    _R.LATE_DATA: "Block data for a load that had already ended, dropped and never written: routine after an "
                  "abort.",
    _R.NOT_ANNOUNCED: "A load for a request never announced (`on_new_request`): an engine adapter bug.",
    _R.IN_GRACE: "An input during shutdown's grace, which changes nothing: routine.",
    _R.REFERENCED: "The data plane still references blocks: wait for its release; `kvtier_quarantined_blocks` "
                   "counts what it holds too long.",
})
"""Reason -> what the operator should look at or change (Markdown)."""

WIRE_ADVICE: Mapping[WireReason, str] = MappingProxyType({
    WireReason.MALFORMED: "Something that is not kvtier sends to this port (a scanner, a health check, "
                          "another service on a reused port). Restrict who can reach it (docs/security.md).",
    WireReason.UNKNOWN_TYPE: "A peer of another kvtier release sends a message type this one does not know: "
                             "upgrade both sides (docs/compatibility.md).",
    WireReason.OVERSIZE: "A message over `max_message_bytes` (or a fetch over `max_blocks_per_fetch`): align "
                         "the limits on both sides, or raise them for very long prompts.",
    WireReason.BAD_FIELD: "A message with a missing, mistyped or out-of-range field: a peer of another release "
                          "or a broken one (docs/compatibility.md).",
    WireReason.BAD_PAYLOAD: "Payload frames of the wrong number or size: the two sides disagree on the block "
                            "size, or a peer is broken.",
    WireReason.VERSION_MISMATCH: "A hello of another protocol version: v2 and v3 refuse each other; upgrade "
                                 "both sides to one release (docs/compatibility.md).",
})
"""The wire codec's reasons (``kvtier_wire_errors_total``) -> what to change."""


HANDSHAKE_FIELDS: Mapping[str, str] = MappingProxyType({
    "version": "run kvtier releases that speak the same wire protocol on both sides (docs/compatibility.md)",
    "block_bytes": "serve the same model with the same KV dtype, block size and tensor/pipeline/context "
                   "parallel sizes on both engines",
    "layout": "serve the same model with the same KV dtype, block size, tensor/pipeline/context parallel "
              "sizes and KV cache layout (NHD/HND, the attention backend's) on both engines",
    "hash_seed": "set config key hash_seed to the same value on both tiers (under vLLM: the same "
                 "--prefix-caching-hash-algo on both engines, and the same PYTHONHASHSEED for a "
                 "non-cryptographic one)",
    "data_plane": "set config key data_plane to the same value on both tiers",
    "digest": "set config key integrity to the same value on both tiers",
    "descriptor": "give both tiers a working NIXL with the same backends (docs/dataplane.md)",
})
"""A ``hello_reject``'s field -> what to change so both sides agree (the log line says it)."""


def differs(field: str, ours: str, theirs: str) -> str:
    """``"<field> differs (ours X, theirs Y)"``, the words of a fingerprint of ``key=value`` words
    that differ named first (``layout differs in tokens_per_hash: ours 16, theirs 32; whole: ...``):
    two fingerprints of some 250 characters are not for comparing by eye."""
    words = [dict(w.partition("=")[::2] for w in text.split()[1:] if "=" in w) for text in (ours, theirs)]
    keys = [k for k in {**words[0], **words[1]} if words[0].get(k) != words[1].get(k)]
    head = ours.split()[:1] != theirs.split()[:1]  # another fingerprint version: every word may differ
    if not keys or head:
        return f"{field} differs (ours {ours}, theirs {theirs})"
    named = "; ".join(f"{k}: ours {words[0].get(k, '(none)')}, theirs {words[1].get(k, '(none)')}" for k in keys)
    return f"{field} differs in {named} (whole: ours {ours}, theirs {theirs})"


def handshake_hint(field: str) -> str:
    """``"; <what to change>"`` when the handshake refused ``field`` (``""`` for an unknown one)."""
    hint = HANDSHAKE_FIELDS.get(field, "")
    return f"; {hint}" if hint else ""


#: The serving side of a symmetric round that withdrew its offer (``kvtier why``'s ``offer`` entries):
#: the same reason asks for another change there than on the side that did not fetch.
OFFER_ADVICE: Mapping[Reason, str] = MappingProxyType({
    Reason.OFFER_EXPIRED: "The peer did not fetch the blocks we offered within our `offer_timeout_s`: its engine "
                          "deferred the request (routine under load), and our pins were released. Raise "
                          "`offer_timeout_s` here if it is frequent and the peer's requests do run later.",
    Reason.DRAINED: "`drain_jobs` (vLLM: `reset_cache`) here withdrew the offer before the peer fetched it: the "
                    "peer computes the blocks itself. Expected during a cache reset.",
    Reason.SHUTDOWN: "This manager shut down before the peer fetched the blocks it was offered: the peer computes "
                     "them itself. Routine during a restart.",
})


def advice(reason: str, role: str = "") -> str:
    """The advice for a reason code (a lifecycle or wire reason; ``peer_reported_<code>`` names the
    peer's view of one of ours) told of a request in ``role`` (``kvtier why``'s roles: an ``offer``
    withdrawn by a serving peer has advice of its own); ``""`` for an unknown code."""
    if role == "offer":
        try:
            return OFFER_ADVICE[Reason(reason)]
        except (ValueError, KeyError):
            pass
    code = reason.removeprefix("peer_reported_")
    try:
        return ADVICE[Reason(code)]
    except ValueError:
        pass
    try:
        return WIRE_ADVICE[WireReason(code)]
    except ValueError:
        return ""
