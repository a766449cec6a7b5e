"""Log artifacts: FRAMEJIT_LOGS / TORCH_LOGS parsing and framejit.set_logs()."""
import logging
import os
import sys

from . import _C

# Same names and bits as FJ_FOREACH_ARTIFACT in csrc/log/log.h.
ARTIFACTS = {
    "graph_code": 0,
    "guards": 1,
    "recompiles": 2,
    "bytecode": 3,
    "graph_breaks": 4,
    "regions": 5,
    "output_code": 6,
}

_handler = None
_enabled = set()


def _ensure_handler() -> None:
    global _handler
    if _handler is not None:
        return
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter("[framejit] %(name)s: %(message)s"))
    root = logging.getLogger("framejit")
    root.addHandler(_handler)
    root.propagate = False  # printed once, by this handler, even if the root logger has one
    if root.level == logging.NOTSET or root.level > logging.INFO:
        root.setLevel(logging.INFO)


def set_logs(*artifacts: str, handler: bool = True, **flags: bool) -> None:
    """Turns artifacts on: ``set_logs("graph_code", "guards")`` or ``set_logs(graph_code=True)``.

    Calling it replaces the previous selection. ``handler=False`` leaves output to your own
    logging configuration (e.g. pytest's caplog)."""
    names = set(artifacts) | {name for name, on in flags.items() if on}
    unknown = names - set(ARTIFACTS)
    if unknown:
        raise ValueError(f"unknown framejit log artifact(s) {sorted(unknown)}; "
                         f"known: {sorted(ARTIFACTS)}")
    _enabled.clear()
    _enabled.update(names)
    mask = 0
    for name in names:
        mask |= 1 << ARTIFACTS[name]
    _C.set_log_mask(mask)
    if names and handler:
        _ensure_handler()
    for name in ARTIFACTS:
        logging.getLogger(f"framejit.{name}").setLevel(logging.INFO if name in names else logging.NOTSET)


def enabled() -> set:
    return set(_enabled)


def _parse(spec: str, strict: bool) -> set:
    names = set()
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        if item in ("+framejit", "-framejit"):
            logging.getLogger("framejit").setLevel(logging.DEBUG if item[0] == "+" else logging.ERROR)
            continue
        if item in ARTIFACTS:
            names.add(item)
        elif strict:
            print(f"[framejit] FRAMEJIT_LOGS: unknown artifact {item!r}; known: "
                  f"{', '.join(sorted(ARTIFACTS))}", file=sys.stderr)
    return names


def init_from_env() -> None:
    names = _parse(os.environ.get("FRAMEJIT_LOGS", ""), strict=True)
    names |= _parse(os.environ.get("TORCH_LOGS", ""), strict=False)
    if names:
        set_logs(*names)
