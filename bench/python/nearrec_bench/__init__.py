"""Benchmark harnesses behind ``nearrec bench``: every system measured side by side with its
peers and the machine's limits in one run; results as JSON + Markdown under ``bench/results/``.

A distribution of its own (``nearrec-bench``, ``bench/pyproject.toml``), not in the ``nearrec``
wheel: ``make develop`` installs both, and ``nearrec bench`` without it says so. The harnesses
import the product as ``nearrec`` and their limits, baselines and load generator from
``nearrec_bench._native`` (``crates/nearrec-bench-py``, typed by ``_native.pyi``).

- ``cli``: ``nearrec bench WHAT`` — the registry, the flags, and the one path every harness
  runs (parse, configure, run, write), to which ``nearrec.cli`` hands the command line after
  WHAT; ``harness``: ``Harness``, which each module declares in its ``HARNESSES``;
  ``report``: records → JSON + Markdown, each cell's spread, ratios marked unreliable past
  ``SPREAD_LIMIT``.
- ``sls``: DRAM pooled lookups against ``nn.EmbeddingBag``, FBGEMM and TorchRec.
- ``ebc``: what the TorchRec-shaped surface costs (``EmbeddingBagCollection`` on a KJT against
  ``Store.lookup_many`` and ``nn.EmbeddingBag``).
- ``ssd`` (``ssd``, ``ssd-tuning``, ``ssd-verify``, ``ssd-cost``): the SSD tier against naive
  pread and the disk's limit; queue depth and pipelining; the read check's cost; CPU time per
  device read.
- ``cache``: the DRAM tiers against all-DRAM and SSD-S in a memory cgroup, per policy and plan.
- ``colocate``: the device reads row co-location saves, with and without merging.
- ``keyed``: keyed tables against ``torch.searchsorted`` + ``nn.EmbeddingBag`` and the DRAM tier.
- ``e2e``: the eight models end to end — PyTorch in DRAM, SSD-S, nearrec with PyTorch MLPs,
  whole-model offload — pipelined and serial, in DRAM and on SSD.
- ``torchrec``: a TorchRec DLRM with TorchRec's collection against the same model served by
  nearrec from DRAM and from SSD.
- ``flash`` (``flash-repro``, ``flash-check``): the papers' device-level experiments on the flash
  model beside the papers' numbers; the model fitted to this disk against the engine on it.
- ``gpu``: the GPU tier against the CPU and AIBox- and EVStore-like designs (on a lent GPU);
  ``gpu_hit`` (``gpu-hit``): its hit path's row bandwidth against the card's copy and read, and
  against the same pooling with the slots given.
- ``serve``: the storage node against host-side pooling (with and without a client cache),
  Redis and the embedded store, open loop (``nearrec-loadgen``), on loopback and behind a
  tc-limited veth pair.
- ``update``: a live store's durable writes against RocksDB and a rebuild, and what they cost
  the lookups served meanwhile.
- ``build``: store build throughput against the disk's sequential write.
"""
