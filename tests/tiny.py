"""The tiny run config the simulator tests share: the tiny model (16 experts, top-2) on a
2x2 chip with 24 KiB of buffer (8 micro-slices of 3 KiB per expert), a few seconds a run."""

#: the run config as a mapping (``fsedp.config.run_from_dict``): 64 tokens, 4 layers
TINY = {
    "hardware": {
        "name": "tiny2x2",
        "rows": 2,
        "cols": 2,
        "clock_mhz": 800,
        "macs_per_chiplet": 2048,
        "onchip_buffer_kib": 24,
        "d2d_bandwidth_gbps": 288,
        "d2d_latency_ns": 4.02,
        "ddr_channels": 4,
        "ddr_bandwidth_gbps_per_channel": 25.6,
        "microslices_per_expert": 8,
    },
    "model": {
        "name": "tiny",
        "d_model": 64,
        "d_ffn": 128,
        "experts": 16,
        "top_k": 2,
        "shared_experts": 0,
        "layers": 4,
        "heads": 2,
        "params_b": 0.01,
    },
    "scheduler": "default",
    "scenario": {
        "tokens_per_iteration": 64,
        "rounds": 2,
        "seed": 5,
        "trace": "synthetic",
        "skew": 1.2,
        "prefill_fraction": 0.5,
    },
}

#: the same chip and model as a YAML file's text, 16 tokens and 3 layers (``fsedp run``)
TINY_RUN = """\
hardware: {name: tiny2x2, rows: 2, cols: 2, clock_mhz: 800, macs_per_chiplet: 2048,
           onchip_buffer_kib: 24, d2d_bandwidth_gbps: 288, d2d_latency_ns: 4.02,
           ddr_channels: 4, ddr_bandwidth_gbps_per_channel: 25.6, microslices_per_expert: 8}
model: {name: tiny, d_model: 64, d_ffn: 128, experts: 16, top_k: 2, shared_experts: 0,
        layers: 3, heads: 2, params_b: 0.01}
scheduler: default
scenario: {tokens_per_iteration: 16, rounds: 2, seed: 5, trace: synthetic, skew: 1.2,
           prefill_fraction: 0.5}
"""


def hand_setup(rows, cols, act_bytes=10, bpc=4, latency=3, microslice_bytes=100, **dp):
    """A simulator setup small enough to work the figures out by hand: a ``rows x cols``
    mesh (``fsedp.params.DatapathParams`` with the generics ``dp``), ``act_bytes`` a token,
    ``bpc`` bytes a link cycle, ``latency`` cycles a hop, ``microslice_bytes`` a
    micro-slice (the fields of ``fsedp.sim.setup.Setup`` the bounds and A8 read)."""
    from types import SimpleNamespace

    from fsedp.params import DatapathParams

    return SimpleNamespace(
        chiplets=rows * cols,
        dp=DatapathParams(rows=rows, cols=cols, **dp),
        act_bytes=act_bytes,
        link_bytes_per_cycle=bpc,
        link_latency_cycles=latency,
        microslice_bytes=microslice_bytes,
    )
