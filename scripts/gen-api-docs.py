#!/usr/bin/env python3
"""Write docs/api.md, the HTTP API reference, from crates/airlock-server/src/openapi.json.

    python3 scripts/gen-api-docs.py           # (re)write docs/api.md
    python3 scripts/gen-api-docs.py --check   # exit 1 if docs/api.md is not what this writes

The OpenAPI document is the contract (the server serves it at GET /openapi.json and
schemathesis holds the server to it), so the reference is generated from it and never
edited by hand: crates/airlock/tests/docs.rs runs `--check`. Python 3 standard library only.
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "crates/airlock-server/src/openapi.json"
TARGET = ROOT / "docs/api.md"
METHODS = ["get", "post", "put", "patch", "delete", "head", "options", "trace"]


def cell(text):
    """Text fit for one Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def anchor(kind, name):
    return f"{kind}-" + "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def ref_name(ref):
    return ref.rsplit("/", 1)[-1]


def type_of(schema):
    """A short type expression for a schema: `string`, `[Limits](#schema-limits)`, `array of X`."""
    if schema is None:
        return ""
    if "$ref" in schema:
        name = ref_name(schema["$ref"])
        kind = "response" if "/responses/" in schema["$ref"] else "schema"
        return f"[{name}](#{anchor(kind, name)})"
    for key in ("oneOf", "anyOf", "allOf"):
        if key in schema:
            return (" and " if key == "allOf" else " or ").join(type_of(s) for s in schema[key])
    t = schema.get("type")
    if isinstance(t, list):
        parts = [x for x in t if x != "null"]
        base = " or ".join(type_of({**schema, "type": p}) for p in parts)
        return base + (" or null" if "null" in t else "")
    if t == "array":
        return "array of " + (type_of(schema.get("items")) or "any")
    if "enum" in schema:
        return " | ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if t == "object" and "additionalProperties" in schema and isinstance(schema["additionalProperties"], dict):
        return "object of " + type_of(schema["additionalProperties"])
    return t or "any"


def bounds(schema):
    out = []
    for key, word in (("minimum", "min"), ("maximum", "max"), ("minLength", "min length"),
                      ("maxLength", "max length"), ("minItems", "min items"), ("maxItems", "max items"),
                      ("pattern", "pattern")):
        if key in schema:
            out.append(f"{word} `{schema[key]}`")
    if "default" in schema:
        out.append(f"default `{json.dumps(schema['default'])}`")
    return "; ".join(out)


def operation(lines, path, method, op, shared_params):
    lines.append(f"### {method.upper()} {path}")
    lines.append("")
    lines.append(f"<a id=\"{anchor('op', op.get('operationId', method + path))}\"></a>")
    if op.get("summary"):
        lines += [f"**{op['summary']}**", ""]
    if op.get("description"):
        lines += [op["description"], ""]
    params = shared_params + op.get("parameters", [])
    if params:
        lines += ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
        for p in params:
            lines.append(f"| `{p['name']}` | {p['in']} | {cell(type_of(p.get('schema')))} | "
                         f"{'yes' if p.get('required') else 'no'} | {cell(p.get('description', ''))} |")
        lines.append("")
    body = op.get("requestBody")
    if body:
        kinds = [f"`{ct}`: {type_of(c.get('schema')) or 'any'}" for ct, c in body.get("content", {}).items()]
        req = "required" if body.get("required") else "optional"
        lines += [f"Request body ({req}): " + "; ".join(kinds) + ".", ""]
        if body.get("description"):
            lines += [body["description"], ""]
    lines += ["| status | body | meaning |", "|---|---|---|"]
    for status, resp in op.get("responses", {}).items():
        if "$ref" in resp:
            lines.append(f"| {status} | {type_of(resp)} | |")
            continue
        kinds = ", ".join(f"`{ct}` {type_of(c.get('schema'))}".strip() for ct, c in resp.get("content", {}).items())
        lines.append(f"| {status} | {cell(kinds)} | {cell(resp.get('description', ''))} |")
    lines.append("")


def inline_object(schema):
    """The inline object schema (with properties) that `schema` is, or holds as array items or
    as a nullable alternative; None for a `$ref` or a scalar."""
    if not isinstance(schema, dict) or "$ref" in schema:
        return None
    if "properties" in schema:
        return schema
    if isinstance(schema.get("items"), dict):
        return inline_object(schema["items"])
    for key in ("oneOf", "anyOf"):
        for alt in schema.get(key, []):
            found = inline_object(alt)
            if found:
                return found
    return None


def property_rows(lines, schema, prefix=""):
    """One table row per property, and rows for the properties of inline objects under it
    (`error.code`, `results[].kind`)."""
    required = set(schema.get("required", []))
    for pname, p in schema.get("properties", {}).items():
        lines.append(f"| `{prefix}{pname}` | {cell(type_of(p))} | {'yes' if pname in required else 'no'} | "
                     f"{cell(bounds(p))} | {cell(p.get('description', ''))} |")
        inner = inline_object(p)
        if inner:
            suffix = "[]." if p.get("type") == "array" else "."
            property_rows(lines, inner, prefix + pname + suffix)


def property_table(lines, schema):
    lines += ["| property | type | required | bounds, default | description |", "|---|---|---|---|---|"]
    property_rows(lines, schema)
    lines.append("")


def schema_section(lines, name, schema, kind="schema"):
    lines += [f"### {name}", "", f"<a id=\"{anchor(kind, name)}\"></a>", ""]
    if schema.get("description"):
        lines += [schema["description"], ""]
    if schema.get("properties"):
        property_table(lines, schema)
    for key in ("oneOf", "anyOf"):
        alts = schema.get(key, [])
        if not alts:
            continue
        lines += [("One of:" if key == "oneOf" else "Any of:"), ""]
        for i, alt in enumerate(alts):
            label = alt.get("title")
            if not label and "type" not in alt and "$ref" not in alt and alt.get("required"):
                label = "with " + ", ".join(f"`{r}`" for r in alt["required"])
            label = label or type_of(alt) or f"form {i + 1}"
            lines += [f"#### {name}: {label}", ""]
            if alt.get("description"):
                lines += [alt["description"], ""]
            if alt.get("properties"):
                property_table(lines, alt)
            elif "$ref" not in alt and alt.get("type") not in (None, "object"):
                lines += [f"Type: {type_of(alt)}.", ""]
    if not schema.get("properties") and not any(k in schema for k in ("oneOf", "anyOf")):
        t = type_of(schema)
        if t and t != "object":
            lines += [f"Type: {t}.", ""]


def render(doc):
    info = doc["info"]
    lines = [
        "# HTTP API reference",
        "",
        "<!-- Generated by scripts/gen-api-docs.py from crates/airlock-server/src/openapi.json."
        " Do not edit: change the OpenAPI document and run `python3 scripts/gen-api-docs.py`. -->",
        "",
        f"{info['title']} {info['version']}: {info.get('summary', '')}",
        "",
        info.get("description", ""),
        "",
        "This page is generated from the OpenAPI document the server serves at `GET /openapi.json`"
        " (where the limits' maxima and defaults are that server's own flags). For a guided tour"
        " see [service.md](service.md).",
        "",
        "## Routes",
        "",
    ]
    by_tag = {t["name"]: [] for t in doc.get("tags", [])}
    ops = []
    for path, item in doc["paths"].items():
        shared = item.get("parameters", [])
        for method in METHODS:
            if method in item:
                op = item[method]
                ops.append((path, method, op, shared))
                by_tag.setdefault((op.get("tags") or ["other"])[0], []).append((path, method, op))
    tag_desc = {t["name"]: t.get("description", "") for t in doc.get("tags", [])}
    lines += ["| route | summary |", "|---|---|"]
    for tag, items in by_tag.items():
        for path, method, op in items:
            link = anchor("op", op.get("operationId", method + path))
            lines.append(f"| [`{method.upper()} {path}`](#{link}) | {cell(op.get('summary', ''))} ({tag}) |")
    lines.append("")
    for tag, items in by_tag.items():
        if not items:
            continue
        lines += [f"## {tag.capitalize()}", ""]
        if tag_desc.get(tag):
            lines += [tag_desc[tag], ""]
        for path, method, op in items:
            shared = doc["paths"][path].get("parameters", [])
            operation(lines, path, method, op, shared)
    comps = doc.get("components", {})
    lines += ["## Schemas", ""]
    for name, schema in comps.get("schemas", {}).items():
        schema_section(lines, name, schema)
    if comps.get("responses"):
        lines += ["## Error responses", ""]
        for name, resp in comps["responses"].items():
            lines += [f"### {name}", "", f"<a id=\"{anchor('response', name)}\"></a>", ""]
            if resp.get("description"):
                lines += [resp["description"], ""]
            kinds = ", ".join(f"`{ct}` {type_of(c.get('schema'))}" for ct, c in resp.get("content", {}).items())
            if kinds:
                lines += [f"Body: {kinds}.", ""]
    for name, scheme in comps.get("securitySchemes", {}).items():
        lines += ["## Authentication", "", f"`{name}`: {scheme.get('type', '')} "
                  f"{scheme.get('scheme', '')}. {scheme.get('description', '')}".rstrip(), ""]
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


def main():
    text = render(json.loads(SOURCE.read_text()))
    if sys.argv[1:] == ["--check"]:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET.relative_to(ROOT)} is stale: run python3 scripts/gen-api-docs.py", file=sys.stderr)
            return 1
        return 0
    if sys.argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    TARGET.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
