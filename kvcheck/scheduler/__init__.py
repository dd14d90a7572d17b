"""The scheduler's KV memory over a request's life: kvcheck's reference model
(`model`), the laws it and any target keep after every step (`laws`, over a `snapshot`),
the machine that drives either (`machine`) and the choice of memory per target
(`drivers`)."""
