"""What a failed ZMTP handshake most likely means, for the operator: libzmq's
``EVENT_HANDSHAKE_FAILED_*`` monitor events turned into an authentication verdict and a sentence
that names the fix (decisions E1, E7)."""

from __future__ import annotations

import errno

import zmq

__all__ = ["AUTH", "NO_DETAIL", "PROTOCOL", "handshake_problem"]

AUTH, NO_DETAIL, PROTOCOL = (int(zmq.EVENT_HANDSHAKE_FAILED_AUTH), int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL),
                             int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL))
_MECHANISM_MISMATCH = int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
_CRYPTOGRAPHIC = int(zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)


def handshake_problem(event: int, value: int, *, curve: bool, dialled: bool, spoke: bool = False) -> tuple[bool, str]:
    """What a libzmq ``EVENT_HANDSHAKE_FAILED_*`` (``value``: its protocol error code, or an errno
    for ``NO_DETAIL``) most likely means, for the operator: ``(auth, text)``; ``auth`` when it is
    an authentication failure (the session ends ``auth_failed``; decision E1), else a peer that
    does not speak ZMTP at all.  ``curve``: this tier runs ``auth='curve'``; ``dialled``: we are
    the consumer that dialled; ``spoke``: a handshake with that address succeeded before under the
    same auth and its dials have not hung up twice in a row since, so a hang-up during the greeting
    is a listener restarting (or dying), not CURVE (decision E8).

    The side that detects a mechanism mismatch reports it and hangs up; the other then sees
    ``NO_DETAIL`` with ``EPIPE`` (writing its greeting), half of the time.  A close before any
    greeting (a health check, a port scan) ends with ``ECONNRESET``: no authentication failure; nor
    an inbound ``EPIPE``: any client hanging up early causes it (E7)."""
    other = "the producer" if dialled else "the peer"
    mismatch = event == PROTOCOL and value == _MECHANISM_MISMATCH
    hung_up = event == NO_DETAIL and value == errno.EPIPE
    if event == NO_DETAIL and dialled and spoke and not curve:
        return False, ("the producer closed the connection during the handshake; it completed one without CURVE "
                       "before, so it is most likely restarting or gone")
    if not curve and (mismatch or (hung_up and dialled) or (dialled and event == AUTH)):
        how = "closed the connection during the handshake: it may require" if hung_up else "requires"
        return True, (f"{other} {how} CURVE (auth='curve') and this tier has auth='none': set auth='curve' with "
                      "auth_secret_key_file and auth_allowed_keys_dir here too (docs/security.md)"
                      + ", or the address is not a kvtier listener: check remote_host and remote_port" * hung_up)
    if curve and mismatch:
        return True, (f"{other} does not run CURVE (its auth is 'none') while this tier has auth='curve': "
                      "set the same auth on both sides (docs/security.md)")
    if curve and (event == AUTH or (event == PROTOCOL and value == _CRYPTOGRAPHIC)
                  or (dialled and event == NO_DETAIL)):
        if dialled:
            return True, ("the CURVE handshake failed: the producer does not accept our key (is our public "
                          "certificate in its auth_allowed_keys_dir?), the certificate in our auth_allowed_keys_dir "
                          "that names this endpoint is not the producer's key, or it does not run auth='curve'")
        return True, ("the CURVE handshake failed: the peer's public certificate is not in our "
                      "auth_allowed_keys_dir, or the certificate it holds for our endpoint is not our key")
    if event == NO_DETAIL:
        return False, "the connection closed during the handshake" + ": check remote_host and remote_port" * dialled
    return False, f"{other} does not speak our ZMTP (a plain-TCP or other service?)"
