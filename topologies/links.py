"""Link efficiencies: the fraction of a link's line rate NCCL's transfers reach, per link
generation, each with its public source.

A server preset (:mod:`topologies.presets`) takes its NVLink, NVLS and NIC fractions from
here; the flow network then runs every link at line rate × fraction, so a ring reaches the
busbw nccl-tests publishes. A fraction marked unverified has no public measurement of its
own and borrows the nearest measured generation's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinkEfficiency:
    """One link generation's measured fraction of its line rate."""

    fraction: float
    source: str
    verified: bool = True
    """False: no public measurement of this generation; borrowed (see ``source``)."""


_NVLINK4 = ("NCCL maintainer (sjeaugey) in NVIDIA/nccl-tests issue 212, 8x H100 SXM: NCCL "
            "reaches an effective NVLink bandwidth of about 370 GB/s of the 450 GB/s per "
            "direction (protocol overhead ~20%, seen as ring busbw)")
_NVLS4 = ("NVIDIA/nccl-tests issue 212: all-reduce with NVLink SHARP peaks at busbw ~480 GB/s "
          "(algbw ~275) on 8x H100; NVLS moves S up and S down at algbw, so 275/370 of the "
          "effective NVLink rate")
_NDR = ("NVIDIA (AddyLaddy) in NVIDIA/nccl-tests issue 267: ConnectX-7 NICs at NDR rate "
        "(400 Gb/s, 50 GB/s) should achieve up to 48-49 GB/s per NIC: 48.5/50")

LINKS: dict[str, LinkEfficiency] = {
    "nvlink3": LinkEfficiency(0.70, "nccl-tests all_reduce on 8x A100-SXM4 reaches a busbw of "
                              "about 200-208 GB/s of the 300 GB/s per direction (NVIDIA/"
                              "nccl-tests issues 149, 178)"),
    "nvlink4": LinkEfficiency(370 / 450, _NVLINK4),
    "nvlink5": LinkEfficiency(370 / 450, _NVLINK4 + "; assumed for NVLink 5 (Blackwell): no "
                              "public nccl-tests figure recorded", verified=False),
    "nvls4": LinkEfficiency(275 / 370, _NVLS4),
    "nvls5": LinkEfficiency(275 / 370, _NVLS4 + "; assumed for Blackwell's NVLink SHARP",
                            verified=False),
    "ib-hdr": LinkEfficiency(0.90, "HDR InfiniBand (200 Gb/s): ring all_reduce busbw about "
                             "85-96 of 100 GB/s over 4 HDR NICs per 8x A100 server (NVIDIA/"
                             "nccl-tests issue 119); NVIDIA measures 192 of 200 GB/s on DGX "
                             "A100 with 8 HDR NICs (NVIDIA/nccl issue 812)"),
    "ib-ndr": LinkEfficiency(48.5 / 50, _NDR),
    "ib-xdr": LinkEfficiency(48.5 / 50, _NDR + "; assumed for XDR (800 Gb/s ConnectX-8): no "
                             "public nccl-tests figure recorded", verified=False),
    "roce-400g": LinkEfficiency(48.5 / 50, _NDR + " (said of a RoCE cluster of H100 servers "
                                "with 8x 400 Gb/s ConnectX-7: the same NIC at the same rate)"),
    "tcpxo-200g": LinkEfficiency(187.48 / 200, "Google Cloud's A3 Mega bootcamp (saltysoup/"
                                 "a3-bootcamp-ce, Day1/pretraining-with-nemo-on-slurm/README.md): "
                                 "all_gather_perf on two a3-megagpu-8g VMs (8 NICs of 200 Gb/s "
                                 "each on GPUDirect-TCPXO), ring busbw 187.48 GB/s at 8 GiB, which "
                                 "on two servers is 8 x the per-NIC rate; the guide itself says "
                                 "~180 GB/s, 1440 of the VM's 1600 Gb/s"),
    "opa-100": LinkEfficiency(39.87 / 100, "Intel Omni-Path (100 Gb/s) under NCCL 2.10.3's "
                              "IB verbs on the hfi1 HFIs: bigscience-workshop/bigscience "
                              "experiments/bandwidth/all_reduce_bench-a100-n4.txt (commit "
                              "358e3c8, 2022-01-28), all_reduce_bench.py over 4 GB of fp32 on "
                              "4 Jean Zay A100 80GB servers (4 ranks each), both ring channels "
                              "through one HFI of each server (NET/IB/1), busbw 39.87 Gb/s "
                              "(1.505 s), the HFI's throughput; experiments/bandwidth/README.md: "
                              "'an issue with nccl that doesn't fully utilize Intel OPA full "
                              "bandwidth'"),
    "pcie-gen5-host": LinkEfficiency(28 / 64, "8 GPUs on PCIe Gen5 x16 (64 GB/s per "
                                     "direction) through the CPU, no NVLink: all_reduce busbw "
                                     "28 GB/s, which the NCCL maintainer calls the CPU and "
                                     "memory's limit, not the link's (NVIDIA/nccl issue 1639)"),
}
"""Link generations by name: NVLink 3/4/5, NVLink SHARP, InfiniBand HDR/NDR/XDR, RoCE at
400 Gb/s, Google's GPUDirect-TCPXO at 200 Gb/s, Intel Omni-Path at 100 Gb/s, and PCIe Gen5
through a host bridge."""
