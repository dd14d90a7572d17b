"""S2 (sglang 0.5.23): at page size 1, SWA free() puts padding slot 0 into the window free list.

``free(idx)`` = ``free_swa(idx)`` + ``free_full(idx)``. Above page size 1, ``free_swa``
drops full-to-window mapping entries that read 0 (peer already released); at page size 1
``_free_swa_pages`` releases ``mapping[idx]`` as is, so slot 0, where padded tokens write,
joins the window's free list. A request's two tokens leave the window (``free_swa``), then
it finishes (``free``), at page sizes 1 and 4 (0.5.21: 1 only, its paged allocator needs
Triton); sglang's default path. Exit 1 and "BUG PRESENT: ..." while page size 1 frees slot 0.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu


def free_twice(page):
    """The window side's free list and free count after free_swa(req) then free(req)."""
    a = cpu.swa_allocator(full=32, window=16, page=page)
    grab = a.alloc if page == 1 else lambda n: a.alloc_extend(*map(cpu.ids, (0, 0, n, n, -1)), n)
    grab(12)  # another request holds most of the window side
    req = grab(2)  # the request under test
    a.free_swa(req)  # its tokens leave the sliding window: the window side is released
    a.free(req)  # the request finishes: free() releases both sides
    return a.swa_attn_allocator.free_pages.tolist(), a.swa_available_size()


(free1, avail1) = free_twice(1)
try:  # the control: page size 4 frees the same request without slot 0
    control = "page_size 4: {} ({})".format(*free_twice(4))
except RuntimeError as error:  # 0.5.21's paged allocator launches Triton: no control here
    if "active drivers" not in str(error):
        raise
    control = "page_size 4 not run (its allocator launches Triton here)"
cpu.verdict(
    0 in free1
    and (
        f"page_size 1: free() after free_swa() put slot 0 into the window free list "
        f"{free1.count(0)} time(s) (available {avail1}); {control}"
    ),
    f"fixed: page_size 1 free list {free1}; {control}",
)
