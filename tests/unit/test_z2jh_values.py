"""hub/z2jh/values.yaml against Zero to JupyterHub's own values schema (chart 4.4.0, vendored in
tests/hub/z2jh-4.4.0/ with its licence), as `helm install` validates it: the chart's defaults merged
with ours (maps merged, lists and scalars replaced), then the JSON schema the chart ships. The schema
rejects what helm would (a misspelt key: additionalProperties false almost everywhere), which the
test proves too. Then what the values are for: GPUs and MIG by profile, a CPU guarantee and limit,
/dev/shm in memory, the data read-only, the course's image and first page, the idle culler.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "tests" / "hub" / "z2jh-4.4.0"
VALUES = ROOT / "hub" / "z2jh" / "values.yaml"
# KubeSpawner traits the chart itself sets from singleuser values (its files/hub/jupyterhub_config.py, 4.4.0):
# a profile's kubespawner_override may set these; the schema leaves profileList's items unchecked.
OVERRIDABLE = {"image", "cpu_limit", "cpu_guarantee", "mem_limit", "mem_guarantee", "extra_resource_limits",
               "extra_resource_guarantees", "environment", "node_selector", "tolerations", "default_url"}


def merged(defaults: dict, values: dict) -> dict:
    """Helm's coalescing of user values over the chart's: maps merged key by key, anything else replaced,
    null removes the key."""
    out = copy.deepcopy(defaults)
    for key, value in values.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@pytest.fixture(scope="module")
def schema():
    return json.loads((CHART / "values.schema.json").read_text())


@pytest.fixture(scope="module")
def values():
    return yaml.safe_load(VALUES.read_text())


def _validate(schema, values):
    defaults = yaml.safe_load((CHART / "chart-values.yaml").read_text())
    jsonschema.validate(merged(defaults, values), schema, cls=jsonschema.Draft7Validator)


def test_the_values_pass_the_charts_schema(schema, values):
    _validate(schema, values)


@pytest.mark.parametrize("broken", [
    {"singleuser": {"cpus": {"limit": 8}}},                               # misspelt
    {"singleuser": {"cpu": {"limit": "eight"}}},                          # not a number
    {"cull": {"enabled": "yes"}},                                         # not a boolean
    {"singleuser": {"storage": {"type": "somewhere"}}},                   # not one of the kinds
])
def test_the_schema_rejects_what_helm_would(schema, values, broken):
    with pytest.raises(jsonschema.ValidationError):
        _validate(schema, merged(values, broken))


def test_what_the_values_give_each_learner(values):
    su = values["singleuser"]
    profiles = su["profileList"]
    assert sum(bool(p.get("default")) for p in profiles) == 1
    for profile in profiles:
        unknown = set(profile.get("kubespawner_override", {})) - OVERRIDABLE
        assert not unknown, (profile["display_name"], unknown)
    gpus = [p["kubespawner_override"].get("extra_resource_limits", {}) for p in profiles]
    assert {"nvidia.com/gpu": "1"} in gpus and {"nvidia.com/gpu": "2"} in gpus
    assert any(k.startswith("nvidia.com/mig-") for g in gpus for k in g)
    assert any(p["kubespawner_override"].get("environment", {}).get("CUDA_VISIBLE_DEVICES") == "" for p in profiles)
    assert su["cpu"]["guarantee"] == su["cpu"]["limit"] >= 2         # a limit: the container's cpu.max, which
    for p in profiles:                                                 # usable_cores() reads
        o = p["kubespawner_override"]
        if "cpu_limit" in o:
            assert o["cpu_guarantee"] == o["cpu_limit"]
    shm = next(v for v in su["storage"]["extraVolumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "shm", "mountPath": "/dev/shm"} in su["storage"]["extraVolumeMounts"]
    data = next(m for m in su["storage"]["extraVolumeMounts"] if m["name"] == "course-data")
    assert data["readOnly"] and su["extraEnv"]["COURSE_DATA"].startswith(data["mountPath"])
    first = su["defaultUrl"].removeprefix("/lab/tree/feed-the-gpu/")
    assert (ROOT / "notebooks" / first).exists()
    assert "feed-the-gpu" in su["image"]["name"] and su["image"]["tag"]
    assert values["cull"]["enabled"] and values["cull"]["timeout"] > 0
    assert values["hub"]["config"]["JupyterHub"]["authenticator_class"] == "shared-password"
