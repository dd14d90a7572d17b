"""My KV pool, its allocator and its host pool, as a kvcheck target (kvcheck's own classes
stand in for mine): kvcheck verify --target my_kv:target"""

import torch
from kvcheck import allocators, host_pools, pools
from kvcheck.surface import Surface
from kvcheck.targets.builtin import KVCheckTarget


class MyTarget(KVCheckTarget):  # kvcheck's serving side; my pool, allocator and host pool
    name = "my-kv"
    surface = Surface.of(mha={}).with_tiers(  # MHA only; no MLA, DSA or no-op pool: skipped
        allocators=("token",), host_layouts={"mha": ("layer_first",)}
    )

    def make_pool(self, spec, *, device):
        return self.pool_arguments(spec, device=device).build(pools.MHATokenToKVPool)

    def make_allocator(self, spec, *, device, kvcache=None):
        return allocators.TokenToKVPoolAllocator(
            spec.size, torch.bfloat16, device, kvcache, spec.need_sort
        )

    def make_host_pool(self, spec, device_pool, *, device):
        host = host_pools.MHATokenToKVPoolHost(
            device_pool, 2.0, 0, spec.page_size, spec.layout, host_token_capacity=spec.host_size
        )
        return (host,)


target = MyTarget()
