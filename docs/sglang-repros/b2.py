"""B2 (sglang 0.5.23): MLATokenToKVPoolHost.get_contiguous_buf_infos describes rows, not layers.

It describes layer i as ``data_refs[i]``, ``kv_buffer[i].nbytes``, but the host buffer's
first dimension is the layer only in layer_first: in page_first ``kv_buffer[i]`` is token
i's row over all layers, in page_first_direct host page i. A transfer engine registered
with them moves the wrong bytes. An MLA host pool (3 layers, 4-token pages) per layout,
sglang's default path (exit 3 before 0.5.23's host-pool API). Exit 1 and "BUG PRESENT:
..." while descriptors do not cover each layer's bytes; 0 and "fixed" once they do.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

if not hasattr(MLATokenToKVPool, "get_device_pool_infos"):
    cpu.cannot_check("this sglang's MLA pool has no get_device_pool_infos (0.5.23's API)")
LAYERS, PAGE, problems = 3, 4, []
host_args = dict(pin_memory=False, device="cpu", device_capacity_tokens=16, start_layer=0)
host_args.update(end_layer=LAYERS, target_layer_num=LAYERS)
with cpu.one_rank():
    args = dict(cpu.MLA, kv_lora_rank=16, qk_rope_head_dim=8, layer_num=LAYERS)
    dev = MLATokenToKVPool(size=16, page_size=PAGE, **args)
    info, dim = dev.get_device_pool_infos()[0].buffer_info, dev.kv_cache_dim
    for layout in ("layer_first", "page_first", "page_first_direct"):
        host = MLATokenToKVPoolHost(
            info, 2.0, 0, PAGE, layout, override_kv_cache_dim=dim, **host_args
        )
        ptrs, lens, items = host.get_contiguous_buf_infos()
        if lens != [host.kv_buffer.nbytes // LAYERS] * LAYERS:
            problems.append(
                f"{layout}: {LAYERS} descriptors of {lens} bytes for a buffer of "
                f"{host.kv_buffer.nbytes} (item bytes {items[0]})"
            )
cpu.verdict("; ".join(problems), "fixed: every layout describes one range per layer")
