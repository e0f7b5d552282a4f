"""Check a vLLM ``--kv-transfer-config`` for kvtier before an engine starts (``kvtier check-config``).

vLLM validates a kvtier entry only when it builds the tier, and two mistakes never reach kvtier
at all, because vLLM 0.33.0's ``SecondaryTierFactory`` decides them first:

* a ``type`` vLLM registers itself (``"p2p"``, ``"fs"``, ``"obj"``, ``"kvcr"``, ``"example"``) wins
  over ``module_path``: the engine runs vLLM's own tier and silently ignores kvtier's keys;
* ``TieringOffloadingSpec`` turns a tier entry's ``"backpressure"`` key (even ``null``) and a
  non-empty top-level ``"backpressure"`` block into a back-pressure detector that kvtier refuses
  (a top-level ``"backpressure": null`` or ``{}`` is ignored by vLLM).

A ``MultiConnector`` config is checked through its ``connectors``: each one vLLM builds as a
connector of its own, and kvtier's entry sits in the offloading one among them.

This module reads the JSON the way vLLM does (no vLLM import) and validates every kvtier entry
with :class:`kvtier.config.TierConfig`, so those mistakes are found on the operator's terminal,
each with the key to change.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Mapping
from typing import Any

from kvtier.config import DEFAULTS, VLLM_BUILTIN_TIERS, TierConfig
from kvtier.config_kinds import WrittenNumber
from kvtier.dataplane import plane_unavailable
from kvtier.params import PeerPolicy, exposures

__all__ = ["BARE_ENTRY_NOTE", "KVTIER_MODULE", "Advice", "check_kv_transfer_config"]

KVTIER_MODULE = "kvtier.integrations.vllm"

#: keys of vLLM 0.33.0's ``p2p`` tier entry (it takes and ignores anything else)
_P2P_KEYS = frozenset({"type", "module_path", "host", "port", "backends", "num_threads", "unbound_store_timeout_s",
                       "locality", "backpressure"})


#: vLLM 0.33.0's ``KVTransferConfig``: the keys its dataclass takes (any other one stops the engine
#: at start) and the values of its two literal keys; a test holds them to vLLM's own class.
TRANSFER_CONFIG_KEYS = frozenset({"kv_connector", "engine_id", "kv_buffer_device", "kv_role", "kv_port",
                                  "kv_connector_extra_config", "kv_connector_module_path", "enable_permute_local_kv",
                                  "kv_load_failure_policy"})
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
LOAD_FAILURE_POLICIES = ("recompute", "fail")


#: the keys of a secondary tier entry kvtier or vLLM's ``p2p`` tier reads
_ENTRY_KEYS = frozenset(DEFAULTS) | _P2P_KEYS


def _json(value: Any) -> str:
    """``value`` as JSON writes it, at most 60 characters."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _objects(value: Any, path: str) -> Any:
    """``(id(object), "its.path.")`` for every JSON object in ``value`` (lists indexed: ``tiers[0].``)."""
    if isinstance(value, dict):
        yield id(value), path
        for k, v in value.items():
            yield from _objects(v, f"{path}{k}.")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _objects(v, f"{path[:-1]}[{i}]." if path else f"[{i}].")


def _as_written(kind: Any) -> Any:
    def parse(text: str) -> Any:
        if len(text) > 4000:  # Python's int and float conversions stop at 4300 digits
            return WrittenNumber(text)
        value = kind(text)
        return value if kind is int or math.isfinite(value) else WrittenNumber(text)
    return parse


def _load(blob: str | Mapping[str, Any], twice: list[str]) -> Mapping[str, Any]:
    """The JSON object; each key an object gives twice is added to ``twice`` (JSON readers, vLLM's
    included, keep the last one silently)."""
    if isinstance(blob, Mapping):
        return blob

    dups: list[tuple[dict[str, Any], str, Any, Any]] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for k, v in items:
            if k in seen:
                dups.append((seen, k, seen[k], v))
            seen[k] = v
        return seen

    try:
        # numbers JSON allows but Python reads as inf or refuses (over 4300 digits) stay as written,
        # so a key's error quotes them (a numeric string is checked like the number)
        doc = json.loads(blob, parse_float=_as_written(float), parse_int=_as_written(int), object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    where = dict(_objects(doc, ""))
    for obj, k, first, last in dups:
        twice.append(f"{where.get(id(obj), '')}{k} is given twice ({_json(first)}, then {_json(last)}): vLLM reads "
                     "the last one; keep one")
    if not isinstance(doc, Mapping):
        raise ValueError(f"a --kv-transfer-config is a JSON object, got {type(doc).__name__}")
    return doc


def check_kv_transfer_config(blob: str | Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """Check a ``--kv-transfer-config`` (JSON text or the parsed object).

    Returns:
        ``(problems, notes)``: each problem names the entry, the key and what to write instead;
        notes say what was checked (one line per kvtier entry; given one tier entry alone, the
        first is :data:`BARE_ENTRY_NOTE`).
    Raises:
        ValueError: not JSON, or not a JSON object.
    """
    twice: list[str] = []
    doc = _load(blob, twice)
    if not set(doc) & TRANSFER_CONFIG_KEYS and set(doc) & _ENTRY_KEYS:
        # one tier entry, not a whole config: check it as the one entry it would be (the note says so)
        lacks = []
        if "type" not in doc and "module_path" not in doc:  # tier keys only, not the two vLLM loads a tier by
            lacks.append('this reads as a tier entry without "type" and "module_path", from which vLLM loads no '
                         f'tier: add "type": "KvTierSecondaryTier", "module_path": "{KVTIER_MODULE}"')
            doc = {**doc, "type": "KvTierSecondaryTier", "module_path": KVTIER_MODULE}
        problems, notes, _ = _check_offloading(_wrapped(doc))
        return twice + lacks + problems, [BARE_ENTRY_NOTE] + notes
    if doc.get("kv_connector") == "MultiConnector":
        problems, notes = _check_multi(doc)
    else:
        problems, notes, _ = _check_offloading(doc)
    return twice + problems, notes


def _wrapped(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 10 << 30,
                                          "secondary_tiers": [entry]}}


class Advice(str):
    """A note that is advice, not a verdict on an entry (the CLI prints it as ``note:``, every
    other note as ``ok:``)."""

    __slots__ = ()


#: The first note of a check given one tier entry: how it was read, not a verdict on it.
BARE_ENTRY_NOTE = Advice("checked as one tier entry, not a whole --kv-transfer-config: as the only entry of "
                         "kv_connector_extra_config.secondary_tiers under \"kv_connector\": \"OffloadingConnector\", "
                         "\"spec_name\": \"TieringOffloadingSpec\" and a \"cpu_bytes_to_use\"; give vLLM the entry "
                         "so wrapped (docs/integrations/vllm.md)")


def _check_multi(doc: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """vLLM's ``MultiConnector`` builds each entry of ``kv_connector_extra_config.connectors`` as a
    connector of its own (a whole ``--kv-transfer-config`` each): kvtier's is the offloading one."""
    extra = doc.get("kv_connector_extra_config")
    children = extra.get("connectors") if isinstance(extra, Mapping) else None
    if not isinstance(children, list) or not children:
        return [("kv_connector is 'MultiConnector' but kv_connector_extra_config.connectors is missing or empty: "
                 'list the connectors there, one of them {"kv_connector": "OffloadingConnector", ...} with the '
                 "kvtier entry (docs/integrations/vllm.md)")], []
    problems = _transfer_config(doc) + _misplaced(extra, "the OffloadingConnector's secondary_tiers (vLLM ignores "
                                                         "them at the MultiConnector's level)")
    if "tier_poll_interval_s" in extra:  # vLLM's own key, read from the offloading connector's config only
        problems.append("kv_connector_extra_config.tier_poll_interval_s belongs in the OffloadingConnector's "
                        "kv_connector_extra_config (vLLM ignores it at the MultiConnector's level)")
    notes: list[str] = []
    found = offloading = 0
    for i, child in enumerate(children):
        if not isinstance(child, Mapping):
            problems.append(f"connectors[{i}] is not a JSON object")
            continue
        if child.get("kv_connector") != "OffloadingConnector":  # another connector (e.g. NixlConnector):
            problems += _transfer_config(child, f"connectors[{i}].")  # vLLM still builds its transfer config
            continue
        offloading += 1
        p, n, k = _check_offloading(child, own_entry_required=False)
        problems += [f"connectors[{i}]: {x}" for x in p]
        notes += [f"connectors[{i}]: {x}" for x in n]
        found += k
    if not offloading:
        problems.append('no entry of MultiConnector\'s connectors is "kv_connector": "OffloadingConnector": '
                        "kvtier runs as a secondary tier of vLLM's offloading connector; add one "
                        "(docs/integrations/vllm.md)")
    elif not found and not problems:
        problems.append("no secondary_tiers entry of an OffloadingConnector loads kvtier "
                        f"(module_path {KVTIER_MODULE!r})")
    if found > 1:
        problems.append(f"{found} secondary_tiers entries load kvtier: one per engine (a second one parks every "
                        "prefill request's blocks again and pins them until its unbound_store_timeout_s)")
    return problems, notes


def _misplaced(extra: Mapping[str, Any], where: str) -> list[str]:
    """kvtier keys one level too high, in a connector's ``kv_connector_extra_config``: vLLM ignores
    them there (an ``allowed_peers`` left out of the entry leaves it open).  ``backpressure`` is
    vLLM's own key at that level, judged on its own."""
    keys = sorted(set(extra) & set(DEFAULTS) - {"backpressure"})
    return [f"kv_connector_extra_config: {', '.join(keys)} belong inside the kvtier entry of {where}"] if keys else []


def _poll_interval(extra: Mapping[str, Any], notes: list[str]) -> list[str]:
    """vLLM's ``tier_poll_interval_s`` (``TieringOffloadingSpec`` reads it with ``float()``; at 0 or
    below it starts no ``vllm_offload_tier_poll`` thread): what vLLM would refuse at start is a
    problem, a deliberate 0 a note (docs/integrations/vllm.md)."""
    if "tier_poll_interval_s" not in extra:
        return []
    value = extra["tier_poll_interval_s"]
    where = f"kv_connector_extra_config.tier_poll_interval_s={value!r}"
    if isinstance(value, bool):
        return [f"{where}: a boolean, which vLLM reads with float() as {float(value)} s; write seconds, e.g. 0.001 "
                "(its default)"]
    if not isinstance(value, (int, float, str)):
        return [f"{where}: vLLM reads it with float() and fails at start; write seconds, e.g. 0.001 (its default)"]
    try:
        seconds = float(value)
    except (ValueError, OverflowError):  # an int too large for a float overflows
        return [f"{where[:120]}: vLLM reads it with float() and fails at start; write seconds, e.g. 0.001 "
                "(its default)"]
    if math.isnan(seconds) or math.isinf(seconds):
        return [f"{where}: not a number of seconds vLLM's tier-poll thread can wait; write seconds, e.g. 0.001 "
                "(its default)"]
    if seconds < 0:
        return [f"{where}: below 0 vLLM silently starts no tier-poll thread; write seconds, e.g. 0.001 "
                "(its default)"]
    if seconds == 0:
        notes.append(Advice("kv_connector_extra_config.tier_poll_interval_s=0: vLLM starts no tier-poll thread, so "
                            "kvtier's results and a peer's lookups wait for the engine's steps (keep the 0.001 "
                            "default unless that is meant)"))
    return []


def _transfer_config(doc: Mapping[str, Any], where: str = "") -> list[str]:
    """What vLLM's ``KVTransferConfig`` refuses before it builds any connector (``where``: the path
    of ``doc`` in the config): a key it does not have, a ``kv_connector`` without a ``kv_role``, a
    role or ``kv_load_failure_policy`` it does not know."""
    problems = []
    for key in sorted(set(doc) - TRANSFER_CONFIG_KEYS, key=str):
        close = difflib.get_close_matches(str(key), sorted(TRANSFER_CONFIG_KEYS), n=1)
        problems.append(f"{where}{_json(key)} is not a key of vLLM's KV transfer config, which refuses to start "
                        "with it: " + (f'did you mean "{close[0]}"?' if close else "remove it"))
    role = doc.get("kv_role")
    if role is None and doc.get("kv_connector") is not None:
        problems.append(f"{where}kv_role is missing: vLLM refuses a kv_connector without one; write "
                        '"kv_role": "kv_both" (the offloading connector stores and loads)')
    elif role is not None and role not in KV_ROLES:
        problems.append(f"{where}kv_role is {_json(role)}: vLLM takes only {', '.join(map(repr, KV_ROLES))}; "
                        'write "kv_role": "kv_both" for the offloading connector')
    policy = doc.get("kv_load_failure_policy", "fail")
    if policy not in LOAD_FAILURE_POLICIES:
        problems.append(f"{where}kv_load_failure_policy is {_json(policy)}: vLLM takes only "
                        f"{' or '.join(map(repr, LOAD_FAILURE_POLICIES))}")
    return problems


def _written(doc: Mapping[str, Any], key: str) -> str:
    """How ``doc[key]`` was written, for a message: its JSON value, or that it is missing."""
    return repr(doc[key]) if key in doc else "missing"


def _cpu_bytes(extra: Mapping[str, Any], notes: list[str]) -> list[str]:
    """``cpu_bytes_to_use``: vLLM's CPU tier under the secondary tiers refuses to start without a
    value ``int()`` takes and that is not 0; missing, it may still come from ``--kv-offloading-size``
    (vLLM adds it), so that is a note."""
    where = "kv_connector_extra_config.cpu_bytes_to_use"
    if "cpu_bytes_to_use" not in extra:
        notes.append(Advice(f"{where} is missing: vLLM refuses to start without it unless --kv-offloading-size "
                            'sets it; write the CPU tier\'s bytes, e.g. "cpu_bytes_to_use": 10737418240 (10 GiB)'))
        return []
    value = extra["cpu_bytes_to_use"]
    try:
        ok = not isinstance(value, bool) and int(value) > 0
    except (TypeError, ValueError, OverflowError):
        ok = False
    if ok:
        return []
    return [f"{where}={json.dumps(value)[:60]}: vLLM reads it with int() as the CPU tier's bytes and refuses "
            'anything else or 0; write a positive number of bytes, e.g. "cpu_bytes_to_use": 10737418240 (10 GiB)']


def _security(cfg: TierConfig) -> str:
    """The SECURITY warnings the engine will log at start with ``cfg`` (params.exposures), said here too."""
    policy = PeerPolicy.from_entries(cfg.allowed_peers, listen_host=cfg.host)
    said = [e.short for e in exposures(host=cfg.host, auth=cfg.auth, serve_external=cfg.serve_external, policy=policy)]
    return "; the engine will warn at start: " + " and ".join(said) + " (docs/security.md)" if said else ""


def _check_offloading(doc: Mapping[str, Any], own_entry_required: bool = True) -> tuple[list[str], list[str], int]:
    """One offloading connector's config: ``(problems, notes, kvtier entries found)``; with
    ``own_entry_required`` a config that loads no kvtier entry (or more than one) is a problem."""
    problems: list[str] = []
    notes: list[str] = []
    # the connector first: with the wrong one, nothing under it is read by kvtier at all
    if doc.get("kv_connector") != "OffloadingConnector":
        problems.append(f"kv_connector is {_written(doc, 'kv_connector')}: kvtier runs as a secondary tier of vLLM's "
                        'offloading connector; write "kv_connector": "OffloadingConnector" (or list it among a '
                        "MultiConnector's connectors)")
    problems += _transfer_config(doc)
    extra = doc.get("kv_connector_extra_config")
    if not isinstance(extra, Mapping):
        return [*problems, ("kv_connector_extra_config is missing: kvtier is configured as one of its "
                            "secondary_tiers (docs/integrations/vllm.md)")], [], 0
    problems += _misplaced(extra, "secondary_tiers (vLLM ignores them here)")
    if extra.get("spec_name") != "TieringOffloadingSpec":
        problems.append(f"kv_connector_extra_config.spec_name is {_written(extra, 'spec_name')}: secondary tiers "
                        'need "TieringOffloadingSpec"')
    problems += _cpu_bytes(extra, notes)
    problems += _poll_interval(extra, notes)
    top_bp = extra.get("backpressure")
    tiers = extra.get("secondary_tiers")
    if not isinstance(tiers, list) or not tiers:
        what = "is missing or empty" if not tiers else f"must be a list of entries, got {type(tiers).__name__}"
        problems.append(f"kv_connector_extra_config.secondary_tiers {what}: add one kvtier entry "
                        '({"type": "KvTierSecondaryTier", "module_path": "kvtier.integrations.vllm", ...})')
        return problems, notes, 0
    found = 0
    builtin: list[str] = []  # entries of vLLM's own tiers: the likely place kvtier was meant to go
    for i, entry in enumerate(tiers):
        where = f"secondary_tiers[{i}]"
        if not isinstance(entry, Mapping):
            problems.append(f"{where} is not a JSON object")
            continue
        kind = entry.get("type")
        kvtier_keys = sorted((set(entry) - _P2P_KEYS) & set(DEFAULTS))
        if isinstance(kind, str) and kind in VLLM_BUILTIN_TIERS:
            if entry.get("module_path") == KVTIER_MODULE or kvtier_keys:
                problems.append(
                    f"{where}: type={kind!r} makes vLLM load its own {kind!r} tier (a registered name wins over "
                    f"module_path){', which ignores ' + ', '.join(kvtier_keys) if kvtier_keys else ''}: for kvtier "
                    f'write "type": "KvTierSecondaryTier", "module_path": "{KVTIER_MODULE}" '
                    "(docs/migrating-from-p2p.md)")
            else:
                builtin.append(f"{where} is vLLM's own {kind!r} tier")
            continue
        if entry.get("module_path") != KVTIER_MODULE and kind != "KvTierSecondaryTier":
            continue  # another out-of-tree tier: not ours to judge
        found += 1
        before = len(problems)
        # vLLM's factory imports module_path and takes the class named by type from it
        if kind != "KvTierSecondaryTier":
            problems.append(f"{where}: type is {_written(entry, 'type')}: vLLM looks this name up in module_path; "
                            'write "type": "KvTierSecondaryTier"')
        if entry.get("module_path") != KVTIER_MODULE:
            problems.append(f"{where}: module_path is {_written(entry, 'module_path')}: vLLM imports the tier class "
                            f'from it; write "module_path": "{KVTIER_MODULE}"')
        if "backpressure" in entry:
            problems.append(f"{where}: remove the 'backpressure' key (vLLM turns even null into {{}} and its factory "
                            "then fails before kvtier starts; kvtier does its own flow control)")
        elif top_bp:
            problems.append("kv_connector_extra_config.backpressure: remove it (vLLM merges a top-level block into "
                            f"every tier, {where} included, and kvtier refuses a back-pressure detector)")
        try:
            # a wrong type is named above: the entry's other keys are checked as kvtier would take them
            cfg = TierConfig.from_dict({k: v for k, v in entry.items() if k != "backpressure"}
                                       | {"type": "KvTierSecondaryTier", "module_path": KVTIER_MODULE})
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
            plane = entry.get("data_plane")  # the engine would refuse this too: said in the same run
            if isinstance(plane, str) and (why := plane_unavailable(plane)) is not None:
                problems.append(f"{where}: data_plane {plane!r} cannot start on this host: {why}")
            continue
        if cfg.auth == "curve":  # the files the engine reads at start, read now
            from kvtier.transport.curve import curve_settings

            try:
                curve_settings(cfg.auth_secret_key_file, cfg.auth_allowed_keys_dir)
            except ValueError as exc:
                problems.append(f"{where}: {exc}")
        if (why := plane_unavailable(cfg.data_plane)) is not None:  # as the engine would find it, on this host
            problems.append(f"{where}: data_plane {cfg.data_plane!r} cannot start on this host: {why}")
        if len(problems) > before:  # checked, but vLLM would not start it as written
            continue
        notes.append(f"{where}: kvtier, {cfg.data_plane} plane, listens on {cfg.host}:{cfg.port}"
                     f"{' (+ data_parallel_index)' if cfg.port else ''}, auth {cfg.auth}{_security(cfg)}")
    if own_entry_required and not found and not problems:
        problems.append(f"no secondary_tiers entry loads kvtier (module_path {KVTIER_MODULE!r})" + (
            f": {', '.join(builtin)}; to run kvtier in its place write \"type\": \"KvTierSecondaryTier\", "
            f'"module_path": "{KVTIER_MODULE}" (docs/migrating-from-p2p.md maps its keys)' if builtin else ""))
    if own_entry_required and found > 1:
        problems.append(f"{found} secondary_tiers entries load kvtier: one per engine (a second one parks every "
                        "prefill request's blocks again and pins them until its unbound_store_timeout_s)")
    return problems, notes, found
