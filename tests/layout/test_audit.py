"""Known vulnerabilities: `pip-audit` over requirements.lock, with a reviewed allowlist.

The audit installs nothing (`--no-deps --disable-pip`: the lock's exact pins are looked up as they
are) and asks PyPI's vulnerability service, then OSV's. Every finding must be listed in
.ci/audit-allowlist.txt as `ID package  # why it does not affect scalelab`; a finding that is not
listed fails, and so does a listed one that the audit no longer reports (remove it). Where no
vulnerability service answers from this machine, the live audit skips and says which and why.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from helpers import BIN, REPO

LOCK = REPO / "requirements.lock"
ALLOWLIST = REPO / ".ci/audit-allowlist.txt"
SERVICES = ("pypi", "osv")
ENTRY = re.compile(
    r"(?P<id>[A-Za-z][A-Za-z0-9._-]*-[A-Za-z0-9._:-]+)\s+(?P<package>[A-Za-z0-9._-]+)\s+#\s*(?P<why>\S.*)"
)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_allowlist(text: str, source: str = "audit-allowlist.txt") -> dict[tuple[str, str], str]:
    """{(advisory id, package): why} from `ID package  # why` lines; blank and # lines are skipped."""
    entries = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = ENTRY.fullmatch(line.strip())
        if not m:
            raise ValueError(
                f"{source}:{number}: {line.strip()!r} is not allowed: write `ID package  # why it does not affect us`"
            )
        entries[(m["id"].upper(), canonical(m["package"]))] = m["why"].strip()
    return entries


def findings(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (package, advisory) in a `pip-audit --format json` report."""
    rows = []
    for dep in report.get("dependencies", []):
        for vuln in dep.get("vulns", []):
            rows.append(
                {
                    "package": canonical(dep["name"]),
                    "version": dep.get("version"),
                    "ids": [vuln["id"], *vuln.get("aliases", [])],
                    "fix": vuln.get("fix_versions", []),
                }
            )
    return rows


def unreviewed(report: dict[str, Any], allowed: dict[tuple[str, str], str]) -> tuple[list[str], list[str]]:
    """(findings not in the allowlist, allowlist entries the report no longer has), as lines."""
    found, used = [], set()
    for row in findings(report):
        keys = {(i.upper(), row["package"]) for i in row["ids"]}
        if keys & allowed.keys():
            used |= keys & allowed.keys()
            continue
        fix = ", ".join(row["fix"]) or "none yet"
        found.append(f"{row['ids'][0]} {row['package']}=={row['version']} (aliases {row['ids'][1:]}; fixed in {fix})")
    stale = [f"{i} {p}" for i, p in sorted(allowed.keys() - used)]
    return found, stale


def unaudited(report: dict[str, Any]) -> list[str]:
    return [f"{d['name']}: {d['skip_reason']}" for d in report.get("dependencies", []) if d.get("skip_reason")]


# --- the allowlist and the verdict, without a network ---------------------------------------------

REPORT = {
    "dependencies": [
        {"name": "Flask", "version": "3.1.3", "vulns": []},
        {
            "name": "some_pkg",
            "version": "1.0",
            "vulns": [
                {"id": "PYSEC-2099-1", "aliases": ["CVE-2099-1", "GHSA-xxxx-yyyy-zzzz"], "fix_versions": ["1.1"]}
            ],
        },
    ]
}


def test_a_finding_not_in_the_allowlist_fails_the_audit():
    found, stale = unreviewed(REPORT, {})
    assert found == ["PYSEC-2099-1 some-pkg==1.0 (aliases ['CVE-2099-1', 'GHSA-xxxx-yyyy-zzzz']; fixed in 1.1)"]
    assert stale == []
    other = read_allowlist("CVE-2099-1 other-pkg  # the advisory names another package\n")
    assert unreviewed(REPORT, other) == (found, ["CVE-2099-1 other-pkg"])


def test_a_finding_listed_by_any_of_its_ids_passes():
    allowed = read_allowlist("# reviewed\n\nghsa-xxxx-yyyy-zzzz Some.Pkg   # scalelab never calls the affected API\n")
    assert unreviewed(REPORT, allowed) == ([], [])


@pytest.mark.parametrize("line", ["CVE-2099-1 some-pkg", "CVE-2099-1  # no package", "some-pkg # no id", "CVE-1 x #"])
def test_an_allowlist_line_without_id_package_and_reason_is_refused(line):
    with pytest.raises(ValueError, match="is not allowed: write `ID package  # why"):
        read_allowlist(line)


def test_the_pins_are_read_without_their_hashes():
    found = pins()
    assert "torch==2.13.0" in found and len(found) > 150
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==[^\s\\]+", pin) for pin in found), found


def test_the_allowlist_reads():
    entries = read_allowlist(ALLOWLIST.read_text(), ALLOWLIST.name)
    assert all(why for why in entries.values())


# --- the live audit -------------------------------------------------------------------------------


def pins() -> list[str]:
    """The lock's `name==version` lines without their hashes (pip-audit refuses a file where some
    pins have hashes and torch's has none)."""
    joined = re.sub(r"\\\n\s*--hash=\S+", "", LOCK.read_text())
    return [line.split()[0] for line in joined.splitlines() if line.strip() and not line.startswith("#")]


def audit(service: str, cache: Path) -> tuple[dict[str, Any] | None, str]:
    """pip-audit's JSON report from one service, or None and why it could not be had."""
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "pins.txt").write_text("\n".join(pins()) + "\n")
    cmd = [str(BIN / "pip-audit"), "-r", str(cache / "pins.txt"), "--no-deps", "--disable-pip", "-s", service]
    cmd += ["--format", "json", "--progress-spinner", "off", "--timeout", "30", "--cache-dir", str(cache)]
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return None, f"{service}: no answer within 600 s"
    try:
        return json.loads(proc.stdout), ""
    except json.JSONDecodeError:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return None, f"{service}: pip-audit exited {proc.returncode}: {last[:300]}"


def probe_pypi() -> str:
    """Whether PyPI's per-release JSON (where its vulnerability data lives) answers from here."""
    version = next(pin.split("==")[1] for pin in pins() if canonical(pin.split("==")[0]) == "pip-audit")
    url = f"https://pypi.org/pypi/pip-audit/{version}/json"
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return f"{url} answered {resp.status}"
    except urllib.error.HTTPError as exc:
        listed = ""
        try:
            with urllib.request.urlopen("https://pypi.org/pypi/pip-audit/json", timeout=30) as resp:
                listed = " though the release exists" if version in json.load(resp)["releases"] else ""
        except (OSError, ValueError):
            pass
        return f"{url} answered {exc.code}{listed}"
    except OSError as exc:
        return f"{url} is unreachable ({exc})"


@pytest.mark.slow  # asks PyPI and OSV over the network
def test_requirements_lock_has_no_unreviewed_known_vulnerability(tmp_path):
    allowed = read_allowlist(ALLOWLIST.read_text(), ALLOWLIST.name)
    why_not = []
    for service in SERVICES:
        report, reason = audit(service, tmp_path / service)
        if report is None:
            why_not.append(reason)
            continue
        skipped, total = unaudited(report), len(report.get("dependencies", []))
        if skipped and len(skipped) == total:  # the service knows none of the pins: it did not answer
            why_not.append(f"{service}: no pinned package could be looked up ({skipped[0]}); {probe_pypi()}")
            continue
        assert not skipped, f"{service} could not audit {len(skipped)} of {total} pins:\n" + "\n".join(skipped)
        found, stale = unreviewed(report, allowed)
        assert not found, (
            f"pip-audit ({service}) found known vulnerabilities not in {ALLOWLIST.relative_to(REPO)}: review each "
            "(bump the pin if a fix exists and torch stays 2.13.0, else list it with why it does not affect "
            "scalelab):\n" + "\n".join(found)
        )
        assert not stale, f"{ALLOWLIST.relative_to(REPO)} lists findings the audit no longer reports: {stale}"
        return
    pytest.skip(
        "no vulnerability service answers from this machine, so the audit cannot run here: " + " | ".join(why_not)
    )
