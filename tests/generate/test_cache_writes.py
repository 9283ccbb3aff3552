"""Nothing outside model/ writes a cache tensor (issue 47): the serving pool, the compiled step's callers, the
measured step and the server call the cache's own methods (reset, set_read, view, gather / scatter, write_entries,
admit, select, rewind), so a cache's padding, lengths and positions are kept in one place.

Read from the source with ast: an assignment into, or an in-place call on, an attribute named like a cache's tensor
(lengths, positions, keep, buffers) of an object named like a cache (kv, cache, view, pool). Checked against the
pool as it was before the cache face (it set kv.lengths[slot] and kv.positions[slot] itself)."""

from __future__ import annotations

import ast
from pathlib import Path

import tformer

CACHE_TENSORS = {"lengths", "positions", "keep", "buffers"}
CACHE_NAMES = {"kv", "cache", "view", "pool", "_cache"}
IN_PLACE = {"add_", "sub_", "copy_", "index_copy_", "index_put_", "fill_", "zero_", "masked_fill_"}
PACKAGE = Path(tformer.__file__).parent

# slot_pool.py before the one cache face (commit db9a0ab): the lines this test exists to catch
OLD_POOL = """
def _reset(self, slot):
    self.used[slot] = 0
    self.kv.lengths[slot] = 0
    self.kv.positions[slot] = 0

def step(self, index, back):
    self.kv.lengths.index_copy_(0, index, back)
"""


def _cache_tensor(node: ast.AST) -> bool:
    """``<cache-like>.<tensor>`` with any subscripts after it: kv.lengths, self.kv.keep[:, :t], cache.kv.buffers."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if not (isinstance(node, ast.Attribute) and node.attr in CACHE_TENSORS):
        return False
    owner = node.value
    name = owner.attr if isinstance(owner, ast.Attribute) else owner.id if isinstance(owner, ast.Name) else ""
    return name in CACHE_NAMES


def cache_writes(source: str) -> list[int]:
    """Line numbers where ``source`` writes a cache tensor."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        if any(isinstance(t, ast.Subscript) and _cache_tensor(t) for t in targets):
            found.append(node.lineno)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in IN_PLACE
                and _cache_tensor(node.func.value)):
            found.append(node.lineno)
    return found


def test_the_check_finds_the_writes_the_pool_used_to_make():
    assert len(cache_writes(OLD_POOL)) == 3


def test_no_package_above_model_writes_a_cache_tensor():
    outside = [p for p in PACKAGE.rglob("*.py") if "model" not in p.relative_to(PACKAGE).parts[:1]]
    assert len(outside) > 50
    writes = {str(p.relative_to(PACKAGE)): lines for p in outside if (lines := cache_writes(p.read_text()))}
    assert writes == {}
