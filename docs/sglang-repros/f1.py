"""F1 (sglang 0.5.23): a refused free_segments / free_full_segments has freed the segments before.

``BaseTokenToKVPoolAllocator.free_segments`` (and ``free_full_segments``) free each segment
as the loop over ``_page_disjoint(segments)`` yields it; that generator asserts each
segment starts on a page after the previous one's last only when it reaches it. So when
the assert refuses the second segment the first is already freed, while the caller's row
still maps its slots. A page-size-1 allocator (sglang's default path on every release; the
paged and SWA allocators inherit the loop) holds two tokens, freed as two segments whose
second starts inside the first. Exit 1 and "BUG PRESENT: ..." while the refused call
changes ``available_size()``; 0 and "fixed" once it changes nothing.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
import torch
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator


def refused_free(method):
    """available_size() before and after ``method`` of two segments sharing slot 1."""
    allocator = TokenToKVPoolAllocator(4, torch.bfloat16, "cpu", None, False)
    row = allocator.alloc(2)
    before = allocator.available_size()
    try:
        getattr(allocator, method)([(row[:2], 0), (row[1:2], 1)])
    except AssertionError as refusal:
        return before, allocator.available_size(), str(refusal)
    return before, allocator.available_size(), None


results = {method: refused_free(method) for method in ("free_segments", "free_full_segments")}
changed = [f"{m} {b} -> {a}" for m, (b, a, refusal) in results.items() if refusal and b != a]
cpu.verdict(
    changed
    and (
        f"refused with AssertionError, yet available_size() went {', '.join(changed)}: "
        f"the first segment was freed before the second was refused"
    ),
    f"fixed: a refused call changed nothing {results}",
)
