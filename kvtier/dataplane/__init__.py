"""Data planes: how block bytes travel between a producer's pool and a consumer's slots.

One seam (:mod:`kvtier.dataplane.base`), several planes: ``zmq`` (inline payload frames on the
control connection, the default) and ``nixl`` (one-sided WRITEs through NIXL/UCX).  A plane moves
bytes and reports what happened — posted transfers released or failed, blocks landed, access
revoked, a path to a peer broken; the lifecycle core (:mod:`kvtier.lifecycle`) alone decides what that means for an id.
"""

from kvtier.dataplane.base import (
    AttachFailed,
    Attached,
    Batch,
    DataPlane,
    Faulted,
    Landed,
    Notified,
    PeerIsSelf,
    PeerStillHeld,
    PlaneError,
    Released,
    Report,
    Revoked,
)
from kvtier.dataplane.landing import Landings
from kvtier.dataplane.zmq import ZmqPlane

__all__ = ["AttachFailed", "Attached", "Batch", "DataPlane", "Faulted", "Landed", "Landings", "Notified",
           "PeerIsSelf", "PeerStillHeld", "PlaneError", "Released", "Report", "Revoked", "ZmqPlane", "make_plane",
           "plane_unavailable"]


def make_plane(name: str, **kwargs: object) -> DataPlane:
    """Build the data plane a config names (``data_plane`` key).

    Raises:
        ValueError: unknown plane name.
        PlaneError: the plane cannot start here (e.g. NIXL is not installed).
    """
    if name == "zmq":
        return ZmqPlane(**kwargs)  # type: ignore[arg-type]
    if name == "nixl":
        from kvtier.dataplane.nixl import NixlPlane

        return NixlPlane(**kwargs)  # type: ignore[arg-type]
    raise ValueError(f"unknown data plane {name!r}; expected 'zmq' or 'nixl'")


def plane_unavailable(name: str) -> str | None:
    """Why data plane ``name`` cannot start on this host (``nixl``: NIXL does not import; the
    text names each attempt and how to install), or None when nothing here stands in its way —
    what :func:`make_plane` would refuse before any agent exists (``kvtier check-config``)."""
    if name != "nixl":
        return None
    from kvtier.dataplane.nixl_agent import NixlUnavailable, load_nixl_api

    try:
        load_nixl_api()
    except NixlUnavailable as exc:
        return str(exc)
    return None
