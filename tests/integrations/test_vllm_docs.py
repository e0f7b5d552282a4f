"""The --kv-transfer-config examples in docs/integrations/vllm.md are valid (no vLLM needed)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from kvtier.config import TierConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations" / "vllm.md"


def test_documented_kv_transfer_configs_are_valid() -> None:
    text = DOC.read_text(encoding="utf-8")
    blobs = re.findall(r"--kv-transfer-config '(\{.*?\})'", text, flags=re.S)
    assert len(blobs) == 3, "expected the prefill, the decode and the NIXL decode example"
    for blob in blobs:
        cfg = json.loads(blob)
        assert cfg["kv_connector"] == "OffloadingConnector"
        extra = cfg["kv_connector_extra_config"]
        assert extra["spec_name"] == "TieringOffloadingSpec"
        assert "backpressure" not in extra
        (entry,) = extra["secondary_tiers"]
        assert entry["type"] == "KvTierSecondaryTier"
        assert entry["module_path"] == "kvtier.integrations.vllm"
        TierConfig.from_dict(entry)  # every key known, every value valid
    prefill = json.loads(blobs[0])["kv_connector_extra_config"]["secondary_tiers"][0]
    assert prefill["port"] != 0, "a PD proxy must know the prefill engine's port"
    nixl = TierConfig.from_dict(json.loads(blobs[2])["kv_connector_extra_config"]["secondary_tiers"][0])
    assert nixl.data_plane == "nixl" and nixl.backends == ("UCX",)
