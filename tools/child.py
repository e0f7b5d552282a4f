"""A Python child process that answers calls by name: the one helper the demo, the benchmarks and
the multi-process tests start their children with.

The parent names a *handler* (``module``, ``factory``, keyword arguments); the child, forked from
a fork server that only imported :data:`PRELOAD` (no zmq context, no torch state, none of the
parent's threads; ``KVTIER_CHILD_START=spawn`` for a fresh interpreter instead), takes the
parent's environment and working directory as they were at :meth:`Child.start`, builds
``module.factory(**kwargs)`` and then answers every call ``op`` with ``handler.op_<op>(*args,
**kwargs)``.  Handler hooks, all optional:

* ``hello()``: its value is sent with the ready message (:attr:`Child.hello`), e.g. a bound address;
* ``wait(conn)``: background work between calls (poll a manager, serve a socket); it returns when
  ``conn`` has a call waiting, or whenever it likes (it is called again);
* ``close()``: run when the child leaves (asked to stop, the parent went away, lifetime over).

The protocol, over one ``multiprocessing`` Pipe: the child sends ``("ready", pid, hello)`` or
``("err", kind, message, traceback)`` once; then each call ``(op, args, kwargs)`` gets ``("ok",
value)`` or ``("err", kind, message, traceback)``; ``("stop",)`` ends the child (it answers
``("ok", "stopped")`` after ``close()``).  Arguments and values must pickle.

The child always terminates: it is a daemon, it leaves when the pipe closes (the parent died) or
after ``max_lifetime_s``, and :meth:`Child.close` asks, joins with a timeout and then kills it by
PID.  Only the standard library is imported here, so a child pays nothing before its handler.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import signal
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Child", "ChildError", "preload_vllm", "start_all"]

PRELOAD: tuple[str, ...] = ("numpy", "torch", "zmq", "msgspec", "kvtier.manager", "tools.child")
"""Modules the fork server imports once, so that a child starts with them loaded instead of paying
~1.1 s of CPU to import torch and kvtier again (decision V11).  A module missing here is skipped."""

START_METHOD: str = os.environ.get("KVTIER_CHILD_START", "forkserver")
"""``forkserver`` (default): children are forks of one clean server process that only imported
:data:`PRELOAD` (no zmq context, no torch state, none of the parent's threads); ``spawn``: a fresh
interpreter per child (``KVTIER_CHILD_START=spawn``)."""

if START_METHOD not in ("forkserver", "spawn"):
    raise ValueError(f"KVTIER_CHILD_START must be 'forkserver' or 'spawn', got {START_METHOD!r}")
_CTX = mp.get_context(START_METHOD)
if START_METHOD == "forkserver":
    _CTX.set_forkserver_preload(list(PRELOAD))


def preload_vllm() -> None:
    """Have this process's fork server also import vLLM's tiering manager and kvtier's adapter
    (:mod:`tools.vllm_preload`: ~3.8 s of CPU each child that drives vLLM would pay again,
    decision V11) — for a process whose children drive vLLM (P0, the test suite), not for every
    one: the server imports it before its first child starts, and the demo's children never use
    it.  Call it before the first child starts; a running server keeps what it loaded.  Not vLLM's
    p2p tier: it looks for NIXL when imported, before a child has its environment."""
    if START_METHOD == "forkserver":
        _CTX.set_forkserver_preload([*PRELOAD, "tools.vllm_preload"])


class ChildError(RuntimeError):
    """A call (or the handler's construction) raised in the child, or the child died.

    Attributes:
        kind: the class name of the exception in the child (``"died"`` when the child is gone).
        tb: the child's formatted traceback (empty when it died).
    """

    def __init__(self, child: str, what: str, kind: str, message: str, tb: str = "") -> None:
        super().__init__(f"{child}: {what}: {kind}: {message}" + (f"\n{tb}" if tb else ""))
        self.kind = kind
        self.tb = tb


def _error(exc: BaseException) -> tuple[str, str, str, str]:
    return ("err", type(exc).__name__, str(exc), traceback.format_exc())


def _main(conn: Any, module: str, factory: str, kwargs: Mapping[str, Any], env: Mapping[str, str],
          max_lifetime_s: float | None, parent_env: Mapping[str, str] | None = None, cwd: str | None = None) -> None:
    """The child's side (module-level, so the fork server has it loaded)."""
    # a fork server's child starts with the server's environment and directory, taken when the
    # server started: give it the parent's as they are now, as ``spawn`` would, then ``env`` —
    # all before the handler's module imports anything that reads them
    if parent_env is not None:
        os.environ.clear()
        os.environ.update(parent_env)
    os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    handler: Any = None
    try:
        handler = getattr(importlib.import_module(module), factory)(**kwargs)
        conn.send(("ready", os.getpid(), getattr(handler, "hello", lambda: None)()))
    except (EOFError, OSError):  # the parent went away while we were starting
        return
    except Exception as exc:
        try:
            conn.send(_error(exc))
        except (EOFError, OSError):
            pass
        return
    wait: Callable[[Any], None] | None = getattr(handler, "wait", None)
    deadline = None if max_lifetime_s is None else time.monotonic() + max_lifetime_s
    stopped = False
    try:
        while deadline is None or time.monotonic() < deadline:
            try:
                if wait is not None:
                    wait(conn)
                if not conn.poll(0 if wait is not None else 0.5):
                    continue
                msg = conn.recv()
            except (EOFError, OSError):
                break
            if msg[0] == "stop":
                stopped = True
                break
            op, args, kw = msg
            try:
                reply: tuple = ("ok", getattr(handler, "op_" + op)(*args, **kw))
            except Exception as exc:
                reply = _error(exc)
            try:
                conn.send(reply)
            except (EOFError, OSError):
                break
    finally:
        close = getattr(handler, "close", None)
        if close is not None:
            try:
                close()
            except Exception:  # noqa: S110 - best effort on the way out
                pass
        if stopped:
            try:
                conn.send(("ok", "stopped"))
            except (EOFError, OSError, ValueError):
                pass


class Child:
    """Handle on one child process running ``module.factory(**kwargs)`` (see the module doc).

    Args:
        module, factory, kwargs: the handler to build in the child (``kwargs`` must pickle).
        name: the process name (shows in ``ps`` and in every error).
        env: environment variables set in the child before the handler's module is imported.
        max_lifetime_s: the child leaves on its own after this long (``None``: never).
        call_timeout_s: default seconds :meth:`call` waits for an answer.

    A call is ``child.call("op", ...)``, or ``child.op(...)`` for any ``op_<op>`` the handler
    class defines.  :meth:`start` returns at once; the first call (or :attr:`hello`) waits for
    the child to be ready.  Use as a context manager or call :meth:`close`.
    """

    def __init__(self, module: str, factory: str, kwargs: Mapping[str, Any] | None = None, *, name: str,
                 env: Mapping[str, str] | None = None, max_lifetime_s: float | None = None,
                 call_timeout_s: float = 600.0) -> None:
        self.module, self.factory, self.name = module, factory, name
        self.kwargs = dict(kwargs or {})
        self.env = dict(env or {})
        self.max_lifetime_s = max_lifetime_s
        self.call_timeout_s = call_timeout_s
        self.pid: int | None = None
        self._proc: Any = None
        self._conn: Any = None
        self._ready = False
        self._hello: Any = None
        self._pending = "?"

    # -- process control ---------------------------------------------------------------------------
    def start(self) -> Child:
        """Start the child (returns at once; idempotent)."""
        if self._proc is None:
            parent, child = _CTX.Pipe(duplex=True)
            self._proc = _CTX.Process(
                target=_main, args=(child, self.module, self.factory, self.kwargs, self.env, self.max_lifetime_s,
                                    dict(os.environ), os.getcwd()),
                name=self.name, daemon=True)
            self._proc.start()
            child.close()
            self._conn = parent
        return self

    def is_ready(self) -> bool:
        """Whether the child has built its handler (never blocks; starts the child if needed).

        Raises:
            ChildError: the handler's construction raised, or the child died while starting.
        """
        if not self._ready:
            self.start()
            if self._conn.poll(0):
                self._take_ready()
        return self._ready

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Block until the child is ready.

        Raises:
            TimeoutError: not ready within ``timeout_s`` (the child is killed).
            ChildError: the handler's construction raised, or the child died while starting.
        """
        if self._ready:
            return
        self.start()
        if not self._conn.poll(timeout_s):
            self.kill()
            raise TimeoutError(f"{self.name}: not ready after {timeout_s} s (child killed)")
        self._take_ready()

    def _take_ready(self) -> None:
        msg = self._receive("start")
        if msg[0] != "ready":
            self.kill()
            raise ChildError(self.name, "start", *msg[1:])
        self.pid, self._hello, self._ready = msg[1], msg[2], True

    @property
    def hello(self) -> Any:
        """What the handler's ``hello()`` returned (waits for the child to be ready)."""
        self.wait_ready()
        return self._hello

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def _receive(self, what: str) -> tuple:
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            code = self._proc.exitcode if self._proc is not None else None
            raise ChildError(self.name, what, "died", f"the child is gone (exit code {code})") from None

    # -- calls -------------------------------------------------------------------------------------
    def send(self, op: str, *args: Any, **kwargs: Any) -> None:
        """Start the call ``op`` without waiting for it (collect it with :meth:`result`)."""
        self.wait_ready()
        if not self.alive:
            raise ChildError(self.name, op, "died", "the child is not running")
        self._conn.send((op, args, kwargs))
        self._pending = op

    def has_answer(self) -> bool:
        """Whether the answer to the call in progress is waiting (never blocks)."""
        return bool(self._conn.poll(0))

    def result(self, timeout_s: float | None = None) -> Any:
        """The value of the call in progress.

        Raises:
            ChildError: it raised in the child (``kind`` is the exception's class), or the child died.
            TimeoutError: no answer within ``timeout_s`` (default ``call_timeout_s``); the child is
                then killed, so a caller never hangs on it.
        """
        timeout_s = self.call_timeout_s if timeout_s is None else timeout_s
        if not self._conn.poll(timeout_s):
            self.kill()
            raise TimeoutError(f"{self.name}: no answer to {self._pending!r} within {timeout_s} s (child killed)")
        reply = self._receive(self._pending)
        if reply[0] == "ok":
            return reply[1]
        raise ChildError(self.name, repr(self._pending), *reply[1:])

    def call(self, op: str, *args: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        """``handler.op_<op>(*args, **kwargs)`` in the child; see :meth:`result` for errors."""
        self.send(op, *args, **kwargs)
        return self.result(timeout_s)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        # only for ops the handler class defines, so a typo is an AttributeError here
        if name.startswith("_") or not hasattr(getattr(importlib.import_module(self.module), self.factory),
                                               "op_" + name):
            raise AttributeError(f"{type(self).__name__} {self.name!r} has no attribute or op {name!r}")

        def op(*args: Any, **kwargs: Any) -> Any:
            return self.call(name, *args, **kwargs)

        op.__name__ = name
        return op

    # -- ending ------------------------------------------------------------------------------------
    def kill(self) -> None:
        """``kill -9`` the child by PID (no ``close()``, no goodbye) and reap it."""
        proc = self._proc
        if proc is None:
            return
        if proc.is_alive() and proc.pid is not None:
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.join(timeout=10.0)

    def close(self, timeout_s: float = 10.0) -> None:
        """Ask the child to stop (its handler's ``close()`` runs), join it, kill it if it does not
        leave within ``timeout_s``.  Idempotent; :meth:`start` may be called again afterwards."""
        proc = self._proc
        if proc is None:
            return
        try:
            if proc.is_alive() and self._ready:
                self._conn.send(("stop",))
                end = time.monotonic() + timeout_s
                while self._conn.poll(max(0.0, end - time.monotonic())):
                    if self._conn.recv() == ("ok", "stopped"):  # skip an unread answer
                        break
        except (EOFError, OSError):
            pass
        try:
            self._conn.close()  # a child that never got "stop" sees EOF and leaves
        except OSError:
            pass
        proc.join(timeout=timeout_s)
        if proc.is_alive():
            self.kill()
        if not proc.is_alive():
            proc.close()
        self._proc = self._conn = None
        self._ready = False

    def __enter__(self) -> Child:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_all(*children: Child, timeout_s: float = 120.0) -> tuple[Child, ...]:
    """Start every child at once (they import in parallel), then wait until each is ready.

    Raises:
        TimeoutError, ChildError: as :meth:`Child.wait_ready`; every child is closed first.
    """
    for child in children:
        child.start()
    try:
        for child in children:
            child.wait_ready(timeout_s)
    except BaseException:
        for child in reversed(children):
            child.close()
        raise
    return children
