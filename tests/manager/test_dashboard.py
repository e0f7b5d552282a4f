"""docs/grafana/kvtier.json: a well-formed Grafana dashboard whose queries resolve.

* the JSON matches a strict JSON schema of the dashboard model Grafana imports (panels, grid
  positions, Prometheus targets, the datasource and instance variables);
* the layout is sound (panels inside the 24-column grid, none overlapping, unique ids);
* every metric name its PromQL uses exists in the registry of a live manager after a real
  transfer, and rate()/increase()/histogram_quantile() are applied only to series of the right type.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from mgr_helpers import transfer_once

pytestmark = pytest.mark.timeout(60)

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "kvtier.json"

_DS = {"type": "object", "required": ["type", "uid"], "additionalProperties": False,
       "properties": {"type": {"const": "prometheus"}, "uid": {"const": "${datasource}"}}}
_GRID = {"type": "object", "required": ["h", "w", "x", "y"], "additionalProperties": False,
         "properties": {"h": {"type": "integer", "minimum": 1}, "w": {"type": "integer", "minimum": 1, "maximum": 24},
                        "x": {"type": "integer", "minimum": 0, "maximum": 23}, "y": {"type": "integer", "minimum": 0}}}
_TARGET = {"type": "object", "required": ["refId", "expr", "datasource"], "additionalProperties": False,
           "properties": {"refId": {"type": "string", "pattern": "^[A-Z]$"},
                          "expr": {"type": "string", "minLength": 1},
                          "legendFormat": {"type": "string"}, "datasource": _DS}}
_PANEL = {
    "type": "object",
    "required": ["id", "type", "title", "gridPos"],
    "properties": {
        "id": {"type": "integer", "minimum": 1},
        "type": {"enum": ["row", "timeseries", "stat", "gauge", "bargauge", "table"]},
        "title": {"type": "string", "minLength": 1},
        "description": {"type": "string"},
        "gridPos": _GRID,
        "datasource": _DS,
        "targets": {"type": "array", "minItems": 1, "items": _TARGET},
        "fieldConfig": {"type": "object", "required": ["defaults"],
                        "properties": {"defaults": {"type": "object", "properties": {"unit": {"type": "string"}}}}},
        "options": {"type": "object"},
        "collapsed": {"type": "boolean"},
        "panels": {"type": "array", "maxItems": 0},
    },
    "if": {"properties": {"type": {"const": "row"}}},
    "then": {"not": {"required": ["targets"]}},
    "else": {"required": ["datasource", "targets", "fieldConfig"]},
}
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["title", "uid", "schemaVersion", "panels", "templating", "time"],
    "properties": {
        "title": {"type": "string", "minLength": 1},
        "uid": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$"},
        "schemaVersion": {"type": "integer", "minimum": 36},
        "version": {"type": "integer"},
        "refresh": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "time": {"type": "object", "required": ["from", "to"]},
        "panels": {"type": "array", "minItems": 1, "items": _PANEL},
        "templating": {
            "type": "object", "required": ["list"],
            "properties": {"list": {
                "type": "array",
                "items": {"type": "object", "required": ["name", "type"],
                          "properties": {"name": {"type": "string"},
                                         "type": {"enum": ["datasource", "query", "custom", "interval"]}}},
                "allOf": [
                    {"contains": {"properties": {"name": {"const": "datasource"}, "type": {"const": "datasource"},
                                                 "query": {"const": "prometheus"}}, "required": ["query"]}},
                    {"contains": {"properties": {"name": {"const": "instance"}, "type": {"const": "query"}}}},
                ],
            }},
        },
    },
}

_METRIC = re.compile(r"\bkvtier_[a-z_]+\b")
_WRAPPED = re.compile(r"\b(rate|increase|irate)\(\s*(kvtier_[a-z_]+)")
_QUANTILE = re.compile(r"histogram_quantile\([^,]+,\s*sum by \(([^)]*)\) \(rate\((kvtier_[a-z_]+)")


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def _exprs(dash: dict) -> list[str]:
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", ())]


def test_dashboard_matches_the_schema_and_its_grid_is_sound() -> None:
    dash = _dashboard()
    jsonschema.validate(dash, SCHEMA, cls=jsonschema.Draft202012Validator)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[x, y]!r}"
                cells[x, y] = p["title"]
    for p in dash["panels"]:
        refs = [t["refId"] for t in p.get("targets", ())]
        assert len(refs) == len(set(refs)), p["title"]
    for e in _exprs(dash):
        assert e.count("(") == e.count(")") and e.count("{") == e.count("}"), e
        assert 'instance=~"$instance"' in e, f"not filtered by the instance variable: {e}"


def test_the_schema_rejects_a_broken_dashboard() -> None:
    dash = _dashboard()
    dash["panels"][1]["targets"][0].pop("expr")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(dash, SCHEMA, cls=jsonschema.Draft202012Validator)


def test_every_query_resolves_in_a_live_registry_after_a_real_transfer(make_manager) -> None:
    p = make_manager({})
    c = make_manager({})
    assert transfer_once(p, c, "kv-dash").success

    declared: dict[str, str] = {}  # every sample name the registry can expose -> its family's type
    with_samples: set[str] = set()
    for registry in (p.metrics, c.metrics):
        for fam in registry.collect():
            suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(fam.type, ("",))
            for sfx in suffixes:
                declared[fam.name + sfx] = fam.type
            with_samples |= {s.name for s in fam.samples}

    exprs = _exprs(_dashboard())
    used = {m for e in exprs for m in _METRIC.findall(e)}
    assert used, "the dashboard queries no kvtier series"
    missing = sorted(used - set(declared))
    assert not missing, f"the dashboard queries series no live registry has: {missing}"
    # a real transfer gave the bandwidth and duration panels data
    for name in ("kvtier_transfer_bytes_sum", "kvtier_transfer_duration_seconds_bucket",
                 "kvtier_parked_ids", "kvtier_sessions", "kvtier_jobs_total"):
        assert name in used and name in with_samples, name
    for e in exprs:
        for fn, name in _WRAPPED.findall(e):
            assert declared[name] in ("counter", "histogram"), f"{fn}() over the gauge {name}: {e}"
            assert name.endswith(("_total", "_sum", "_count", "_bucket")), f"{fn}() over {name}: {e}"
        for by, name in _QUANTILE.findall(e):
            assert name.endswith("_bucket") and "le" in [x.strip() for x in by.split(",")], e
