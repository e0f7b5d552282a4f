"""Can a NIXL target revoke a peer's WRITE access? Can an initiator stop a posted WRITE?

    python -m bench.nixl_revoke

A probe, not a test: it drives raw NIXL (``nixl_agent``) in two spawned processes on loopback,
with the default UCX transports (tcp + CMA) and with ``UCX_TLS=tcp``, and prints what happened.
Its answers decide kvtier's safety rules for one-sided WRITEs (docs/nixl.md):

1. *Target revokes.* The initiator holds the target's metadata and a prepared descriptor list;
   one WRITE lands. The target then deregisters its region, deregisters and registers it again,
   removes the initiator's agent, or destroys its own agent. The initiator then WRITEs into
   other slots with the old prepared list, and again with a freshly prepared one. Did the
   bytes land? The last row repeats agent destruction with an initiator that made no NIXL call
   in between (its idle loop paused), so it cannot have seen the disconnect yet.
2. *Initiator tears down a WRITE in flight* (tcp only: over CMA a 16 MiB WRITE usually ends
   inside ``transfer()``). The target stops calling into NIXL, the initiator posts, then
   releases the handle or removes the target's agent; the initiator overwrites its source
   blocks, the target resumes. Did the target get the old bytes, the new ones (the WRITE kept
   reading the source after the teardown), or nothing?
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from tools.child import Child

NB, BB = 16, 1 << 20  # 16 slots of 1 MiB


class RawNixl:
    """Child-side handler: one raw NIXL agent over ``NB x BB`` bytes (spawned by :class:`Child`)."""

    def __init__(self, agent_name: str, env: dict[str, str], value: int) -> None:
        import os

        os.environ.update(env)
        from kvtier.dataplane.nixl_agent import load_nixl_api

        api = load_nixl_api()
        self.agent: Any = api.nixl_agent(agent_name, api.nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
        self.region = np.full((NB, BB), value, dtype=np.uint8)
        self.reg = self.agent.register_memory([(self.region.ctypes.data, self.region.nbytes, 0, "")], mem_type="DRAM")
        self.local = self.agent.prep_xfer_dlist("NIXL_INIT_AGENT", self._descs(self.region.ctypes.data), mem_type="DRAM")
        self.remote: Any = None
        self.remote_name = ""
        self.remote_addr = 0
        self.handles: dict[int, Any] = {}
        self.paused = False

    @staticmethod
    def _descs(base: int) -> list[tuple[int, int, int]]:
        return [(base + i * BB, BB, 0) for i in range(NB)]

    def hello(self) -> dict[str, Any]:
        return {"md": self.agent.get_agent_metadata(), "addr": self.region.ctypes.data}

    def wait(self, conn: Any) -> None:
        while not conn.poll(0.0005):
            if self.agent is not None and not self.paused:
                self.agent.get_new_notifs()  # the target-side progress a tcp WRITE needs

    def op_set_paused(self, paused: bool) -> None:
        self.paused = paused

    def op_load_peer(self, md: bytes, addr: int) -> None:
        self.remote_name = self.agent.add_remote_agent(md)
        self.remote_addr = addr
        self.remote = self.agent.prep_xfer_dlist(self.remote_name, self._descs(addr), mem_type="DRAM")

    def op_write(self, local: list[int], remote: list[int], fresh_dlist: bool = False) -> str:
        """Post a WRITE; return its first state, or what it raised."""
        try:
            rd = self.remote
            if fresh_dlist:
                rd = self.agent.prep_xfer_dlist(self.remote_name, self._descs(self.remote_addr), mem_type="DRAM")
            h = self.agent.make_prepped_xfer("WRITE", self.local, np.array(local, np.int32), rd, np.array(remote, np.int32))
            state = self.agent.transfer(h)
        except Exception as e:
            return f"post raised {type(e).__name__}"
        self.handles[0] = h
        return state

    def op_settle(self, within_s: float) -> str:
        """Poll the last WRITE until it leaves PROC (or ``within_s`` passes)."""
        h = self.handles.get(0)
        if h is None:
            return "-"
        end = time.monotonic() + within_s
        while True:
            try:
                state = self.agent.check_xfer_state(h)
            except Exception as e:
                return f"check raised {type(e).__name__}"
            if state != "PROC" or time.monotonic() > end:
                return state

    def op_action(self, action: str) -> str:
        try:
            if action == "deregister_memory":
                self.agent.deregister_memory(self.reg)
            elif action == "re-register":
                self.agent.deregister_memory(self.reg)
                self.reg = self.agent.register_memory(
                    [(self.region.ctypes.data, self.region.nbytes, 0, "")], mem_type="DRAM"
                )
            elif action == "remove_remote_agent":
                self.agent.remove_remote_agent(self.remote_name)
            elif action == "release_dlist+remove_remote_agent":
                self.remote.release()
                self.agent.remove_remote_agent(self.remote_name)
            elif action == "release_handle":
                self.handles[0].release()
            elif action == "destroy_agent":
                for h in self.handles.values():
                    h.release()
                self.handles.clear()
                self.local.release()
                if self.remote is not None:
                    self.remote.release()
                self.agent = self.local = self.remote = self.reg = None  # last references go
            return "ok"
        except Exception as e:
            return f"raised {type(e).__name__}: {e}"

    def op_fill(self, value: int) -> None:
        self.region[:] = value

    def op_rows(self, rows: list[int], value: int) -> str:
        """'all', 'some' or 'none' of ``rows`` hold ``value`` in every byte."""
        full = [(self.region[r] == value).all() for r in rows]
        return "all" if all(full) else "some" if any(full) else "none"

    def op_first_bytes(self, rows: list[int]) -> list[int]:
        return sorted({int(self.region[r, 0]) for r in rows} | {int(self.region[r, -1]) for r in rows})


def _spawn(name: str, tls: str, value: int) -> Child:
    env = {"UCX_NET_DEVICES": "lo", "NIXL_LOG_LEVEL": "WARN", **({"UCX_TLS": tls} if tls != "default" else {})}
    child = Child("bench.nixl_revoke", "RawNixl", {"agent_name": name, "env": env, "value": value}, name=name,
                  env=env).start()
    child.wait_ready(300)
    return child


def target_revokes(tls: str, action: str, n: int, idle: bool = False) -> dict[str, str]:
    """``idle``: the initiator makes no NIXL call between the target's action and its next
    post (a producer that was busy or wedged), so it cannot have noticed a disconnect."""
    tgt, ini = _spawn(f"T{n}", tls, 0), _spawn(f"I{n}", tls, 0x11)
    try:
        ini.call("load_peer", md=tgt.hello["md"], addr=tgt.hello["addr"])
        tgt.call("load_peer", md=ini.hello["md"], addr=ini.hello["addr"])
        ini.call("write", local=[0, 1], remote=[0, 1])
        first = ini.call("settle", within_s=10)
        landed1 = tgt.call("rows", rows=[0, 1], value=0x11)
        ini.call("set_paused", paused=idle)
        act = tgt.call("action", action=action)
        time.sleep(0.3)
        out = {"tls": tls, "action": (act if act != "ok" else action) + (", initiator idle" if idle else ""),
               "before": f"{first}/{landed1}"}
        for label, rows, fresh in (("old dlist", [4, 5], False), ("fresh dlist", [8, 9], True)):
            posted = ini.call("write", local=[2, 3], remote=rows, fresh_dlist=fresh)
            state = ini.call("settle", within_s=10) if not posted.startswith("post raised") else posted
            landed = tgt.call("rows", rows=rows, value=0x11)
            out[label] = f"{state} / landed: {landed}"
            ini.call("set_paused", paused=False)
        return out
    finally:
        tgt.close()
        ini.close()


def initiator_tears_down(action: str, n: int) -> dict[str, str]:
    tls = "tcp"
    tgt, ini = _spawn(f"T{n}", tls, 0), _spawn(f"I{n}", tls, 0x11)
    try:
        ini.call("load_peer", md=tgt.hello["md"], addr=tgt.hello["addr"])
        rows = list(range(NB))
        tgt.call("set_paused", paused=True)
        posted = ini.call("write", local=rows, remote=rows)
        act = ini.call("action", action=action) if action != "none" else "ok"
        ini.call("fill", value=0x22)  # the source changes after the teardown
        tgt.call("set_paused", paused=False)
        state = ini.call("settle", within_s=3) if action not in ("release_handle", "destroy_agent") else "-"
        time.sleep(1.0)
        seen = tgt.call("first_bytes", rows=rows)
        return {"action": act if act != "ok" else action, "post": posted, "then": state,
                "target sees": {(0,): "nothing", (0x11,): "old source only", (0x22,): "NEW source bytes"}.get(
                    tuple(seen), f"bytes {[hex(v) for v in seen]}")}
    finally:
        tgt.close()
        ini.close()


def main() -> int:
    n = 0
    print("1. Target-side revocation (WRITE after the target's action; 'landed: all' = not revoked)\n")
    print("| UCX_TLS | target action | first WRITE | next WRITE, old dlist | next WRITE, fresh dlist |")
    print("|---|---|---|---|---|")
    for tls in ("default", "tcp"):
        for action, idle in (("none", False), ("deregister_memory", False), ("re-register", False),
                             ("remove_remote_agent", False), ("destroy_agent", False), ("destroy_agent", True)):
            n += 1
            r = target_revokes(tls, action, n, idle)
            print(f"| {r['tls']} | {r['action']} | {r['before']} | {r['old dlist']} | {r['fresh dlist']} |")
    print("\n2. Initiator-side teardown of a 16 MiB WRITE in flight (UCX_TLS=tcp, target paused while posting)\n")
    print("| initiator action | post | state after resume | target sees |")
    print("|---|---|---|---|")
    for action in ("none", "release_handle", "release_dlist+remove_remote_agent", "destroy_agent"):
        n += 1
        r = initiator_tears_down(action, n)
        print(f"| {r['action']} | {r['post']} | {r['then']} | {r['target sees']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
