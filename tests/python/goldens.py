"""Expected-text files (tests/python/expected/) shared by every supported Python, with a file of
its own for a version whose output differs (bytecode differences show in printed graphs).

check_expected(name, text) compares `text` with expected/<stem>.py3XX<suffix> when that
version's file exists, else with expected/<stem><suffix>. It writes instead of comparing with
FRAMEJIT_ACCEPT=1 (the shared file: run on the first supported version) or FRAMEJIT_ACCEPT=own
(this version's file, kept only where its text differs from the shared one). One command
accepts on every installed version: `bash scripts/accept_goldens.sh`."""
import os
import sys
from pathlib import Path

EXPECTED = Path(__file__).parent / "expected"
VERSION_TAG = "py%d%d" % sys.version_info[:2]


def expected_paths(name: str):
    stem, dot, suffix = name.rpartition(".")
    stem, suffix = (stem, dot + suffix) if dot else (name, ".txt")
    return EXPECTED / f"{stem}{suffix}", EXPECTED / f"{stem}.{VERSION_TAG}{suffix}"


def check_expected(name: str, text: str) -> None:
    shared, own = expected_paths(name)
    accept = os.environ.get("FRAMEJIT_ACCEPT")
    if accept == "1":
        shared.write_text(text)
        return
    if accept == "own":
        if shared.exists() and shared.read_text() == text:
            own.unlink(missing_ok=True)
        else:
            own.write_text(text)
        return
    path = own if own.exists() else shared
    assert path.exists(), f"{path} missing: run scripts/accept_goldens.sh to create it"
    assert text == path.read_text(), f"differs from {path.name} (scripts/accept_goldens.sh rewrites it)"
