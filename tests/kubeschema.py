"""Kubernetes manifests checked against the API's own OpenAPI schema, offline.

``kubernetes_validate`` ships JSON schemas generated from each Kubernetes release; the
strict variant refuses fields the API does not know, which is how a misspelled field
(silently dropped by ``kubectl apply --validate=false``, or a warning at best) shows up
here instead of on a cluster.
"""

from __future__ import annotations

import pathlib
from typing import Optional

import kubernetes_validate
import yaml
from kubernetes_validate import utils as _kv

# the newest schema this kubernetes_validate ships, so a field removed from the API fails
SCHEMA_VERSION = _kv.latest_version()


def _label(obj: dict) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind', '?')}/{meta.get('name', '?')}"


def validate(obj: dict, kind_hint: Optional[str] = None) -> str:
    """Validates ``obj`` (strict) against the newest schema; returns the schema version.
    Raises AssertionError naming the object and the validator's message and path.
    ``kind_hint``: checked against ``obj['kind']`` (a mistyped kind would otherwise
    be reported as a missing schema)."""
    if not isinstance(obj, dict) or "kind" not in obj or "apiVersion" not in obj:
        raise AssertionError(f"not a Kubernetes object (needs apiVersion and kind): {obj!r:.200}")
    if kind_hint is not None and obj["kind"] != kind_hint:
        raise AssertionError(f"{_label(obj)}: expected kind {kind_hint}")
    try:
        return kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = "/".join(str(p) for p in e.path) or "(top level)"
        raise AssertionError(f"{_label(obj)} is invalid (Kubernetes {SCHEMA_VERSION} schema, "
                             f"strict) at {path}: {e.message}") from e
    except kubernetes_validate.SchemaNotFoundError as e:
        raise AssertionError(f"{_label(obj)}: no schema for {obj['apiVersion']} "
                             f"{obj['kind']} in Kubernetes {SCHEMA_VERSION}: {e}") from e


def load_manifests(path) -> list[dict]:
    """Every document of a (multi-document) YAML file; empty documents skipped."""
    text = pathlib.Path(path).read_text()
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]
