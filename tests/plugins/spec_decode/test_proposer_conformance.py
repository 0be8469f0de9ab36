"""The conformance kit's spec_proposer checks: the n-gram proposer passes them, and each
proposer of broken_proposers.py fails the check of the point it breaks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent

BROKEN = {
    "TooManyDrafts": "test_one_list_per_proposed_row_of_at_most_k_vocabulary_ids",
    "ReadsPastTheEnd": "test_one_list_per_proposed_row_of_at_most_k_vocabulary_ids",
    "DraftsForEveryRow": "test_one_list_per_proposed_row_of_at_most_k_vocabulary_ids",
    "WritesTheBatch": "test_the_batch_is_left_unchanged",
    "AcceptsAnyOption": "test_options_refuse_an_unknown_key_naming_it",
    "RandomDrafts": "test_the_same_batch_gives_the_same_drafts",
}


def run_kit(*targets: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    options = [f"--core-conformance=spec_proposer:{target}" for target in targets]
    # The engine runs (the nox conformance session's business) would only add minutes here.
    unit_checks = ["-k", "not same_with_speculation"]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *unit_checks, *options],
        cwd=HERE,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=600,
    )


def outcomes(stdout: str) -> dict[tuple[str, str], str]:
    """(check, proposer) -> PASSED / FAILED / SKIPPED of each test, from the -rA summary
    (several parametrizations of a check for one proposer: the worst)."""
    found = re.findall(
        r"^(PASSED|FAILED|SKIPPED) \S*test_spec_proposer\.py::(\w+)\[(\w+)", stdout, re.M
    )
    results: dict[tuple[str, str], str] = {}
    for outcome, check, proposer in found:
        if results.get((check, proposer)) != "FAILED":
            results[check, proposer] = outcome
    return results


def test_ngram_passes_and_each_broken_proposer_fails_its_check() -> None:
    done = run_kit("ngram", *(f"broken_proposers:{name}" for name in BROKEN))
    results = outcomes(done.stdout)
    ngram = {check: outcome for (check, name), outcome in results.items() if name == "ngram"}
    assert len(ngram) == 6 and set(ngram.values()) == {"PASSED"}, done.stdout + done.stderr
    for name, check in BROKEN.items():
        assert results[check, name] == "FAILED", (name, done.stdout)
