#!/usr/bin/env python3
"""Validates Brindle's Kubernetes manifests; run by tests/tests/deploy.rs.

- Every object in the given manifest files, and in what `kubectl kustomize`
  renders for the given kustomization directories, validates against the
  Kubernetes JSON schemas of one version (kubernetes-validate, strict: unknown
  fields are errors). Kinds it has no schema for are errors too.
- Every CustomResourceDefinition's schema is a valid OpenAPI v3 schema
  (meta-validated, every keyword one the API server knows), and structural
  (the API server's rules: a type on every node, nothing but validation
  inside allOf/anyOf/oneOf/not, no additionalProperties beside properties,
  metadata restricted to name and generateName), its defaults and enum
  values validate against their own schemas, its patterns compile, and its
  printer columns point at fields the schema has.
- Every brindle.dev object (the examples) validates against its CRD's
  schema, and every object in an --expect-invalid file is rejected by it.
- The TOML files embedded in ConfigMaps parse.

Prints one line per problem and exits 1 if there are any; --dump-json PATH
writes every parsed document (by source) for the caller's own checks.
"""
import argparse
import copy
import json
import re
import subprocess
import sys
import tomllib

try:
    import jsonschema
    import kubernetes_validate
    import yaml
except ImportError as e:  # the caller turns exit code 3 into "run cargo xtask deps"
    print(f"missing Python package: {e.name}: run `cargo xtask deps` "
          "(pip install kubernetes-validate)", file=sys.stderr)
    sys.exit(3)

CRD_GROUP = "brindle.dev"
JUNCTORS = ("allOf", "anyOf", "oneOf", "not")
# The fields of apiextensions.k8s.io/v1 JSONSchemaProps, as JSON.
KNOWN_KEYWORDS = {
    "id", "$schema", "$ref", "description", "type", "format", "title", "default",
    "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength",
    "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "multipleOf",
    "enum", "maxProperties", "minProperties", "required", "items", "allOf",
    "oneOf", "anyOf", "not", "properties", "additionalProperties",
    "patternProperties", "dependencies", "additionalItems", "definitions",
    "externalDocs", "example", "nullable", "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource", "x-kubernetes-int-or-string",
    "x-kubernetes-list-map-keys", "x-kubernetes-list-type",
    "x-kubernetes-map-type", "x-kubernetes-validations",
}


class Problems:
    def __init__(self):
        self.items = []

    def add(self, where, what):
        self.items.append(f"{where}: {what}")


def load_yaml_documents(text):
    return [d for d in yaml.safe_load_all(text) if d is not None]


def name_of(doc):
    return f"{doc.get('kind', '?')}/{doc.get('metadata', {}).get('name', '?')}"


def check_structural(node, path, problems, in_junctor=False):
    """The API server's structural-schema rules, over one schema node."""
    if not isinstance(node, dict):
        problems.add(path, "schema node is not an object")
        return
    for key in node:
        if key not in KNOWN_KEYWORDS:
            problems.add(path, f"unknown schema keyword {key!r}")
    if "$ref" in node:
        problems.add(path, "$ref is not allowed in a CRD schema")
    escape = node.get("x-kubernetes-int-or-string") or node.get(
        "x-kubernetes-preserve-unknown-fields")
    if in_junctor:
        for key in ("description", "type", "default", "additionalProperties", "nullable"):
            if key in node:
                problems.add(path, f"{key!r} inside allOf/anyOf/oneOf/not is not structural")
    elif not node.get("type") and not escape:
        problems.add(path, "no type (not structural)")
    if "properties" in node and "additionalProperties" in node:
        problems.add(path, "properties and additionalProperties together")
    for name, sub in (node.get("properties") or {}).items():
        check_structural(sub, f"{path}.{name}", problems, in_junctor)
    if isinstance(node.get("additionalProperties"), dict):
        check_structural(node["additionalProperties"], f"{path}.*", problems, in_junctor)
    if "items" in node:
        check_structural(node["items"], f"{path}[]", problems, in_junctor)
    outside_fields = set((node.get("properties") or {}).keys())
    for junctor in JUNCTORS:
        subs = node.get(junctor)
        if subs is None:
            continue
        for i, sub in enumerate(subs if isinstance(subs, list) else [subs]):
            for field in (sub.get("properties") or {}):
                if field not in outside_fields:
                    problems.add(path, f"{junctor}[{i}] names field {field!r} not specified outside it")
            check_structural(sub, f"{path}.{junctor}[{i}]", problems, in_junctor=True)
    for field in node.get("required") or []:
        if "properties" in node and field not in node["properties"]:
            problems.add(path, f"required field {field!r} is not a property")
    if "minimum" in node and "maximum" in node and node["minimum"] > node["maximum"]:
        problems.add(path, "minimum above maximum")
    if "pattern" in node:
        try:
            re.compile(node["pattern"])
        except re.error as e:
            problems.add(path, f"pattern does not compile: {e}")
    # CEL rules cannot be compiled here; at least every field they name
    # must be one of the node's properties (a typo is caught before the API
    # server refuses the CRD).
    for rule in node.get("x-kubernetes-validations") or []:
        text = rule.get("rule", "")
        if not text:
            problems.add(path, "x-kubernetes-validations entry without a rule")
        for field in re.findall(r"\bself\.([A-Za-z_][A-Za-z0-9_]*)", text):
            if field not in (node.get("properties") or {}):
                problems.add(path, f"CEL rule names self.{field}, which is not a property")
        if "\n" in text and not rule.get("message"):
            problems.add(path, "a multi-line CEL rule needs a message")
    # What the node says of its own values must pass the node itself.
    plain = json_schema_of(node)
    for value in node.get("enum") or []:
        for err in jsonschema.Draft4Validator(without_enum(plain)).iter_errors(value):
            problems.add(path, f"enum value {value!r} invalid: {err.message}")
    if "default" in node:
        for err in jsonschema.Draft4Validator(plain).iter_errors(node["default"]):
            problems.add(path, f"default {node['default']!r} invalid: {err.message}")


def without_enum(schema):
    schema = copy.deepcopy(schema)
    schema.pop("enum", None)
    return schema


def json_schema_of(node):
    """An OpenAPI v3 schema node as JSON Schema draft 4 (what it derives
    from): drops the Kubernetes extensions, turns nullable into a type list."""
    if isinstance(node, list):
        return [json_schema_of(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("nullable", "example", "externalDocs"):
            continue
        if key in ("properties", "definitions", "patternProperties"):
            out[key] = {k: json_schema_of(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "not") or key in JUNCTORS:
            out[key] = json_schema_of(value)
        else:
            out[key] = value
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def check_metadata_restrictions(schema, path, problems):
    meta = (schema.get("properties") or {}).get("metadata")
    if meta is None:
        return
    for key in meta:
        if key not in ("type", "properties", "description"):
            problems.add(f"{path}.metadata", f"{key!r}: only name and generateName may be restricted")
    for field in (meta.get("properties") or {}):
        if field not in ("name", "generateName"):
            problems.add(f"{path}.metadata", f"restriction on metadata.{field}")


def field_exists(schema, json_path):
    node = schema
    for part in json_path.lstrip(".").split("."):
        props = node.get("properties") or {}
        if part not in props:
            return False
        node = props[part]
    return True


def check_crd(crd, where, problems):
    spec = crd["spec"]
    expected = f"{spec['names']['plural']}.{spec['group']}"
    if crd["metadata"]["name"] != expected:
        problems.add(where, f"name must be {expected}")
    if spec["group"] != CRD_GROUP:
        problems.add(where, f"group {spec['group']} is not {CRD_GROUP}")
    storage = [v["name"] for v in spec["versions"] if v.get("storage")]
    if len(storage) != 1:
        problems.add(where, f"exactly one storage version, not {storage}")
    schemas = {}
    for version in spec["versions"]:
        path = f"{where} {version['name']}"
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        if schema is None:
            problems.add(path, "no openAPIV3Schema")
            continue
        if schema.get("type") != "object":
            problems.add(path, "the root must be of type object")
        try:
            jsonschema.Draft4Validator.check_schema(json_schema_of(schema))
        except jsonschema.SchemaError as e:
            problems.add(path, f"not a valid OpenAPI v3 schema: {e.message}")
        check_structural(schema, path, problems)
        check_metadata_restrictions(schema, path, problems)
        for column in version.get("additionalPrinterColumns") or []:
            if not field_exists(schema, column["jsonPath"]):
                problems.add(path, f"printer column {column['name']} points at a missing field {column['jsonPath']}")
        schemas[version["name"]] = schema
    return schemas


def validate_custom(doc, crd_schemas, where, problems):
    """Problems of one brindle.dev object against its CRD (empty: valid)."""
    group, _, version = doc.get("apiVersion", "").partition("/")
    key = (group, doc.get("kind"))
    if key not in crd_schemas or version not in crd_schemas[key]:
        return [f"no CRD for {doc.get('apiVersion')} {doc.get('kind')}"]
    schema = json_schema_of(crd_schemas[key][version])
    return [f"{'.'.join(str(p) for p in e.path)}: {e.message}"
            for e in jsonschema.Draft4Validator(schema).iter_errors(doc)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kubernetes-version", required=True)
    parser.add_argument("--kustomize", action="append", default=[], metavar="DIR",
                        help="render with `kubectl kustomize DIR` and validate the output")
    parser.add_argument("--expect-invalid", action="append", default=[], metavar="FILE",
                        help="brindle.dev objects the CRD schemas must reject")
    parser.add_argument("--dump-json", metavar="PATH")
    parser.add_argument("files", nargs="*")
    args = parser.parse_args()

    problems = Problems()
    sources = {}
    for path in args.files:
        with open(path) as f:
            sources[path] = load_yaml_documents(f.read())
    for directory in args.kustomize:
        run = subprocess.run(["kubectl", "kustomize", directory],
                             capture_output=True, text=True)
        if run.returncode != 0:
            problems.add(f"kustomize {directory}", run.stderr.strip())
            continue
        sources[f"kustomize {directory}"] = load_yaml_documents(run.stdout)

    crd_schemas = {}
    for where, docs in sources.items():
        for doc in docs:
            if doc.get("kind") == "CustomResourceDefinition":
                schemas = check_crd(doc, f"{where} {name_of(doc)}", problems)
                crd_schemas[(doc["spec"]["group"], doc["spec"]["names"]["kind"])] = schemas

    checked = 0
    for where, docs in sources.items():
        for doc in docs:
            here = f"{where} {name_of(doc)}"
            if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
                problems.add(where, "a document without apiVersion and kind")
                continue
            checked += 1
            if doc["apiVersion"].startswith(CRD_GROUP + "/"):
                for p in validate_custom(doc, crd_schemas, here, problems):
                    problems.add(here, p)
                continue
            try:
                kubernetes_validate.validate(doc, args.kubernetes_version, strict=True)
            except kubernetes_validate.ValidationError as e:
                problems.add(here, f"{'.'.join(str(p) for p in e.path)}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                problems.add(here, e.message)
            if doc["kind"] == "ConfigMap":
                for key, value in (doc.get("data") or {}).items():
                    if key.endswith(".toml"):
                        try:
                            tomllib.loads(value)
                        except tomllib.TOMLDecodeError as e:
                            problems.add(f"{here} {key}", f"not TOML: {e}")
                    if key.endswith(".conflist") or key.endswith(".json"):
                        try:
                            json.loads(value)
                        except json.JSONDecodeError as e:
                            problems.add(f"{here} {key}", f"not JSON: {e}")

    rejected = 0
    for path in args.expect_invalid:
        with open(path) as f:
            for doc in load_yaml_documents(f.read()):
                errors = validate_custom(doc, crd_schemas, path, problems)
                if errors:
                    rejected += 1
                    print(f"rejected as expected: {doc.get('metadata', {}).get('name')}: {errors[0]}")
                else:
                    problems.add(path, f"{name_of(doc)} was accepted but is invalid")

    if args.dump_json:
        with open(args.dump_json, "w") as f:
            json.dump(sources, f)
    for p in problems.items:
        print(f"INVALID {p}")
    print(f"{checked} objects and {len(crd_schemas)} CRDs checked against Kubernetes "
          f"{args.kubernetes_version} (kubernetes-validate {kubernetes_validate.__version__}); "
          f"{rejected} invalid objects rejected; {len(problems.items)} problems")
    return 1 if problems.items else 0


if __name__ == "__main__":
    sys.exit(main())
