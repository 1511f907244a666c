"""The CPU weight a testbed daemon gets (dataplane/testbed/cpu_weight.py): read from a unit's text
as systemd reads it, and the shipped unit gives the daemon more than a default service's share
(docs/operating.md#cpu-weight: the answers and the bursts under a busy host depend on it)."""
from __future__ import annotations

import pathlib

import pytest

from dataplane.testbed import cpu_weight

UNIT = pathlib.Path(__file__).resolve().parents[2] / "packaging" / "flannel-udp.service"


def test_a_unit_without_a_weight_has_the_default():
    assert cpu_weight.unit_weight("[Service]\nType=notify\n") == cpu_weight.DEFAULT_WEIGHT == 100


def test_the_last_setting_counts_as_systemd_reads_it():
    text = "[Service]\nCPUWeight=200\n# CPUWeight=9\n  CPUWeight = 300 \nCPUWeightX=5\n"
    assert cpu_weight.unit_weight(text) == 300


@pytest.mark.parametrize("bad", ["0", "10001", "idle", "", "1.5"])
def test_a_weight_out_of_range_is_refused_with_the_range(bad):
    with pytest.raises(ValueError, match="1..10000"):
        cpu_weight.unit_weight(f"[Service]\nCPUWeight={bad}\n")


def test_the_shipped_unit_weighs_more_than_a_default_service():
    weight = cpu_weight.unit_weight(UNIT.read_text())
    assert cpu_weight.DEFAULT_WEIGHT < weight <= 1000
