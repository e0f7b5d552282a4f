"""What :mod:`tools.child`'s fork server imports of vLLM (:func:`tools.child.preload_vllm`): the tiering manager and
offloading factory, and kvtier's adapter — ~3.8 s of CPU each child that drives vLLM would pay
again (decision V11).  A vLLM that is missing or fails to import, for any reason, is left alone
here: the children that need it import it themselves and report the failure; the others never
notice.  (The fork server itself only forgives ``ImportError``: a half-installed stack raising
anything else would take every child down with it.)"""

from __future__ import annotations

try:
    import vllm.v1.kv_offload.factory
    import vllm.v1.kv_offload.tiering.manager  # noqa: F401

    import kvtier.integrations.vllm  # noqa: F401
except Exception:  # noqa: BLE001, S110 - see the module docstring
    pass
