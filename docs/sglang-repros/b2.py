"""B2 (sglang 0.5.23): MLATokenToKVPoolHost.get_contiguous_buf_infos describes rows, not layers.

It describes layer i as ``data_refs[i]``, ``kv_buffer[i].nbytes``, but the host buffer's
first dimension is the layer only in layer_first: in page_first ``kv_buffer[i]`` is token
i's row over all layers, in page_first_direct host page i. A transfer engine registered
with them moves the wrong bytes. An MLA host pool (3 layers, 4-token pages) per layout, as
each release's constructor takes it; sglang's default path. Exit 1 and "BUG PRESENT:
..." while descriptors do not cover each layer's bytes; 0 and "fixed" once they do.
"""

# Only needed off a GPU server: torchvision stand-in, shared steps (see its docstring).
import cpu_stand_ins as cpu
from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

LAYERS, PAGE, problems = 3, 4, []
host_args = dict(device_capacity_tokens=16, start_layer=0, end_layer=LAYERS)
host_args.update(target_layer_num=LAYERS)  # 0.5.23's host pools take the device geometry
with cpu.one_rank():
    args = dict(cpu.MLA, kv_lora_rank=16, qk_rope_head_dim=8, layer_num=LAYERS)
    dev = MLATokenToKVPool(size=16, page_size=PAGE, **args)
    new_api = hasattr(dev, "get_device_pool_infos")  # 0.5.23: the pool's buffer info
    source = dev.get_device_pool_infos()[0].buffer_info if new_api else dev
    for layout in ("layer_first", "page_first", "page_first_direct"):
        host = MLATokenToKVPoolHost(
            source, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
            override_kv_cache_dim=dev.kv_cache_dim, **(host_args if new_api else {}),
        )  # fmt: skip
        ptrs, lens, items = host.get_contiguous_buf_infos()
        if lens != [host.kv_buffer.nbytes // LAYERS] * LAYERS:
            problems.append(
                f"{layout}: {LAYERS} descriptors of {lens} bytes for a buffer of "
                f"{host.kv_buffer.nbytes} (item bytes {items[0]})"
            )
cpu.verdict("; ".join(problems), "fixed: every layout describes one range per layer")
