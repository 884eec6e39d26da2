"""Kubernetes objects checked against the API's OpenAPI schemas (``kubernetes-validate``,
strict: an unknown field is an error, as ``kubectl apply --validate=strict`` makes it)."""

from __future__ import annotations

import pathlib

SCHEMA_VERSION = "1.37.0"


def validate(obj: dict) -> None:
    """AssertionError naming the object and the field when ``obj`` is not valid."""
    import kubernetes_validate

    what = f"{obj.get('kind', '?')} {obj.get('metadata', {}).get('name', '?')}"
    try:
        kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.path)
        raise AssertionError(f"{what}: {path}: {e.message}") from None
    except kubernetes_validate.SchemaNotFoundError as e:
        raise AssertionError(f"{what}: no schema ({e})") from None


def load_manifests(path) -> list[dict]:
    """Every document of every YAML file under ``path`` (a file or a directory)."""
    import yaml

    path = pathlib.Path(path)
    files = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
    return [d for f in files for d in yaml.safe_load_all(f.read_text()) if d]
