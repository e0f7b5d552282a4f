"""Data planes: how KV block bytes move between a producer's pool and a consumer's slots.

The control plane (handshake, fetch, completion) is kvtier's own protocol over ZeroMQ. A data
plane only moves bytes. :mod:`kvtier.dataplane.nixl_agent` wraps one NIXL agent over one block
pool (one-sided WRITEs, UCX underneath); the seam that the manager talks to lives beside it.
"""
