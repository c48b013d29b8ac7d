"""Supply chain: every pin in requirements.lock but torch's carries its sha256, and `make setup`
installs with --require-hashes (torch: one pin for a CPU or a CUDA wheel, other files)."""

import re

from helpers import REPO

LOCK = (REPO / "requirements.lock").read_text()


def requirements(text: str) -> dict[str, list[str]]:
    """name==version -> its hashes, from a requirements file with `\\` continuations."""
    joined = re.sub(r"\\\n\s*", " ", text)
    found = {}
    for line in joined.splitlines():
        line = line.split("#", 1)[0].strip() if not line.lstrip().startswith("--hash") else line
        if line:
            pin, *options = line.split()
            found[pin] = [o.removeprefix("--hash=sha256:") for o in options if o.startswith("--hash=sha256:")]
    return found


def test_every_pin_but_torch_has_sha256_hashes():
    pins = requirements(LOCK)
    assert "torch==2.13.0" in pins and len(pins) > 150
    unhashed = [pin for pin, hashes in pins.items() if not hashes and pin != "torch==2.13.0"]
    assert not unhashed, f"pins without --hash in requirements.lock: {unhashed}"
    assert all(re.fullmatch(r"[0-9a-f]{64}", h) for hashes in pins.values() for h in hashes)
    assert all("==" in pin for pin in pins), [p for p in pins if "==" not in p]


def test_make_setup_installs_with_require_hashes():
    makefile = (REPO / "Makefile").read_text()
    setup = makefile[makefile.index("$(STAMP): requirements.lock") :].split("\n\n")[0]
    installs = [line for line in setup.splitlines() if "$(UV)" in line or "$(PIP)" in line]
    unhashed = [line for line in installs if "--require-hashes" not in line and "-e ." not in line]
    assert unhashed == ["\t$(PIP) -c $(VENV)/pins.txt $$(grep '^torch==' $(VENV)/pins.txt)"], unhashed
    assert "mktemp -d" in makefile[makefile.index("\nlock:") :].split("\n\n")[0]
