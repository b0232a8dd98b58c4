"""The GPU that compiled code will run on, as far as the tiling heuristics care.

Element-wise kernels stream memory; how many elements a thread should keep in
flight depends on how much bandwidth each SM must cover. Timed against each
other in turns on the pw5 and mul-add-relu workloads:

- an H200 (4.8 TB/s, 36 GB/s an SM) streams fastest with 4-8 elements a
  thread (1024 a program, 4 warps, is the default); 2 a thread in programs of
  512 (8 warps) are 2-3% slower;
- an H100 (3.35 TB/s, 25 GB/s an SM) is the other way round: 512 and 8 warps
  are 1.2-1.3% faster than 1024 and 4, and the only choice that beats
  torch.compile (which autotunes its way to the same tiling) on both rows.

Reductions whose rows an element-wise epilogue reads again (softmax, layer
norm) follow the same split: the H200 is fastest with at most 8 warps for a
row of 8192 (32 warps are 2-3% slower), the H100 with 16 (0.2-0.4% faster
than 8, which is what separates irc from torch.compile on layer norm there).

The threshold between them (`SMALL_TILES_BELOW_GBPS_PER_SM`) is a guess that
no third GPU has checked; `--autotune` measures instead of guessing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

SMALL_TILES_BELOW_GBPS_PER_SM = 30.0


@dataclass(frozen=True)
class Target:
    """Options of the `tile` pass for one GPU; the default is the portable choice."""

    block: int = 1024  # elements a program of an element-wise kernel
    thread_elements: int = 8  # elements a thread of an element-wise kernel
    epilogue_warps: int = 8  # most warps of a reduction with an element-wise epilogue
    reason: str = "default tiling"
    sms: int = 132  # SMs, which a reduction's grid must fill (split-reduction)

    def tile_pass(self) -> str:
        """The `tile` step of a pipeline, with this target's options."""
        return (
            f"tile{{block={self.block} thread-elements={self.thread_elements} "
            f"epilogue-warps={self.epilogue_warps}}}"
        )


    def split_pass(self) -> str:
        """The `split-reduction` step of a pipeline, for this GPU's SM count."""
        return f"split-reduction{{sms={self.sms}}}"


def dram_gbps(props: Mapping[str, int]) -> float:
    """Peak DRAM bandwidth from Triton's device properties (kHz, bits; double data rate)."""
    return props["mem_clock_rate"] * 1e3 * 2 * props["mem_bus_width"] / 8 / 1e9


def target_for(props: Mapping[str, int]) -> Target:
    """The target for a GPU described by Triton's `get_device_properties`."""
    sms = props["multiprocessor_count"]
    per_sm = dram_gbps(props) / sms
    if per_sm < SMALL_TILES_BELOW_GBPS_PER_SM:
        return Target(
            512,
            2,
            16,
            f"{per_sm:.0f} GB/s an SM: 512-element programs, 2 a thread; up to 16 warps a row",
            sms,
        )
    return Target(reason=f"{per_sm:.0f} GB/s an SM: default tiling", sms=sms)


def cuda_target() -> Target:
    """The target for the current CUDA device (the default where it cannot tell)."""
    try:
        import torch
        from triton.runtime import driver

        props = driver.active.utils.get_device_properties(torch.cuda.current_device())
        return target_for(props)
    except Exception as e:  # noqa: BLE001 (another Triton or driver: fall back, say why)
        return Target(reason=f"default tiling (device properties unavailable: {e})")
