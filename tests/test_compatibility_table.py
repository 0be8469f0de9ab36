"""docs/reference/compatibility.md is what core.compatibility_table renders from the rules
and the platforms' declarations: regenerated here and compared with the committed page."""

from __future__ import annotations

from pathlib import Path

from core_cuda.platform import CudaPlatform
from core_rocm.platform import RocmPlatform

from core.compatibility_table import REGENERATE, compatibility_page
from core.config_rules import RULES
from core.platforms.cpu import CpuPlatform

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "compatibility.md"
PLATFORMS = [CpuPlatform, CudaPlatform, RocmPlatform]


def test_the_committed_page_is_what_the_rules_generate():
    assert PAGE.read_text() == compatibility_page(PLATFORMS), (
        f"docs/reference/compatibility.md is out of date; regenerate it: {REGENERATE}"
    )


def test_the_page_lists_every_rule_and_marks_a_default_that_yields():
    page = compatibility_page(PLATFORMS)
    assert all(f"| `{rule.name}` |" in page for rule in RULES)
    assert "✗ `lora-eager`†" in page  # the -O x --enable-lora cell
    assert "✗ `pipeline-lora` |" in page  # both sides always explicit: no mark


def test_the_platform_rows_come_from_the_declarations():
    page = compatibility_page(PLATFORMS)
    assert "| default `-O` level | -O0 | -O2 | -O2 |" in page
    assert "| `-O2` (graph capture) | ✗ | ✓ | ✓ |" in page
    assert "| `--gpu-memory-utilization` | ✗ | ✓ | ✓ |" in page
