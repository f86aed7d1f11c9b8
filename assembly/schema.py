"""A JSON-schema subset checker for the JSON we read back (device profiles, benchmark results; used where the
jsonschema package is not installed; the tests validate with jsonschema too). Caching them: assembly/measured.py."""
from __future__ import annotations

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def check_schema(obj, schema: dict, where: str = "$") -> list[str]:
    """The JSON-schema subset RESULTS_SCHEMA uses (type, enum, required, properties, additionalProperties, items);
    returns the violations (empty when valid). Used where the jsonschema package is not installed."""
    errors = []
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        ok = any(isinstance(obj, (int, float)) and not isinstance(obj, bool) if t == "number" else
                 isinstance(obj, int) and not isinstance(obj, bool) if t == "integer" else isinstance(obj, _TYPES[t])
                 for t in types)
        if not ok:
            return [f"{where}: expected {'/'.join(types)}, got {type(obj).__name__}"]
    if "enum" in schema and obj not in schema["enum"]:
        errors.append(f"{where}: {obj!r} not in {schema['enum']}")
    if isinstance(obj, dict):
        errors += [f"{where}: missing {k!r}" for k in schema.get("required", []) if k not in obj]
        props = schema.get("properties", {})
        for k, v in obj.items():
            sub = props.get(k, schema.get("additionalProperties"))
            if isinstance(sub, dict):
                errors += check_schema(v, sub, f"{where}.{k}")
    if isinstance(obj, list) and "items" in schema:
        for i, v in enumerate(obj):
            errors += check_schema(v, schema["items"], f"{where}[{i}]")
    return errors
