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
           "PeerIsSelf", "PeerStillHeld", "PlaneError", "Released", "Report", "Revoked", "ZmqPlane", "make_plane"]


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
