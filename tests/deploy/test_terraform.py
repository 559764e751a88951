"""Checks of the Terraform module in terraform/, without terraform: no binary and no AWS account
exist where this runs (docs/terraform.md).

- Every .tf file parses with python-hcl2; the references in it resolve: each `var.X` to a
  declared variable (and every variable is used), each `local.X`, `data.T.N`, `module.N` and
  `aws_T.N` to a declared local, data source, module or resource.
- Variables have descriptions and types; their validation conditions are evaluated here (a
  small translator below) against every default, every value in terraform.tfvars.example, and
  a known-bad value for each validated variable.
- templatefile(): each call passes exactly the names its template uses. The templates are
  rendered (a small renderer of the template syntax they use) and the results checked: the
  broker settings parse as riverbed's own BrokerConfig and S3 settings, the cloud-init
  documents are YAML that write those settings.
- Security groups: no ingress from 0.0.0.0/0 or ::/0; ZooKeeper only from security groups.
- checkov (its own virtualenv, .venv-checkov, from the Makefile) finds no failing check, and
  every skip is an inline `#checkov:skip=ID:reason` comment with a reason. It runs offline:
  --skip-download, BC_SKIP_MAPPING and CKV_SKIP_PACKAGE_UPDATE_CHECK, and in a network
  namespace of its own (no network at all) where `unshare -n` is allowed.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hcl2
import pytest
import yaml
from riverbed.configs import BrokerConfig, parse_properties
from riverbed.tiering.stores import s3_settings

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "terraform"
TEMPLATES = MODULE / "templates"
CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"
CHECKOV_TIMEOUT_S = 240

_OPTIONS = hcl2.SerializationOptions(
    with_comments=False, explicit_blocks=False, strip_string_quotes=True
)


# --- parsing -------------------------------------------------------------------------------


def _tf_files() -> list[Path]:
    return sorted(MODULE.glob("*.tf"))


def _load(path: Path) -> dict[str, Any]:
    with path.open() as file:
        return hcl2.load(file, serialization_options=_OPTIONS)


@pytest.fixture(scope="module")
def module() -> dict[str, dict[str, Any]]:
    """Every .tf file, parsed, by file name."""
    return {path.name: _load(path) for path in _tf_files()}


def _blocks(module: dict[str, dict[str, Any]], kind: str) -> Iterator[tuple[str, Any]]:
    for parsed in module.values():
        for block in parsed.get(kind, []):
            yield from block.items()


def _declared(module: dict[str, dict[str, Any]]) -> dict[str, set[str]]:
    resources = {
        f"{rtype}.{name}" for rtype, named in _blocks(module, "resource") for name in named
    }
    data = {f"data.{dtype}.{name}" for dtype, named in _blocks(module, "data") for name in named}
    local_names = {name for parsed in module.values() for block in parsed.get("locals", [])
                   for name in block}  # fmt: skip
    return {
        "resource": resources,
        "data": data,
        "local": local_names,
        "variable": {name for name, _ in _blocks(module, "variable")},
        "output": {name for name, _ in _blocks(module, "output")},
        "module": {name for name, _ in _blocks(module, "module")},
    }


def _variables(module: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return dict(_blocks(module, "variable"))


def _of_type(module: dict[str, dict[str, Any]], kind: str, rtype: str) -> dict[str, Any]:
    """name -> body of every resource (or data source) of type `rtype`, across files."""
    return {name: body for t, named in _blocks(module, kind) if t == rtype
            for name, body in named.items()}  # fmt: skip


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _skip_string(text: str, start: int) -> int:
    """Index after the HCL string literal opening at `start` (its interpolations included)."""
    i = start + 1
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
        elif char == '"':
            return i + 1
        elif text.startswith("${", i):
            i = _skip_braces(text, i + 1)
        else:
            i += 1
    raise ValueError(f"unterminated string: {text[start:]!r}")


def _skip_braces(text: str, start: int) -> int:
    """Index after the bracket (`{`, `(` or `[`) opening at `start` and its match."""
    closing = {"{": "}", "(": ")", "[": "]"}
    stack = [closing[text[start]]]
    i = start + 1
    while stack:
        if i >= len(text):
            raise ValueError(f"unbalanced brackets: {text[start:]!r}")
        char = text[i]
        if char == '"':
            i = _skip_string(text, i)
            continue
        if char in closing:
            stack.append(closing[char])
        elif char == stack[-1]:
            stack.pop()
        i += 1
    return i


def _expressions(value: str) -> Iterator[str]:
    """The expression text of each interpolation `${...}` in a parsed string."""
    i = 0
    while (start := value.find("${", i)) != -1:
        if start > 0 and value[start - 1] == "$":  # $${ is an escaped literal
            i = start + 2
            continue
        end = _skip_braces(value, start + 1)
        yield value[start + 2 : end - 1]
        i = end


def _all_expressions(module: dict[str, dict[str, Any]]) -> Iterator[tuple[str, str]]:
    for name, parsed in module.items():
        for value in _strings(parsed):
            for expression in _expressions(value):
                yield name, expression


_REFERENCE_PATTERNS: dict[str, re.Pattern[str]] = {
    "variable": re.compile(r"(?<![\w.])var\.([A-Za-z_]\w*)"),
    "local": re.compile(r"(?<![\w.])local\.([A-Za-z_]\w*)"),
    "data": re.compile(r"(?<![\w.])(data\.[A-Za-z_]\w*\.[A-Za-z_]\w*)"),
    "module": re.compile(r"(?<![\w.])module\.([A-Za-z_]\w*)"),
    "resource": re.compile(r"(?<![\w.])(aws_\w+\.[A-Za-z_]\w*)"),
}


def _references(module: dict[str, dict[str, Any]]) -> dict[str, set[tuple[str, str]]]:
    """kind -> {(file, referenced name)}."""
    found: dict[str, set[tuple[str, str]]] = {kind: set() for kind in _REFERENCE_PATTERNS}
    for file, expression in _all_expressions(module):
        for kind, pattern in _REFERENCE_PATTERNS.items():
            found[kind].update((file, match) for match in pattern.findall(expression))
    return found


# --- the module's shape --------------------------------------------------------------------


def test_module_files_split_by_concern(module: dict[str, dict[str, Any]]) -> None:
    for name in ("versions.tf", "variables.tf", "outputs.tf", "network.tf", "storage.tf",
                 "iam.tf", "zookeeper.tf", "brokers.tf", "security_groups.tf"):  # fmt: skip
        assert name in module, f"terraform/{name} is missing"
    assert (MODULE / "terraform.tfvars.example").is_file()


def test_versions_pinned(module: dict[str, dict[str, Any]]) -> None:
    (settings,) = module["versions.tf"]["terraform"]
    assert re.fullmatch(r">= ?1\.\d+\.\d+, ?< ?2\.0\.0", settings["required_version"])
    (providers,) = settings["required_providers"]
    aws = providers["aws"]
    assert aws["source"] == "hashicorp/aws"
    assert ">=" in aws["version"]
    assert "<" in aws["version"].replace("<=", "")


def test_variables_have_description_and_type(module: dict[str, dict[str, Any]]) -> None:
    variables = _variables(module)
    assert variables
    for name, body in variables.items():
        assert str(body.get("description", "")).strip(), f"variable {name} has no description"
        assert body.get("type"), f"variable {name} has no type"


def test_every_variable_reference_is_declared_and_every_variable_used(
    module: dict[str, dict[str, Any]],
) -> None:
    declared = _declared(module)["variable"]
    used = _references(module)["variable"]
    undeclared = sorted(f"{file}: var.{name}" for file, name in used if name not in declared)
    assert not undeclared, f"undeclared variables: {undeclared}"
    unused = declared - {name for _, name in used}
    assert not unused, f"declared but never used: {sorted(unused)}"


def test_every_reference_resolves(module: dict[str, dict[str, Any]]) -> None:
    declared = _declared(module)
    found = _references(module)
    assert found["resource"]
    assert found["data"]
    assert found["local"]
    problems = [
        f"{file}: {kind} {name}"
        for kind in ("resource", "data", "local", "module")
        for file, name in sorted(found[kind])
        if name not in declared[kind]
    ]
    assert not problems, f"references to nothing declared: {problems}"


def test_outputs(module: dict[str, dict[str, Any]]) -> None:
    outputs = dict(_blocks(module, "output"))
    for name in ("bootstrap_servers", "cold_tier_bucket", "zookeeper_connect"):
        assert name in outputs, f"output {name} is missing"
    for name, body in outputs.items():
        assert str(body.get("description", "")).strip(), f"output {name} has no description"
        assert body.get("value"), f"output {name} has no value"


def test_tfvars_example_sets_only_declared_variables(module: dict[str, dict[str, Any]]) -> None:
    example = _load(MODULE / "terraform.tfvars.example")
    variables = _variables(module)
    assert set(example) <= set(variables), sorted(set(example) - set(variables))
    required = {name for name, body in variables.items() if "default" not in body}
    assert required <= set(example), f"the example leaves out required {required - set(example)}"


# --- variable validation, evaluated --------------------------------------------------------

# Terraform functions the conditions use, with Terraform's behaviour where it matters: regex
# fails when nothing matches, cidrhost fails on a malformed prefix.


def _regex(pattern: str, value: str) -> str:
    match = re.search(pattern, value)
    if match is None:
        raise ValueError(f"{pattern!r} does not match {value!r}")
    return match.group(0)


def _cidrhost(prefix: str, host: int) -> str:
    network = ipaddress.ip_network(prefix, strict=False)
    return str(network[host])


def _can(thunk: Callable[[], Any]) -> bool:
    try:
        thunk()
    except Exception:
        return False
    return True


_FUNCTIONS: dict[str, Any] = {
    "_can": _can,
    "regex": _regex,
    "cidrhost": _cidrhost,
    "length": len,
    "trimspace": lambda s: s.strip(),
    "alltrue": all,
    "floor": math.floor,
    "startswith": lambda s, prefix: s.startswith(prefix),
    "endswith": lambda s, suffix: s.endswith(suffix),
    "contains": lambda items, item: item in items,
}
_TOKEN = re.compile(
    r'\s*(?:(?P<string>"(?:\\.|[^"\\])*")|(?P<number>\d+(?:\.\d+)?)'
    r"|(?P<name>[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*)|(?P<op>&&|\|\||==|!=|>=|<=|[-+*/%<>!()\[\],:?]))"
)


def _tokens(expression: str) -> list[str]:
    tokens, i = [], 0
    expression = expression.strip()
    while i < len(expression):
        match = _TOKEN.match(expression, i)
        if match is None:
            raise ValueError(f"cannot tokenize {expression[i:]!r}")
        tokens.append(match.group(match.lastgroup or ""))
        i = match.end()
    return tokens


def _python(tokens: list[str], variable: str) -> str:
    """A Python expression for a Terraform condition (the subset variables.tf uses)."""
    out: list[str] = []
    can_parens: list[bool] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "[" and i + 1 < len(tokens) and tokens[i + 1] == "for":
            end = _matching(tokens, i)
            inside = tokens[i + 2 : end]
            names = inside[: inside.index("in")]
            colon = _depth0(inside, ":")
            source = inside[inside.index("in") + 1 : colon]
            body = inside[colon + 1 :]
            loop = "".join(names)
            out.append(f"[({_python(body, variable)}) for {loop} in ({_python(source, variable)})]")
            i = end + 1
            continue
        if token == "?":
            raise ValueError("conditional expressions are not supported by this evaluator")
        if token.startswith("var."):
            assert token == f"var.{variable}", f"{variable}'s validation reads {token}"
            out.append("value")
        elif token == "can" and tokens[i + 1] == "(":
            out.append("_can((lambda: ")
            can_parens.append(True)
            i += 2
            continue
        elif token == "(":
            out.append("(")
            can_parens.append(False)
        elif token == ")":
            out.append("))" if can_parens.pop() else ")")
        elif token in ("&&", "||"):
            out.append(" and " if token == "&&" else " or ")
        elif token == "!":
            out.append(" not ")
        elif token in ("null", "true", "false"):
            out.append({"null": "None", "true": "True", "false": "False"}[token])
        elif token[0].isalpha() and token not in _FUNCTIONS:
            out.append(token)  # a for-expression's loop variable
        else:
            out.append(f" {token} " if token in ("==", "!=", ">=", "<=", "<", ">") else token)
        i += 1
    return "".join(out)


def _matching(tokens: list[str], start: int) -> int:
    depth = 0
    for i in range(start, len(tokens)):
        depth += tokens[i] in ("(", "[")
        depth -= tokens[i] in (")", "]")
        if depth == 0:
            return i
    raise ValueError("unbalanced brackets")


def _depth0(tokens: list[str], wanted: str) -> int:
    depth = 0
    for i, token in enumerate(tokens):
        depth += token in ("(", "[")
        depth -= token in (")", "]")
        if depth == 0 and token == wanted:
            return i
    raise ValueError(f"no {wanted!r} at depth 0")


def _valid(variable: str, body: dict[str, Any], value: Any) -> bool:
    """Whether every validation block of `variable` accepts `value`."""
    results = []
    for validation in body.get("validation", []):
        assert str(validation.get("error_message", "")).strip(), f"{variable}: no error_message"
        (expression,) = list(_expressions(validation["condition"]))
        code = _python(_tokens(expression), variable)
        # One namespace (globals): a list comprehension's scope sees globals, not eval's locals.
        results.append(bool(eval(code, {"__builtins__": {}, **_FUNCTIONS, "value": value})))
    return all(results)


# A value each validation must refuse. Adding a validation means adding a bad value here.
BAD_VALUES: dict[str, list[Any]] = {
    "region": ["Europe", "eu-west"],
    "name": ["Riverbed_Prod", "r", "a-name-that-is-far-too-long"],
    "vpc_cidr": ["0.0.0.0/0", "10.0.0.0/8", "10.42.0.0/24", "not-a-cidr", "10.42.0.0/33"],
    "subnet_newbits": [2, 7, 4.5],
    "az_count": [2, 7, 3.5],
    "availability_zones": [["eu-west-1a", "eu-west-1b"], ["eu-west-1a", "eu-west-1b", "x"]],
    "allowed_cidrs": [["0.0.0.0/0"], ["::/0"], ["10.0.0.0/33"], ["10.1.0.0/16", "garbage"]],
    "broker_count": [2, 0, 3.5, 49],
    "broker_instance_type": ["", "   ", "m6i large"],
    "zookeeper_instance_type": ["", "t3"],
    "ami_id": ["debian-12", "ami-XYZ"],
    "root_volume_size_gb": [4, 2048],
    "hot_tier_volume_size_gb": [5, 20000, 10.5],
    "hot_tier_volume_iops": [2000, 17000],
    "hot_tier_volume_throughput": [100, 1001],
    "riverbed_package": [
        "",
        "riverbed; rm -rf /",
        "riverbed $(id)",
        "s3://artifacts/riverbed.tar.gz",
        "s3://artifacts",
    ],
    "cold_tier_bucket_name": ["Bad_Bucket", "ab"],
    "cold_tier_prefix": ["", "/riverbed", "riverbed/", "a/../b", "a//b"],
    "zookeeper_chroot": ["", "riverbed", "/", "/riverbed/", "/a//b"],
    "zookeeper_digest_password": ["short", "sixteen but spaces!", ""],
    "abort_incomplete_multipart_days": [0, 31],
    "noncurrent_version_retention_days": [0, 366],
    "access_log_bucket": ["UPPER", "x"],
    "log_retention_days": [42, 0],
    "kms_deletion_window_days": [6, 31],
    "num_partitions": [0, 1.5],
}


def test_validation_blocks_exist(module: dict[str, dict[str, Any]]) -> None:
    variables = _variables(module)
    validated = {name for name, body in variables.items() if body.get("validation")}
    for name in ("broker_count", "vpc_cidr", "allowed_cidrs", "broker_instance_type",
                 "zookeeper_instance_type", "az_count", "riverbed_package", "cold_tier_prefix",
                 "hot_tier_volume_iops", "hot_tier_volume_throughput",
                 "hot_tier_volume_size_gb"):  # fmt: skip
        assert name in validated, f"variable {name} has no validation block"
    # Every validation is exercised with a bad value below, and only validations are.
    assert validated == set(BAD_VALUES), sorted(validated ^ set(BAD_VALUES))


def test_defaults_and_example_pass_their_validation(module: dict[str, dict[str, Any]]) -> None:
    variables = _variables(module)
    example = _load(MODULE / "terraform.tfvars.example")
    checked = 0
    for name, body in variables.items():
        if not body.get("validation"):
            continue
        if "default" in body:
            assert _valid(name, body, body["default"]), f"{name}'s default fails its validation"
            checked += 1
        if name in example:
            assert _valid(name, body, example[name]), f"{name} in the example fails validation"
            checked += 1
    assert checked >= len(BAD_VALUES)


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_validation_refuses_bad_values(module: dict[str, dict[str, Any]], name: str) -> None:
    body = _variables(module)[name]
    for value in BAD_VALUES[name]:
        assert not _valid(name, body, value), f"{name} accepts {value!r}"


# --- templates -----------------------------------------------------------------------------

_TEMPLATE_CALL = re.compile(r'templatefile\(\s*"\$\{path\.module\}/([^"]+)"\s*,\s*')


def _template_calls(module: dict[str, dict[str, Any]]) -> list[tuple[str, set[str]]]:
    """(template path, names passed in its variables map) for each templatefile() call."""
    calls = []
    for _, expression in _all_expressions(module):
        for match in _TEMPLATE_CALL.finditer(expression):
            start = match.end()
            assert expression[start] == "{", f"templatefile({match.group(1)}) without a map"
            body = expression[start + 1 : _skip_braces(expression, start) - 1]
            calls.append((match.group(1), _map_keys(body)))
    return calls


def _map_keys(body: str) -> set[str]:
    """Top-level keys of an HCL object's body: `a = 1, b = f(x, {c = 2})` -> {a, b}."""
    keys, i, item_start = set(), 0, 0
    items = []
    while i <= len(body):
        if i == len(body) or body[i] in ",\n":
            items.append(body[item_start:i])
            item_start = i + 1
            i += 1
        elif body[i] in "{([":
            i = _skip_braces(body, i)
        elif body[i] == '"':
            i = _skip_string(body, i)
        else:
            i += 1
    for item in items:
        if item.strip():
            key = re.match(r"\s*([A-Za-z_]\w*)\s*=(?!=)", item)
            assert key, f"not a key = value item: {item!r}"
            keys.add(key.group(1))
    return keys


_TEMPLATE_TAG = re.compile(r"(?<![$%])([$%])\{(~?)(.*?)(~?)\}", re.S)
_KEYWORDS = frozenset({"if", "else", "endif", "for", "in", "endfor", "true", "false", "null"})


def _template_names(text: str) -> set[str]:
    """Names a template reads (function names, keywords and loop variables left out)."""
    names: set[str] = set()
    loop_variables: set[str] = set()
    for _, _, body, _ in _TEMPLATE_TAG.findall(text):
        body = re.sub(r'"(?:\\.|[^"\\])*"', '""', body)
        loop = re.match(r"\s*for\s+(\w+)(?:\s*,\s*(\w+))?\s+in\s", body)
        if loop:
            loop_variables.update(name for name in loop.groups() if name)
        for match in re.finditer(r"(?<![\w.])([A-Za-z_]\w*)(?!\w)(\s*\()?", body):
            if not match.group(2) and match.group(1) not in _KEYWORDS:
                names.add(match.group(1))
    return names - loop_variables


def test_templatefile_calls_pass_exactly_what_templates_use(
    module: dict[str, dict[str, Any]],
) -> None:
    calls = _template_calls(module)
    called = {path for path, _ in calls}
    on_disk = {f"templates/{path.name}" for path in TEMPLATES.iterdir()}
    assert called == on_disk, f"templates never rendered or missing: {sorted(called ^ on_disk)}"
    for path, passed in calls:
        used = _template_names((MODULE / path).read_text())
        assert used <= passed, f"{path} uses {sorted(used - passed)}, not passed by templatefile"
        assert passed <= used, f"{path} is passed {sorted(passed - used)}, which it never uses"


def _render(text: str, variables: dict[str, Any]) -> str:
    """Terraform's template syntax as the templates use it: ${expr}, %{ if }, %{ for }, `~`."""
    functions = {
        "indent": lambda n, s: s.replace("\n", "\n" + " " * n),
        "replace": lambda s, old, new: s.replace(old, new),
        "chomp": lambda s: s.rstrip("\r\n"),
    }

    def evaluate(expression: str) -> Any:
        return eval(expression, {"__builtins__": {}}, {**functions, **scope})

    def show(value: Any) -> str:
        return ("true" if value else "false") if isinstance(value, bool) else str(value)

    # Split into text and tags, apply the strip markers, then walk with a stack for if/for.
    pieces: list[Any] = []
    last = 0
    for match in _TEMPLATE_TAG.finditer(text):
        pieces.append(text[last : match.start()])
        pieces.append(match)
        last = match.end()
    pieces.append(text[last:])
    for index, piece in enumerate(pieces):
        if isinstance(piece, re.Match):
            if piece.group(2):
                pieces[index - 1] = pieces[index - 1].rstrip()
            if piece.group(4):
                pieces[index + 1] = pieces[index + 1].lstrip()
    scope = dict(variables)

    def run(start: int, end: int) -> str:
        out: list[str] = []
        i = start
        while i < end:
            piece = pieces[i]
            if isinstance(piece, str):
                out.append(piece.replace("$${", "${").replace("%%{", "%{"))
                i += 1
                continue
            sigil, body = piece.group(1), piece.group(3).strip()
            if sigil == "$":
                out.append(show(evaluate(body)))
                i += 1
                continue
            otherwise, close = _close(i, end)
            if body.startswith("if "):
                if evaluate(body[3:]):
                    out.append(run(i + 1, otherwise or close))
                elif otherwise:
                    out.append(run(otherwise + 1, close))
            elif body.startswith("for "):
                loop = re.fullmatch(r"for\s+(\w+)\s*,\s*(\w+)\s+in\s+(.+)", body)
                assert loop, f"unsupported directive {body!r}"
                for key, value in enumerate(evaluate(loop.group(3))):
                    scope[loop.group(1)], scope[loop.group(2)] = key, value
                    out.append(run(i + 1, close))
            else:
                raise AssertionError(f"unsupported directive {body!r}")
            i = close + 1
        return "".join(out)

    def _close(opening: int, end: int) -> tuple[int | None, int]:
        """Indexes of the directive's own %{ else } (or None) and of its %{ end... }."""
        depth, otherwise = 0, None
        for i in range(opening, end):
            piece = pieces[i]
            if isinstance(piece, re.Match) and piece.group(1) == "%":
                word = piece.group(3).split()[0]
                if word in ("if", "for"):
                    depth += 1
                elif word in ("endif", "endfor"):
                    depth -= 1
                    if depth == 0:
                        return otherwise, i
                elif word == "else" and depth == 1:
                    otherwise = i
        raise AssertionError("unclosed directive")

    return run(0, len(pieces))


ZOOKEEPER_IPS = ["10.42.0.10", "10.42.16.10", "10.42.32.10"]
BROKER_VALUES: dict[str, Any] = {
    "broker_id": 2,
    "rack": "eu-west-1b",
    "broker_port": 9092,
    "advertised_host": "10.42.16.20",
    "log_dir": "/var/lib/riverbed/data",
    "zookeeper_connect": ",".join(f"{ip}:2181" for ip in ZOOKEEPER_IPS) + "/riverbed",
    "num_partitions": 6,
    "zookeeper_digest_password": "a-generated-password-of-32-chars",
    "auto_create_topics": False,
    "cold_tier_url": "s3://riverbed-cold-tier-20250101/riverbed",
    "region": "eu-west-1",
    "metrics_port": 9308,
}


def _passed_to(module: dict[str, dict[str, Any]], template: str) -> set[str]:
    (passed,) = [names for path, names in _template_calls(module) if path == template]
    return passed


def _broker_properties(module: dict[str, dict[str, Any]]) -> str:
    assert set(BROKER_VALUES) == _passed_to(module, "templates/broker.properties.tftpl")
    return _render((TEMPLATES / "broker.properties.tftpl").read_text(), BROKER_VALUES)


def test_broker_settings_are_riverbed_broker_settings(module: dict[str, dict[str, Any]]) -> None:
    text = _broker_properties(module)
    assert "${" not in text
    assert "%{" not in text
    settings = parse_properties(text)
    # from_mapping refuses an unknown key or a bad value, naming it.
    config = BrokerConfig.from_mapping(settings)
    assert config.broker_id == 2
    assert config.broker_rack == "eu-west-1b"
    assert config.default_replication_factor == 3
    assert config.min_insync_replicas == 2
    assert config.offsets_topic_replication_factor == 3
    assert config.unclean_leader_election_enable is False
    assert config.zookeeper_connect.count(",") == 2
    assert config.zookeeper_connect.endswith("/riverbed")  # the chroot
    digest = config.zookeeper_digest
    assert digest is not None
    assert digest.set_acl
    assert digest.username == "riverbed"
    assert config.advertised_host_port == ("10.42.16.20", 9092)
    assert config.port == 9092
    assert config.log_dirs == ("/var/lib/riverbed/data",)
    assert (config.metrics_host, config.metrics_port) == ("0.0.0.0", 9308)
    assert config.remote_storage_url == BROKER_VALUES["cold_tier_url"]
    # No credentials in the file: with an empty environment too, the S3 client is left to
    # botocore's chain (the instance profile).
    s3 = s3_settings(config.remote_storage_s3, environ={})
    assert s3.region == "eu-west-1"
    assert s3.access_key_id is None
    assert s3.secret_access_key is None
    assert s3.session_token is None
    assert s3.endpoint_url is None
    assert s3.addressing_style == "virtual"


def _write_files(document: str) -> dict[str, str]:
    assert document.startswith("#cloud-config\n")
    parsed = yaml.safe_load(document)
    assert isinstance(parsed, dict)
    return {entry["path"]: entry["content"] for entry in parsed["write_files"]}


@pytest.mark.processes
@pytest.mark.parametrize("package", ["riverbed==0.1.0", "s3://artifacts/riverbed-0.1.0.whl"])
def test_broker_cloud_init(module: dict[str, dict[str, Any]], package: str) -> None:
    properties = _broker_properties(module)
    values = {
        "broker_id": 2,
        "properties": properties,
        "volume_id": "vol-0123456789abcdef0",
        "data_mount": "/var/lib/riverbed",
        "log_dir": "/var/lib/riverbed/data",
        "riverbed_package": package,
        "package_from_s3": package.startswith("s3://"),
        "region": "eu-west-1",
    }
    assert set(values) == _passed_to(module, "templates/broker-cloud-init.yaml.tftpl")
    document = _render((TEMPLATES / "broker-cloud-init.yaml.tftpl").read_text(), values)
    files = _write_files(document)
    assert parse_properties(files["/etc/riverbed/broker.properties"]) == parse_properties(
        properties
    )
    mount = files["/usr/local/sbin/riverbed-mount-hot-tier"]
    assert "nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0" in mount
    assert subprocess.run(["bash", "-n"], input=mount, text=True).returncode == 0
    install = files["/usr/local/sbin/riverbed-install"]
    assert subprocess.run(["bash", "-n"], input=install, text=True).returncode == 0
    assert "python3.11-venv" in install
    assert ("aws s3 cp" in install) == package.startswith("s3://")
    unit = files["/etc/systemd/system/riverbed-broker.service"]
    assert (
        "ExecStart=/opt/riverbed/venv/bin/riverbed broker --config /etc/riverbed/broker.properties"
        in unit
    )
    assert "RequiresMountsFor=/var/lib/riverbed" in unit


def test_zookeeper_cloud_init(module: dict[str, dict[str, Any]]) -> None:
    cfg_values = {"client_port": 2181, "peer_port": 2888, "election_port": 3888,
                  "servers": ZOOKEEPER_IPS}  # fmt: skip
    assert set(cfg_values) == _passed_to(module, "templates/zoo.cfg.tftpl")
    zoo_cfg = _render((TEMPLATES / "zoo.cfg.tftpl").read_text(), cfg_values)
    settings = parse_properties(zoo_cfg)
    assert settings["clientPort"] == "2181"
    assert [settings[f"server.{n}"] for n in (1, 2, 3)] == [
        f"{ip}:2888:3888" for ip in ZOOKEEPER_IPS
    ]
    assert "server.4" not in settings
    values = {"zookeeper_id": 3, "zoo_cfg": zoo_cfg}
    assert set(values) == _passed_to(module, "templates/zookeeper-cloud-init.yaml.tftpl")
    document = _render((TEMPLATES / "zookeeper-cloud-init.yaml.tftpl").read_text(), values)
    files = _write_files(document)
    assert parse_properties(files["/etc/riverbed/zookeeper/zoo.cfg"]) == settings
    assert "echo 3 > /var/lib/zookeeper/myid" in document


# --- security ------------------------------------------------------------------------------

_OPEN = ("0.0.0.0/0", "::/0")


def _ingress_rules(module: dict[str, dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for rtype, named in _blocks(module, "resource"):
        for name, body in named.items():
            if rtype == "aws_vpc_security_group_ingress_rule" or (
                rtype == "aws_security_group_rule" and body.get("type") == "ingress"
            ):
                yield f"{rtype}.{name}", body
            elif rtype == "aws_security_group":
                for index, rule in enumerate(body.get("ingress", [])):
                    yield f"{rtype}.{name}.ingress[{index}]", rule


def test_no_ingress_from_anywhere(module: dict[str, dict[str, Any]]) -> None:
    variables = _variables(module)
    rules = list(_ingress_rules(module))
    assert rules
    for address, rule in rules:
        cidrs = [rule.get(key) for key in ("cidr_ipv4", "cidr_ipv6", "cidr_blocks",
                                            "ipv6_cidr_blocks") if rule.get(key)]  # fmt: skip
        for text in _strings(cidrs):
            assert not any(open_cidr in text for open_cidr in _OPEN), f"{address}: {text}"
            # A CIDR from variables (directly or through for_each) must be one their
            # validation keeps from being /0.
            sources = text + "".join(_strings(rule.get("for_each", "")))
            for name in _REFERENCE_PATTERNS["variable"].findall(sources):
                body = variables[name]
                is_list = "list" in body["type"] or "set" in body["type"]
                for open_cidr in _OPEN:
                    value = [open_cidr] if is_list else open_cidr
                    assert not _valid(name, body, value), f"{address}: var.{name} allows /0"


def test_zookeeper_reachable_only_from_security_groups(
    module: dict[str, dict[str, Any]],
) -> None:
    rules = [(address, rule) for address, rule in _ingress_rules(module)
             if "aws_security_group.zookeeper" in str(rule.get("security_group_id"))]  # fmt: skip
    assert {rule["from_port"] for _, rule in rules} == {
        "${local.zookeeper_client_port}",
        "${local.zookeeper_peer_port}",
        "${local.zookeeper_leader_port}",
    }
    for address, rule in rules:
        assert rule.get("referenced_security_group_id"), f"{address} is not from a group"
        assert not any(key.startswith("cidr") for key in rule), f"{address} has a CIDR"


def test_broker_role_is_scoped_to_the_prefix(module: dict[str, dict[str, Any]]) -> None:
    documents = _of_type(module, "data", "aws_iam_policy_document")
    statements = documents["broker"]["statement"]
    for statement in statements:
        actions = set(statement["actions"])
        if actions & {"s3:GetObject", "s3:PutObject", "s3:DeleteObject"}:
            assert statement["resources"] == ["${local.cold_tier_prefix_arn}"], statement
        if "s3:ListBucket" in actions:
            (condition,) = statement["condition"]
            assert condition["variable"] == "s3:prefix"
            assert condition["values"] == ["${local.cold_tier_prefix}/*"]
        assert all(resource != "*" for resource in statement["resources"]), statement
    locals_ = {k: v for parsed in module.values() for b in parsed.get("locals", [])
               for k, v in b.items()}  # fmt: skip
    assert locals_["cold_tier_prefix_arn"].endswith("/${local.cold_tier_prefix}/*")


def test_instances_hardened(module: dict[str, dict[str, Any]]) -> None:
    instances = _of_type(module, "resource", "aws_instance")
    assert set(instances) == {"broker", "zookeeper"}
    for name, body in instances.items():
        (metadata,) = body["metadata_options"]
        assert metadata["http_tokens"] == "required", name
        assert body["monitoring"] is True, name
        assert body["ebs_optimized"] is True, name
        assert body["associate_public_ip_address"] is False, name
        (root,) = body["root_block_device"]
        assert root["encrypted"] is True, name
        assert root["volume_type"] == "gp3", name
    for name, body in _of_type(module, "resource", "aws_ebs_volume").items():
        assert body["encrypted"] is True, name
        assert body["type"] == "gp3", name


# --- checkov -------------------------------------------------------------------------------

_SKIP_COMMENT = re.compile(r"#\s*checkov:skip=([A-Z0-9_]+)(?::(.*))?")


def _checkov_command() -> list[str]:
    command = [str(CHECKOV), "-d", str(MODULE), "--framework", "terraform", "--quiet",
               "--compact", "-o", "json", "--skip-download"]  # fmt: skip
    # No network at all for checkov where this user may make a network namespace (root here
    # and in CI); elsewhere the flags and variables above keep it offline.
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0:
        return [unshare, "-n", *command]
    return command


@pytest.mark.processes
def test_checkov_passes_with_every_skip_explained() -> None:
    if not CHECKOV.is_file():
        pytest.fail(f"{CHECKOV} is missing: run `make setup-test` (the $(STAMPS)/checkov target)")
    skips: list[tuple[str, str, str]] = []
    for path in _tf_files():
        for match in _SKIP_COMMENT.finditer(path.read_text()):
            skips.append((path.name, match.group(1), (match.group(2) or "").strip()))
    for file, check, reason in skips:
        assert len(reason) >= 20, f"{file}: the skip of {check} gives no reason"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "BC_SKIP_MAPPING": "TRUE",
        "CKV_SKIP_PACKAGE_UPDATE_CHECK": "TRUE",
        "ANSI_COLORS_DISABLED": "1",
        "LOG_LEVEL": "WARNING",
    }
    started = time.monotonic()
    result = subprocess.run(
        _checkov_command(), capture_output=True, text=True, env=env, timeout=CHECKOV_TIMEOUT_S
    )
    elapsed = time.monotonic() - started
    assert result.returncode in (0, 1), f"checkov crashed ({result.returncode}): {result.stderr}"
    report = json.loads(result.stdout)
    summary = report["summary"]
    failed = [
        f"{check['check_id']} {check['resource']} ({check['file_path']}): {check['check_name']}"
        for check in report["results"]["failed_checks"]
    ]
    assert not failed, "checkov failures:\n" + "\n".join(failed)
    assert summary["failed"] == 0, "checkov failures:\n" + "\n".join(failed)
    assert summary["parsing_errors"] == 0
    assert summary["passed"] > 100, summary
    assert summary["resource_count"] > 50, summary
    # --quiet leaves skipped checks out of the JSON: each source comment must have matched one
    # (a stale skip, whose check no longer fires, fails here too).
    assert summary["skipped"] == len(skips), (summary, skips)
    assert result.returncode == 0
    assert elapsed < CHECKOV_TIMEOUT_S
