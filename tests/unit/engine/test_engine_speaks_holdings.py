"""The engine speaks of holdings in its own words: no TPU API state name anywhere in engine/.

Each capacity adapter maps its platform's states to `HoldingState` in one table; the engine reads
only those. A TPU API queued-resource state written in engine/ (a literal, a docstring, a comment)
is the engine speaking one platform's language again, so this scan fails on any.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from google.cloud import tpu_v2

import tpujobs.engine
from tpujobs.adapters.tpu import QUEUED_RESOURCE_STATES
from tpujobs.domain.holdings import HOLDING_LOST, HOLDING_PENDING, HOSTS_GONE, HoldingState, holding_state

ENGINE = Path(tpujobs.engine.__file__).parent
TPU_STATES = frozenset(member.name for member in tpu_v2.QueuedResourceState.State)
# The TPU API's names that are no word of the engine's own. DELETING is left to the literal
# check: a warm pool's own state (`PoolState.DELETING`) has that name too.
TPU_ONLY = sorted(TPU_STATES - {s.name for s in HoldingState} - {"DELETING"})
TPU_WORD = re.compile(r"\b(" + "|".join(TPU_ONLY) + r")\b")


def _engine_sources() -> list[Path]:
    return sorted(ENGINE.rglob("*.py"))


def test_no_string_in_engine_is_a_tpu_api_state() -> None:
    """No string constant in engine/ is a queued-resource state name ("ACTIVE" included: the
    engine writes HoldingState.ACTIVE), and none mentions a TPU-only one (SUSPENDED, ...)."""
    found = []
    for path in _engine_sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
            if text is not None and (text in TPU_STATES or TPU_WORD.search(text)):
                found.append(f"{path.relative_to(ENGINE)}:{node.lineno}: {node.value[:80]!r}")
    assert found == []


def test_no_comment_in_engine_names_a_tpu_only_state() -> None:
    """Comments too: the engine's reasoning is in its own words."""
    found = []
    for path in _engine_sources():
        for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if token.type == tokenize.COMMENT and TPU_WORD.search(token.string):
                found.append(f"{path.relative_to(ENGINE)}:{token.start[0]}: {token.string}")
    assert found == []


def test_the_scan_would_see_a_planted_tpu_state() -> None:
    """The check can fail: a literal and a comment of the TPU API's words are both caught."""
    planted = 'if status.state == "SUSPENDED":  # WAITING_FOR_RESOURCES too\n    pass\n'
    constants = [n.value for n in ast.walk(ast.parse(planted)) if isinstance(n, ast.Constant)]
    assert "SUSPENDED" in TPU_STATES & set(constants)
    assert TPU_WORD.search(planted.split("#")[1])


def test_the_tpu_adapters_table_maps_every_queued_resource_state() -> None:
    """Every tpu_v2 QueuedResourceState.State member has a row, and nothing else does."""
    assert set(QUEUED_RESOURCE_STATES) == TPU_STATES
    assert QUEUED_RESOURCE_STATES["SUSPENDING"] is HoldingState.LOSING
    assert QUEUED_RESOURCE_STATES["SUSPENDED"] is HoldingState.LOST
    assert QUEUED_RESOURCE_STATES["STATE_UNSPECIFIED"] is HoldingState.UNKNOWN


def test_the_groups_say_what_each_state_means() -> None:
    """Pending and lost never overlap; a holding with hosts gone is lost; RELEASING, UNKNOWN are neither."""
    assert not HOLDING_PENDING & HOLDING_LOST
    assert HOSTS_GONE <= HOLDING_LOST and HoldingState.LOSING not in HOSTS_GONE
    assert {HoldingState.RELEASING, HoldingState.UNKNOWN}.isdisjoint(HOLDING_PENDING | HOLDING_LOST)


def test_a_stored_word_of_no_state_reads_as_unknown() -> None:
    """A capacity_state stored in the TPU API's words (before this table) is UNKNOWN, never an error."""
    assert holding_state("ACTIVE") is HoldingState.ACTIVE
    assert holding_state("WAITING_FOR_RESOURCES") is HoldingState.UNKNOWN
    assert holding_state(None) is HoldingState.UNKNOWN
    assert f"{HoldingState.LOST}" == "LOST"


def test_the_platform_page_says_every_holding_state_and_the_tpu_apis_table() -> None:
    """docs/platforms.md#holding-states lists every HoldingState and the TPU API's table as the code has it."""
    page = Path(tpujobs.engine.__file__).parents[3] / "docs" / "platforms.md"
    text = page.read_text().split("## Holding states", 1)[1].split("\n## ", 1)[0]
    words = set(re.findall(r"^\| ([A-Z]+) \| ", text, re.M))
    assert words == {state.value for state in HoldingState}
    rows = dict(re.findall(r"^\| `(\w+)` \| ([A-Z]+) \|$", text, re.M))
    assert rows == {name: state.value for name, state in QUEUED_RESOURCE_STATES.items()}
