"""Which kvtier checkout the tools work on.

The tools are not installed with kvtier: they run from a checkout (``python -m tools`` at its
root, ``make check`` …) and read and write only inside one — the spec, the generated table
module, ``diagrams/``, ``docs/`` — never an installed package (docs/decisions.md W1).  The
checkout is ``--root`` when given, else the first directory from the current one upward that holds
``spec/lifecycle.toml`` and ``kvtier/lifecycle/``; outside any checkout :class:`NotACheckout`
says so.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["NotACheckout", "find_root", "require_runtime", "root"]

_MARKS = ("spec/lifecycle.toml", "kvtier/lifecycle/__init__.py")


class NotACheckout(RuntimeError):
    """No kvtier checkout where the tools looked (the message says where and what to do)."""


def _is_checkout(path: Path) -> bool:
    return all((path / mark).is_file() for mark in _MARKS)


def find_root(start: Path | str | None = None) -> Path:
    """The checkout holding ``start`` (default: the current directory), searched upward.

    Raises:
        NotACheckout: neither ``start`` nor a parent holds ``spec/lifecycle.toml`` and
            ``kvtier/lifecycle/``.
    """
    here = Path(start if start is not None else Path.cwd()).resolve()
    for path in (here, *here.parents):
        if _is_checkout(path):
            return path
    raise NotACheckout(
        f"{here} is not inside a kvtier checkout (no directory from there upward holds "
        f"{' and '.join(_MARKS)}): run the tools from a clone of the repository, or pass --root"
    )


def root(explicit: Path | str | None = None) -> Path:
    """``explicit`` if it is a checkout, else :func:`find_root` from the current directory.

    Raises:
        NotACheckout: ``explicit`` is not a checkout, or there is none around the current directory.
    """
    if explicit is None:
        return find_root()
    path = Path(explicit).resolve()
    if not _is_checkout(path):
        raise NotACheckout(f"--root {path} is not a kvtier checkout (it lacks {' or '.join(_MARKS)})")
    return path


def require_runtime(checkout: Path) -> None:
    """Fail unless the ``kvtier`` this process imports is the one in ``checkout`` (a tool that runs
    the runtime — scenarios, the model checker, the docs of its declarations — would otherwise
    describe another copy of the code than the one it writes next to).

    Raises:
        NotACheckout: ``kvtier`` comes from elsewhere (an installed wheel, another clone).
    """
    import kvtier

    here = Path(kvtier.__file__).resolve().parent
    if here != (checkout / "kvtier").resolve():
        raise NotACheckout(
            f"this Python imports kvtier from {here}, not from the checkout {checkout}: run from the "
            f"checkout's root (python -m tools ...) or put it first on PYTHONPATH"
        )
