"""S1 (sglang 0.5.23): a refused SWATokenToKVPoolAllocator.alloc_decode leaks the full side's page.

``alloc``, ``alloc_extend`` and ``alloc_extend_swa_tail`` first ask whether both sides have
the pages; ``alloc_decode`` calls both sides' ``alloc_decode`` unconditionally and returns
None if either did, so the other side's new page is consumed and never freed. A page-4
allocator (full 16 tokens, window 8) holds one 8-token request; its decode token 9 needs a
new page on both sides, and the window has none. sglang's default path runs here (0.5.21's
paged allocator is Triton only: exit 3, run it on a GPU). Exit 1 and "BUG PRESENT: ..."
while the refused decode changes the full side's free tokens; 0 once it changes nothing.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu

T, PAGE = cpu.ids, 4
alloc = cpu.swa_allocator(full=16, window=8, page=PAGE)
locs = cpu.on_cpu(lambda: alloc.alloc_extend(T(0), T(0), T(8), T(8), T(-1), 8))  # SWA now full
full_before = alloc.full_available_size()
out = alloc.alloc_decode(T(9), T(9), T(int(locs[-1])))  # token 9 starts a page on both sides
full_after = alloc.full_available_size()
cpu.verdict(
    out is None
    and full_after != full_before
    and (
        f"alloc_decode returned None (SWA side full) but the full side's free tokens went "
        f"{full_before} -> {full_after}: a page was taken and is now owned by nobody"
    ),
    "fixed: the refused decode left the full side as it was",
)
